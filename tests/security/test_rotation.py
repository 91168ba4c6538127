"""Rotating a password without losing a lease, as the README says: on a private Redis whose
worker user has exactly the rights ``agentlease rights`` prints, a worker on the old password
holds leases while the new password is added, a worker on the new one starts, the old one is
stopped with SIGTERM (it finishes its running jobs and gives the rest back) and the old password
is removed. Every task is done once, on its first attempt: no lease was lost or reaped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

import agentlease as al
from agentlease._rights import RedisRule, rights
from tests._private_redis import PrivateRedis

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


def test_a_password_rotated_under_running_workers_loses_no_lease(
    private_redis: object,
) -> None:
    server: PrivateRedis = private_redis()  # type: ignore[operator]
    base = f"127.0.0.1:{server.port}/0?prefix=rot"
    old, new = (
        f"redis://agentlease_worker:old-pw@{base}",
        f"redis://agentlease_worker:new-pw@{base}",
    )
    rule = rights(old)
    assert isinstance(rule, RedisRule)
    admin = redis.Redis(port=server.port)
    first: subprocess.Popen[str] | None = None
    second: subprocess.Popen[str] | None = None
    try:
        admin.execute_command("ACL", "SETUSER", rule.user, *rule.rules("old-pw"))
        with al.Queue.connect(old) as queue:
            ids = [e.task_id for e in queue.enqueue_many("rot", list(range(8)))]
            first = _worker(old)
            deadline = time.monotonic() + 30
            while not queue.inspect("rot"):  # the old worker holds leases
                assert time.monotonic() < deadline, "the first worker claimed nothing"
                assert first.poll() is None, first.communicate()[0]
                time.sleep(0.05)
            # 1. Both passwords; 2. a worker on the new one, the old one stopped gracefully.
            admin.execute_command("ACL", "SETUSER", rule.user, ">new-pw")
            second = _worker(new, "--burst")
            first.send_signal(signal.SIGTERM)
            out_first, _ = first.communicate(timeout=30)
            assert first.returncode == 0, out_first
            # 3. The old password goes; the new worker drains the queue on its own.
            admin.execute_command("ACL", "SETUSER", rule.user, "<old-pw")
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
        admin.close()
    assert [t.state for t in tasks] == ["done"] * len(ids)
    assert [t.reclaims for t in tasks] == [0] * len(ids)  # no lease ran out or was reaped
    assert [t.attempt for t in tasks] == [1] * len(ids)  # each ran once
    pids = {t.result["pid"] for t in tasks}  # type: ignore[index]
    assert len(pids) == 2, "both workers should have completed tasks"
