"""A store written by a newer agentlease is refused with SchemaTooNew, naming both versions, on
both faces and before anything is written; a store without a version of its own keeps working.

SQLite keeps its version in ``PRAGMA user_version``, PostgreSQL in ``agentlease_migrations``,
Redis in ``<prefix>:layout``. Each test writes a newer version by hand, as an upgraded process
would have.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from redis.cluster import RedisCluster

import agentlease as al
from agentlease import BackendRefused, BackendUnavailable, SchemaTooNew
from agentlease.backends._async.redis_layout import LAYOUT
from agentlease.backends._postgres_driver import MIGRATIONS
from agentlease.backends.sqlite import SCHEMA_VERSION
from tests import _services


def _refused_on_both_faces(url: str, store_version: int, known_version: int) -> None:
    """A fresh client of each face refuses ``url`` at its first call (or opening)."""

    def sync() -> None:
        backend = al.connect(url)
        try:
            backend.enqueue([])  # nothing to write: only opening and the version check
            backend.stats("jobs")
        finally:
            backend.close()

    async def use() -> None:
        backend = al.connect_async(url)
        try:
            await backend.stats("jobs")
        finally:
            await backend.close()

    for face, call in (("sync", sync), ("async", lambda: asyncio.run(use()))):
        with pytest.raises(SchemaTooNew) as info:
            call()
        exc = info.value
        assert isinstance(exc, BackendRefused), face
        assert not isinstance(exc, BackendUnavailable), face
        assert (exc.store_version, exc.known_version) == (store_version, known_version), face
        assert f"version {store_version}" in str(exc)
        assert f"version {known_version}" in str(exc)


# -- SQLite -------------------------------------------------------------------------------------


def _sqlite_snapshot(path: Path) -> tuple[Any, ...]:
    with sqlite3.connect(path) as db:
        mode = db.execute("PRAGMA journal_mode").fetchone()
        version = db.execute("PRAGMA user_version").fetchone()
        return mode, version, tuple(db.iterdump())


def test_sqlite_newer_schema_version_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    url = f"sqlite:///{path}"
    with al.Queue.connect(url) as q:
        q.enqueue("jobs", {"n": 1}, id="old")
    newer = SCHEMA_VERSION + 1
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=DELETE")  # a refused client must not switch it to WAL
        db.execute(f"PRAGMA user_version={newer}")
    before = _sqlite_snapshot(path)
    _refused_on_both_faces(url, newer, SCHEMA_VERSION)
    assert _sqlite_snapshot(path) == before
    with sqlite3.connect(path) as db:  # written back to this version, it opens again
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    with al.Queue.connect(url) as q:
        assert q.get("old").payload == {"n": 1}


# -- PostgreSQL ---------------------------------------------------------------------------------


def _pg_snapshot(schema: str) -> tuple[Any, ...]:
    with psycopg.connect(_services.POSTGRES_URL) as conn:
        migrations = conn.execute(
            f"SELECT version, name FROM {schema}.agentlease_migrations ORDER BY version".encode()
        ).fetchall()
        tasks = conn.execute(
            f"SELECT id, state, attempt FROM {schema}.agentlease_tasks ORDER BY id".encode()
        ).fetchall()
    return tuple(migrations), tuple(tasks)


def test_postgres_unknown_newer_migration_is_refused(served_url_postgres: str) -> None:
    url = served_url_postgres
    schema = url.rsplit("schema=", 1)[1]
    with al.Queue.connect(url) as q:
        q.enqueue("jobs", {"n": 1}, id="old")
    newest = MIGRATIONS[-1].version
    with psycopg.connect(_services.POSTGRES_URL, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {schema}.agentlease_migrations (version, name) "
            f"VALUES ({newest + 1}, 'from_the_future')".encode()
        )
    before = _pg_snapshot(schema)
    _refused_on_both_faces(url, newest + 1, newest)
    _refused_on_both_faces(url + "&migrate=false", newest + 1, newest)
    assert _pg_snapshot(schema) == before


# -- Redis (and Redis Cluster) ------------------------------------------------------------------


@pytest.fixture(params=["redis", "redis-cluster"])
def redis_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("served_url_" + request.param.replace("-", "_"))
    return url


@pytest.fixture
def raw(redis_url: str) -> Iterator[Any]:
    """A plain redis-py client of the same server (or cluster)."""
    base = redis_url.split("?", 1)[0]
    client: Any = (
        RedisCluster.from_url(base) if "cluster=1" in redis_url else redis.Redis.from_url(base)
    )
    yield client
    client.close()


def _redis_snapshot(raw: Any, prefix: str) -> dict[bytes, bytes]:
    keys: set[bytes] = set()
    for pattern in (f"{{{prefix}:*", f"{prefix}:*"):
        if isinstance(raw, RedisCluster):
            keys |= set(raw.scan_iter(match=pattern, count=1000, target_nodes="all"))
        else:
            keys |= set(raw.scan_iter(match=pattern, count=1000))
    return {key: raw.dump(key) for key in sorted(keys)}


def _prefix(url: str) -> str:
    return url.rsplit("prefix=", 1)[1].split("&", 1)[0]


def test_redis_newer_layout_is_refused(redis_url: str, raw: Any) -> None:
    prefix = _prefix(redis_url)
    with al.Queue.connect(redis_url) as q:
        q.enqueue("jobs", {"n": 1}, id="old")
    assert raw.get(f"{prefix}:layout") == str(LAYOUT).encode()  # written on first use
    raw.set(f"{prefix}:layout", LAYOUT + 1)
    before = _redis_snapshot(raw, prefix)
    _refused_on_both_faces(redis_url, LAYOUT + 1, LAYOUT)
    assert _redis_snapshot(raw, prefix) == before


def test_redis_store_without_a_layout_key_keeps_working(redis_url: str, raw: Any) -> None:
    """Data written before the key existed follows layout 1: the key is added, nothing else."""
    prefix = _prefix(redis_url)
    with al.Queue.connect(redis_url) as q:
        q.enqueue("jobs", {"n": 1}, id="old")
    raw.delete(f"{prefix}:layout")  # as an agentlease without the key left it

    async def use() -> None:
        async with al.AsyncQueue.connect(redis_url) as q:
            assert (await q.get("old")).payload == {"n": 1}

    asyncio.run(use())
    assert raw.get(f"{prefix}:layout") == str(LAYOUT).encode()
    raw.delete(f"{prefix}:layout")
    with al.Queue.connect(redis_url) as q:
        [job] = q.claim("jobs")
        q.complete(job.lease, "done")
    assert raw.get(f"{prefix}:layout") == str(LAYOUT).encode()


def test_redis_layout_is_checked_once_per_client(redis_url: str, raw: Any) -> None:
    """The check costs one read at a client's first call, none after (so a client already
    running when a newer layout appears is not stopped by it; a new one is)."""
    prefix = _prefix(redis_url)
    with al.Queue.connect(redis_url) as q:
        q.enqueue("jobs", 1, id="a")
        raw.set(f"{prefix}:layout", LAYOUT + 1)
        assert q.stats("jobs").counts == {"queued": 1}
    with pytest.raises(SchemaTooNew), al.Queue.connect(redis_url) as fresh:
        fresh.stats("jobs")


def test_redis_prefix_used_by_something_else_is_refused(redis_url: str, raw: Any) -> None:
    prefix = _prefix(redis_url)
    raw.set(f"{prefix}:layout", "not a number")
    backend = al.connect(redis_url)
    try:
        with pytest.raises(BackendRefused, match="not a layout version") as info:
            backend.stats("jobs")
    finally:
        backend.close()
    assert not isinstance(info.value, SchemaTooNew)


def test_redis_layout_1_done_tasks_are_indexed_and_purged(redis_url: str, raw: Any) -> None:
    """A store of layout 1 (done tasks in no index): a layout-2 client moves the number to 2,
    and its purges of done tasks index the old ones in bounded steps, then purge them."""
    prefix = _prefix(redis_url)
    with al.Queue.connect(redis_url) as q:
        q.enqueue_many("old", list(range(7)))
        for job in q.claim("old", 7, lease_for=30):
            q.complete(job.lease, None)
    # As layout 1 left it: no ZSET of done tasks, no mark of its backfill, number 1.
    raw.delete(f"{{{prefix}:old}}:f")
    raw.hdel(f"{{{prefix}:old}}:n", "fidx")
    raw.set(f"{prefix}:layout", 1)
    with al.Queue.connect(redis_url) as q:
        purged, rounds = 0, 0
        while q.stats("old").counts.get("done"):
            purged += q.purge("old", older_than=0, limit=2)  # indexes up to 2 records a call
            rounds += 1
            assert rounds < 50
        assert purged == 7
        assert raw.get(f"{prefix}:layout") == str(LAYOUT).encode()
        assert raw.hget(f"{{{prefix}:old}}:n", "fidx") == b"1"
        q.enqueue("old", "new")
        (job,) = q.claim("old", lease_for=30)
        q.complete(job.lease, None)
        assert q.purge("old", older_than=0) == 1  # indexed as it finished
