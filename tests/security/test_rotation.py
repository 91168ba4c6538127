"""Rotating a password without losing a lease, as the README says.

Redis: on a private server whose worker user has exactly the rights ``agentlease rights``
prints, a worker on the old password holds leases while the new password is added, a worker on
the new one starts, the old one is stopped with SIGTERM (it finishes its running jobs and gives
the rest back) and the old password is removed. PostgreSQL (one password per role): two login
roles, members of one ``NOLOGIN`` role holding the printed grants; the old role is switched to
``NOLOGIN`` after its worker stopped. Either way every task is done once, on its first attempt:
no lease was lost or reaped, and the old credentials are refused afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import redis
from click.testing import CliRunner

import agentlease as al
from agentlease._rights import PostgresGrants, RedisRule, rights
from agentlease.cli import cli
from tests import _private_postgres
from tests._private_redis import PrivateRedis
from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parents[2]
HANDLER = "tests.security._secret_handler:slow"


def _worker(url: str, *extra: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "AGENTLEASE_URL": url,
        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
        "PYTHONUNBUFFERED": "1",
    }
    argv = [sys.executable, "-m", "agentlease", "worker", HANDLER, "-q", "rot", "-c", "2"]
    argv += ["--lease-for", "5", "--prefetch", "0", "--poll-interval", "0.1", *extra]
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _rotate(
    old: str, new: str, add_new: Callable[[], object], drop_old: Callable[[], object]
) -> None:
    """Run the README's three steps under workers, and check that no lease was lost."""
    first: subprocess.Popen[str] | None = None
    second: subprocess.Popen[str] | None = None
    try:
        with al.Queue.connect(old) as queue:
            ids = [e.task_id for e in queue.enqueue_many("rot", list(range(8)))]
            first = _worker(old)
            deadline = time.monotonic() + 30
            while not queue.inspect("rot"):  # the old worker holds leases
                assert time.monotonic() < deadline, "the first worker claimed nothing"
                assert first.poll() is None, first.communicate()[0]
                time.sleep(0.05)
            # 1. Both passwords; 2. a worker on the new one, the old one stopped gracefully.
            add_new()
            second = _worker(new, "--burst")
            first.send_signal(signal.SIGTERM)
            out_first, _ = first.communicate(timeout=30)
            assert first.returncode == 0, out_first
            # 3. The old password goes; the new worker drains the queue on its own.
            drop_old()
            out_second, _ = second.communicate(timeout=60)
            assert second.returncode == 0, out_second
            with pytest.raises(al.AuthenticationFailed), al.Queue.connect(old) as stale:
                stale.stats("rot")
        with al.Queue.connect(new) as queue:
            tasks = [queue.get(task_id) for task_id in ids]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert [t.state for t in tasks] == ["done"] * len(ids)
    assert [t.reclaims for t in tasks] == [0] * len(ids)  # no lease ran out or was reaped
    assert [t.attempt for t in tasks] == [1] * len(ids)  # each ran once
    pids = {t.result["pid"] for t in tasks}  # type: ignore[index]
    assert len(pids) == 2, "both workers should have completed tasks"


def test_a_redis_password_rotated_under_running_workers_loses_no_lease(
    private_redis: Callable[..., PrivateRedis],
) -> None:
    server = private_redis()
    base = f"127.0.0.1:{server.port}/0?prefix=rot"
    old, new = (
        f"redis://agentlease_worker:old-pw@{base}",
        f"redis://agentlease_worker:new-pw@{base}",
    )
    rule = rights(old)
    assert isinstance(rule, RedisRule)
    admin = redis.Redis(port=server.port)
    try:
        admin.execute_command("ACL", "SETUSER", rule.user, *rule.rules("old-pw"))
        _rotate(
            old,
            new,
            lambda: admin.execute_command("ACL", "SETUSER", rule.user, ">new-pw"),
            lambda: admin.execute_command("ACL", "SETUSER", rule.user, "<old-pw"),
        )
    finally:
        admin.close()


def test_a_postgres_role_rotated_under_running_workers_loses_no_lease() -> None:
    try:
        server = _private_postgres.start()
    except _private_postgres.CannotStart as exc:
        unavailable("private postgresql", str(exc))
    try:
        group = server.url(user="rot_workers", schema="rot")
        grants = rights(group)
        assert isinstance(grants, PostgresGrants)
        server.sql(f"CREATE ROLE {grants.owner} LOGIN")
        server.sql("CREATE ROLE rot_workers NOLOGIN")
        server.sql("CREATE ROLE blue LOGIN IN ROLE rot_workers")
        server.sql("CREATE ROLE green NOLOGIN IN ROLE rot_workers")
        for statement in grants.admin():
            server.sql(statement)
        migrated = CliRunner().invoke(cli, ["migrate", "--backend", grants.owner_url])
        assert migrated.exit_code == 0, migrated.output
        with psycopg.connect(server.url(user=grants.owner), autocommit=True) as conn:
            for statement in grants.worker_grants():
                conn.execute(statement.encode())
        _rotate(
            server.url(user="blue", schema="rot"),
            server.url(user="green", schema="rot"),
            lambda: server.sql("ALTER ROLE green LOGIN"),
            lambda: server.sql("ALTER ROLE blue NOLOGIN"),
        )
    finally:
        server.stop()
