"""A worker's heartbeat backend bounds every call by ``call_timeout``: a call that would hang (a
SQLite writer holding the lock, a PostgreSQL row lock, a paused Redis) fails in time instead of
outliving the lease, and the backend works again once the store does."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import agentlease as al
from tests._private_redis import PrivateRedis

BOUND = 1.0


def _bounded_extend(url: str, hold: Callable[[], None], release: Callable[[], None]) -> None:
    """Claim a task, make the store hang the next extend, and check that the bounded heartbeat
    backend gives up within its bound (with a typed error) and works again afterwards."""

    async def main() -> None:
        queue = al.AsyncQueue.connect(url)
        try:
            await queue.enqueue("q", None, id="t")
            (job,) = await queue.claim("q", lease_for=30)
            heartbeat = queue.backend.open_sync(call_timeout=BOUND)
            try:
                hold()
                started = time.monotonic()
                with pytest.raises(al.BackendError):
                    heartbeat.extend([job.lease], 30)
                assert time.monotonic() - started < BOUND + 3.0
                release()
                (renewed,) = heartbeat.extend([job.lease], 30)
                assert renewed is not None
                assert renewed.token == job.lease.token
            finally:
                heartbeat.close()
        finally:
            await queue.close()

    asyncio.run(main())


def test_sqlite_heartbeat_calls_wait_for_the_lock_no_longer_than_the_bound(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tasks.db"
    locker: list[sqlite3.Connection] = []

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        locker.append(conn)

    def release() -> None:
        locker[0].execute("ROLLBACK")
        locker[0].close()

    _bounded_extend(f"sqlite:///{path}?timeout=30", hold, release)


def test_postgres_heartbeat_statements_are_bounded(served_url_postgres: str) -> None:
    import psycopg

    from tests import _services

    schema = served_url_postgres.rsplit("schema=", 1)[1]
    locker: list[psycopg.Connection[object]] = []

    def hold() -> None:
        conn: psycopg.Connection[object] = psycopg.connect(_services.POSTGRES_URL)
        conn.execute(f'SELECT 1 FROM "{schema}".agentlease_tasks FOR UPDATE')
        locker.append(conn)

    def release() -> None:
        locker[0].rollback()
        locker[0].close()

    _bounded_extend(served_url_postgres, hold, release)


def test_redis_heartbeat_replies_are_awaited_no_longer_than_the_bound(
    private_redis: Callable[..., PrivateRedis],
) -> None:
    import redis

    server = private_redis()
    admin = redis.Redis(port=server.port)

    def hold() -> None:
        admin.execute_command("CLIENT", "PAUSE", int((BOUND + 1.5) * 1000), "ALL")

    def release() -> None:
        admin.execute_command("CLIENT", "UNPAUSE")

    try:
        _bounded_extend(server.url + "?socket_timeout=30", hold, release)
    finally:
        admin.close()
