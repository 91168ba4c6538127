"""Schedules as pure arithmetic: which ticks a pass fires (misfire policy, grace, window), the
next tick, the identity of a tick's task, and the refusals at construction (typed, before any
store is touched)."""

from __future__ import annotations

import logging
import subprocess
import sys
from datetime import UTC, datetime

import pytest

import agentlease as al
from agentlease._schedule import MAX_CATCHUP, SECOND, tick_label

# 2026-12-02 00:55:00 UTC, and a moment 12.25 s later.
T0 = int(datetime(2026, 12, 2, 0, 55, tzinfo=UTC).timestamp()) * SECOND
NOW = T0 + 12_250_000


def us(seconds: float) -> int:
    return round(seconds * SECOND)


def due(s: al.Schedule, now: int = NOW, fired: int | None = None, started: int = 0) -> list[int]:
    return s.due(now, fired_through=fired, started_us=started)


# -- intervals ----------------------------------------------------------------------------------


def test_interval_ticks_are_multiples_of_every_since_the_epoch() -> None:
    s = al.Schedule("beat", "jobs", every=5)
    assert due(s) == [T0 + us(10)]  # latest: the most recent tick only
    assert s.next_after(NOW) == T0 + us(15)
    assert s.next_after(T0 + us(15)) == T0 + us(20)  # strictly after
    assert due(s, now=T0 + us(15)) == [T0 + us(15)]  # a tick is due at its own instant


def test_fractional_intervals_are_exact_microseconds() -> None:
    s = al.Schedule("fast", "jobs", every=0.3, misfire="all", grace=1.0)
    assert due(s) == [NOW - us(0.85), NOW - us(0.55), NOW - us(0.25)]
    assert all(t % us(0.3) == 0 for t in due(s))


def test_latest_fires_the_most_recent_tick_once_and_never_one_older_than_grace() -> None:
    s = al.Schedule("beat", "jobs", every=5, grace=3)
    assert due(s) == [T0 + us(10)]  # 2.25 s late: within grace
    assert due(s, fired=T0 + us(10)) == []  # fired already (by this scheduler)
    assert due(s, now=T0 + us(14)) == []  # 4 s late: past grace, and no newer tick yet
    assert due(s, now=T0 + us(15)) == [T0 + us(15)]


def test_all_fires_every_tick_within_grace_oldest_first_and_only_new_ones() -> None:
    s = al.Schedule("beat", "jobs", every=1, misfire="all", grace=4)
    assert due(s) == [T0 + us(9), T0 + us(10), T0 + us(11), T0 + us(12)]
    assert due(s, fired=T0 + us(10)) == [T0 + us(11), T0 + us(12)]
    assert due(s, fired=T0 + us(12)) == []


def test_all_fires_at_most_max_catchup_ticks_per_pass_the_most_recent() -> None:
    s = al.Schedule("beat", "jobs", every=1, misfire="all", grace=10 * MAX_CATCHUP)
    ticks = due(s)
    assert len(ticks) == MAX_CATCHUP
    assert ticks[-1] == T0 + us(12)
    assert ticks == sorted(ticks)


def test_skip_fires_nothing_that_came_due_before_the_scheduler_started() -> None:
    s = al.Schedule("beat", "jobs", every=5, misfire="skip")
    assert due(s, started=NOW) == []  # 00:55:10 came due before the start
    assert due(s, now=T0 + us(15.5), started=NOW) == [T0 + us(15)]
    # A tick that came due while the store was down is still fired afterwards, within grace.
    assert due(s, now=T0 + us(19), started=T0 + us(1)) == [T0 + us(15)]


def test_start_and_end_bound_the_ticks() -> None:
    start, end = (T0 + us(3)) / SECOND, (T0 + us(8)) / SECOND
    s = al.Schedule("w", "jobs", every=1, misfire="all", grace=60, start=start, end=end)
    assert due(s) == [T0 + us(t) for t in range(3, 8)]  # 3..7: the end is excluded
    assert s.next_after(T0) == T0 + us(3)
    assert s.next_after(T0 + us(6)) == T0 + us(7)
    assert s.next_after(T0 + us(7)) is None  # ended


# -- cron ---------------------------------------------------------------------------------------


def test_cron_ticks() -> None:
    s = al.Schedule("five", "jobs", cron="*/5 * * * *", misfire="all", grace=900)
    assert due(s) == [T0 - us(600), T0 - us(300), T0]
    assert al.Schedule("five", "jobs", cron="*/5 * * * *").due(
        NOW, fired_through=None, started_us=0
    ) == [T0]
    assert s.next_after(NOW) == T0 + us(300)
    assert s.next_after(T0) == T0 + us(300)
    assert s.next_after(T0 - 1) == T0


def test_cron_in_a_time_zone() -> None:
    # 02:00 in Paris is 01:00 UTC in winter.
    s = al.Schedule("nightly", "jobs", cron="0 2 * * *", timezone="Europe/Paris")
    assert tick_label(s.next_after(NOW) or 0) == "2026-12-02T01:00:00Z"
    utc = al.Schedule("nightly", "jobs", cron="0 2 * * *")
    assert tick_label(utc.next_after(NOW) or 0) == "2026-12-02T02:00:00Z"


# -- identity -----------------------------------------------------------------------------------


def test_a_tick_names_its_task_the_same_in_every_process() -> None:
    s = al.Schedule("beat", "jobs", every=5)
    assert s.dedup_key(T0) == "schedule:beat:2026-12-02T00:55:00Z"
    assert s.task_id(T0) == "schedule:jobs:beat:2026-12-02T00:55:00Z"
    assert s.task_id(T0 + 250_000) == "schedule:jobs:beat:2026-12-02T00:55:00.250000Z"
    # Same name on another queue: another task.
    assert al.Schedule("beat", "other", every=5).task_id(T0) != s.task_id(T0)
    long = al.Schedule("n" * 64, "q" * 128, every=5)
    assert long.task_id(T0).startswith("schedule:")
    assert len(long.task_id(T0)) <= 200
    assert long.task_id(T0) == al.Schedule("n" * 64, "q" * 128, every=7).task_id(T0)


# -- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"cron": "*/5 * * *"}, al.InvalidSchedule),  # four fields
        ({"cron": "61 * * * *"}, al.InvalidSchedule),
        ({"cron": "* * 31 2 *"}, al.InvalidSchedule),  # never matches
        ({"cron": "* * * * * *"}, al.InvalidSchedule),  # six fields
        ({"cron": 5}, al.InvalidSchedule),
        ({}, al.InvalidSchedule),  # neither
        ({"cron": "* * * * *", "every": 5}, al.InvalidSchedule),  # both
        ({"every": 0}, al.InvalidDuration),
        ({"every": -1}, al.InvalidDuration),
        ({"every": float("nan")}, al.InvalidDuration),
        ({"every": 0.0001}, al.InvalidDuration),
        ({"every": "5"}, al.InvalidDuration),
        ({"every": 5, "grace": 0}, al.InvalidDuration),
        ({"every": 5, "misfire": "sometimes"}, al.InvalidSchedule),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, al.InvalidSchedule),
        ({"every": 5, "start": 10.0, "end": 10.0}, al.InvalidSchedule),
        ({"every": 5, "start": float("inf")}, al.InvalidSchedule),
        ({"every": 5, "payload": {1, 2}}, al.NotJSON),
        ({"every": 5, "payload": {"x": float("nan")}}, al.NotJSON),
        ({"every": 5, "payload": object()}, al.NotJSON),
    ],
)
def test_bad_input_is_refused_with_a_typed_error(kwargs: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        al.Schedule("s", "jobs", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "a:b", "-a", "a b", "x" * 65, 5])
def test_bad_schedule_names_are_refused(name: object) -> None:
    with pytest.raises(al.InvalidName):
        al.Schedule(name, "jobs", every=5)  # type: ignore[arg-type]


@pytest.mark.parametrize("queue", ["", "a b", "{tag}", "-q", 7])
def test_bad_queue_names_are_refused(queue: object) -> None:
    with pytest.raises(al.InvalidName):
        al.Schedule("s", queue, every=5)  # type: ignore[arg-type]


def test_a_scheduler_refuses_duplicate_names_and_oversized_payloads_before_any_write() -> None:
    q = al.Queue(al.MemoryBackend(), settings=al.QueueSettings(max_payload_bytes=64))
    with pytest.raises(al.InvalidSchedule, match="two schedules"):
        al.Scheduler(q, [al.Schedule("a", "x", every=1), al.Schedule("a", "y", every=2)])
    with pytest.raises(al.PayloadTooLarge):
        al.Scheduler(q, [al.Schedule("a", "x", every=1, payload="z" * 100)])
    with pytest.raises(al.InvalidSchedule, match="not a Schedule"):
        al.Scheduler(q, ["a"])  # type: ignore[list-item]
    for bad in (0, -1, float("nan"), 3601, "1"):
        with pytest.raises(al.InvalidDuration):
            al.Scheduler(q, [], max_sleep=bad)  # type: ignore[arg-type]
    assert q.queues() == []


# -- the cron extra is imported lazily -------------------------------------------------------------


def _modules(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    return out.stdout.strip()


def test_interval_schedules_do_not_import_the_cron_parser() -> None:
    code = (
        "import sys, agentlease as al\n"
        "al.Schedule('a', 'q', every=1)\n"
        "al.Scheduler(al.Queue(al.MemoryBackend()), [])\n"
        "print('cronsim' in sys.modules)\n"
        "al.Schedule('b', 'q', cron='* * * * *')\n"
        "print('cronsim' in sys.modules)"
    )
    assert _modules(code).split() == ["False", "True"]


def test_a_cron_schedule_without_the_extra_names_it() -> None:
    code = (
        "import sys, agentlease as al\n"
        "sys.modules['cronsim'] = None  # as if not installed\n"
        "al.Schedule('a', 'q', every=1)\n"
        "try:\n"
        "    al.Schedule('b', 'q', cron='* * * * *')\n"
        "except al.MissingDriver as exc:\n"
        "    print(exc)\n"
    )
    assert "pip install 'agentlease[cron]'" in _modules(code)


# -- a scheduler on a store whose clock the test moves ---------------------------------------


class Clock:
    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


@pytest.mark.parametrize(
    ("misfire", "after_gap"),
    [("all", [40, 50, 60, 70, 80, 90]), ("latest", [90]), ("skip", [90])],
)
def test_a_gap_longer_than_grace_fires_per_policy_and_logs_what_was_missed(
    misfire: str, after_gap: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    t0 = T0 / SECOND
    clock = Clock(t0 + 1)
    q = al.Queue(al.MemoryBackend(clock=clock))
    every_ten = al.Schedule("ten", "jobs", every=10, misfire=misfire, grace=60)  # type: ignore[arg-type]
    s = al.Scheduler(q, [every_ten])
    first = s.run_once()
    # At the start: "all" catches up the grace, "latest" fires the latest tick, "skip" none.
    assert [t.at - t0 for t in first] == {
        "all": [-50, -40, -30, -20, -10, 0],
        "latest": [0],
        "skip": [],
    }[misfire]
    clock.at = t0 + 11
    assert [t.at - t0 for t in s.run_once()] == [10]
    clock.at = t0 + 95  # the scheduler (or the store) was away for 84 s
    with caplog.at_level(logging.WARNING, logger="agentlease.scheduler"):
        fired = s.run_once()
    assert [t.at - t0 for t in fired] == after_gap
    assert all(t.created for t in fired)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "ticks from 2026-12-02T00:55:20Z to before" in warning
    assert s.run_once() == []  # nothing twice
    assert sum(q.stats("jobs").counts.values()) == len(first) + 1 + len(after_gap)
