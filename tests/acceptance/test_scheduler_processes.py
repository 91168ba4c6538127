"""Periodic tasks with real processes on real stores: five ``agentlease scheduler`` processes
fire one schedule (a tick a second for 60 s), two of them are SIGKILLed midway, and the store
ends with exactly one task per tick of the window: none twice, none missing.

SQLite by default; AGENTLEASE_DEEP=1 runs it on Redis, Redis Cluster and PostgreSQL too (a
minute each). The memory store, which processes cannot share, is covered with threads in
tests/contract/test_schedules.py.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentlease as al
from tests.acceptance._scheduler_child import QUEUE, SCHEDULES
from tests.acceptance.conftest import KINDS
from tests.acceptance.test_idempotency_processes import Children

# Many real processes, a minute each: the "processes" group runs one test at a time on one
# xdist worker, so they starve neither each other nor the servers' connections.
pytestmark = [pytest.mark.xdist_group("processes"), pytest.mark.slow]

DEEP = os.environ.get("AGENTLEASE_DEEP") == "1"
SCHEDULERS = 5
WINDOW = 60  # ticks, one a second
LEAD = 3.0  # seconds from now to the first tick: the processes start meanwhile (or catch up)
KILL_AT = (20.0, 35.0)  # seconds into the window at which one scheduler each is SIGKILLed
CHILD = "tests/acceptance/_scheduler_child.py:SCHEDULES"


class SchedulerChildren(Children):
    """Children running ``python -m agentlease scheduler``."""

    module = "agentlease"


@pytest.fixture(params=KINDS if DEEP else ["sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store that separate processes share (see tests/acceptance/conftest.py)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    value: str = request.getfixturevalue("served_url_" + request.param.replace("-", "_"))
    return value


@pytest.fixture
def kids(tmp_path: Path) -> Iterator[SchedulerChildren]:
    children = SchedulerChildren(tmp_path)
    try:
        yield children
    finally:
        children.reap()


def test_five_schedulers_two_killed_fire_each_tick_once(
    store_url: str, kids: SchedulerChildren, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = al.Queue.connect(store_url)
    try:
        # The window, on the store's clock, and that clock seen from here.
        store_now = q.backend.now()
        offset = store_now - time.monotonic()
        start = math.ceil(store_now + LEAD)
        end = start + WINDOW
        monkeypatch.setenv("AGENTLEASE_TEST_START", str(start))
        monkeypatch.setenv("AGENTLEASE_TEST_END", str(end))

        def wait_until(store_time: float) -> None:
            while time.monotonic() + offset < store_time:
                kids.check_alive()
                time.sleep(0.1)

        procs = [
            kids.spawn("scheduler", "--backend", store_url, "--max-sleep", "0.5", CHILD)
            for _ in range(SCHEDULERS)
        ]
        for victim, at in zip(procs, KILL_AT, strict=False):
            wait_until(start + at)
            victim.kill()
            kids.finish(victim)
        # Past the window's last tick, until its task is there (the survivors may be late).
        wait_until(end)
        (schedule,) = SCHEDULES
        last = schedule.task_id((end - 1) * 1_000_000)
        deadline = time.monotonic() + 30.0
        while True:
            try:
                q.get(last)
                break
            except al.UnknownTask:
                if time.monotonic() > deadline:
                    pytest.fail(f"the last tick never fired\n{kids.stderr()}")
                kids.check_alive()
                time.sleep(0.2)
        time.sleep(1.5)  # a pass or more past the end: nothing more may come
        survivors = procs[len(KILL_AT) :]
        for p in survivors:
            p.send_signal(signal.SIGTERM)
        for p in survivors:
            assert kids.finish(p) == 0, kids.stderr()
        assert "scheduler stopped" in kids.stderr()

        expected = {schedule.task_id((start + i) * 1_000_000) for i in range(WINDOW)}
        assert len(expected) == WINDOW
        stats = q.stats(QUEUE)
        assert stats.counts == {"queued": WINDOW}, stats
        jobs = q.claim(QUEUE, 2 * WINDOW, lease_for=60)
        ids = [job.task_id for job in jobs]
        assert len(ids) == WINDOW
        assert len(set(ids)) == WINDOW  # none twice
        assert set(ids) == expected  # none missing, none outside the window
        assert all(job.payload == {"what": "beat"} for job in jobs)
    finally:
        q.close()
