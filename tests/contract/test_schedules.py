"""Periodic tasks on every store: a tick becomes one task however many schedulers fire it (at
once, one after the other, after the task has run), on the store's clock; a store failure in
the middle of a pass is retried on the next one and still makes one task."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading

import pytest

import agentlease as al
from agentlease._schedule import SECOND
from tests._outage import Outage
from tests.conftest import Store

Q = "periodic"
HOUR = 3600.0  # an interval whose next tick no test waits for


def tasks(q: al.Queue) -> int:
    return sum(q.stats(Q).counts.values())


def scheduler(store: Store, *schedules: al.Schedule, backend: object = None) -> al.Scheduler:
    queue = store.queue() if backend is None else al.Queue(backend)  # type: ignore[arg-type]
    return al.Scheduler(queue, schedules)


def test_many_schedulers_firing_one_tick_at_once_make_one_task(store: Store) -> None:
    hourly = al.Schedule("hourly", Q, every=HOUR, grace=HOUR, payload={"report": "usage"})
    runners = [scheduler(store, hourly) for _ in range(6)]
    q = store.queue()
    before = q.backend.now()
    barrier = threading.Barrier(len(runners))
    fired: list[list[al.Tick]] = []

    def run(s: al.Scheduler) -> None:
        barrier.wait()
        fired.append(s.run_once())

    threads = [threading.Thread(target=run, args=(s,)) for s in runners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ticks = [tick for batch in fired for tick in batch]
    assert len(ticks) == len(runners)
    assert len({t.task_id for t in ticks}) == 1
    assert len({t.at for t in ticks}) == 1
    assert sum(t.created for t in ticks) == 1
    assert tasks(q) == 1
    task = q.get(ticks[0].task_id)
    assert task.payload == {"report": "usage"}
    assert task.dedup_key == hourly.dedup_key(round(ticks[0].at * SECOND))
    # The tick is the latest one on the store's clock while they ran (which may cross an hour).
    after = q.backend.now()
    assert before - HOUR < ticks[0].at <= after


def test_a_tick_whose_task_ran_is_not_fired_again(store: Store) -> None:
    hourly = al.Schedule("hourly", Q, every=HOUR, grace=HOUR)
    (first,) = scheduler(store, hourly).run_once()
    assert first.created
    q = store.queue()
    (job,) = q.claim(Q, lease_for=30)
    assert job.task_id == first.task_id
    q.complete(job.lease, "done")
    (again,) = scheduler(store, hourly).run_once()  # a new scheduler: it knows nothing
    assert (again.task_id, again.created) == (first.task_id, False)
    assert tasks(q) == 1
    assert q.claim(Q) == []


def test_catching_up_fires_each_tick_of_the_grace_once(store: Store) -> None:
    every_second = al.Schedule("catchup", Q, every=1.0, misfire="all", grace=5.0)
    one = scheduler(store, every_second)
    first = one.run_once()
    assert 5 <= len(first) <= 6  # the whole seconds of the last five
    assert all(t.created for t in first)
    steps = {round((b.at - a.at) * SECOND) for a, b in itertools.pairwise(first)}
    assert steps == {SECOND}
    # A second scheduler finds the same ticks there (and perhaps fires a new one).
    second = scheduler(store, every_second).run_once()
    old = [t for t in second if t.at <= first[-1].at]
    assert old
    assert not any(t.created for t in old)
    assert {t.task_id for t in old} <= {t.task_id for t in first}
    q = store.queue()
    assert tasks(q) == len({t.task_id for t in first + second})
    # The first scheduler does not send what it knows the store has.
    assert all(t.at > first[-1].at for t in one.run_once())


def test_skip_fires_no_tick_that_came_due_before_the_start(store: Store) -> None:
    hourly = al.Schedule("hourly", Q, every=HOUR, misfire="skip", grace=HOUR)
    assert scheduler(store, hourly).run_once() == []
    assert store.queue().queues() == []


def test_schedules_on_several_queues(store: Store) -> None:
    a = al.Schedule("same", "periodic-a", every=HOUR, grace=HOUR)
    b = al.Schedule("same-b", "periodic-b", cron="* * * * *", grace=HOUR)
    ticks = al.Scheduler(store.queue(), [a, b]).run_once()
    assert [(t.queue, t.created) for t in ticks] == [("periodic-a", True), ("periodic-b", True)]
    assert ticks[1].at % 60 == 0


@pytest.mark.parametrize("lose", ["request", "reply"])
def test_a_store_failure_is_logged_and_the_tick_fired_on_the_next_pass(
    store: Store, lose: str, caplog: pytest.LogCaptureFixture
) -> None:
    hourly = al.Schedule("hourly", Q, every=HOUR, grace=HOUR)
    outage = Outage(store.backend(), "enqueue", lose=lose)  # type: ignore[arg-type]
    outage.fail_next(3)
    s = al.Scheduler(al.Queue(outage), [hourly], max_sleep=0.05)  # type: ignore[arg-type]
    q = store.queue()
    with caplog.at_level(logging.INFO, logger="agentlease.scheduler"):
        runner = threading.Thread(target=s.run, kwargs={"handle_signals": False})
        runner.start()
        try:
            for _ in range(400):  # at most 20 s: until a pass succeeds after the failures
                if any("store back" in r.getMessage() for r in caplog.records):
                    break
                threading.Event().wait(0.05)
        finally:
            s.stop()
            runner.join(timeout=30)
    assert not runner.is_alive()
    assert outage.failed == ["enqueue"] * 3
    assert tasks(q) == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any("store failed" in m and "injected outage" in m for m in messages), messages
    assert any("store back" in m for m in messages), messages
    assert messages[-1] == "scheduler stopped"


async def test_the_async_face_fires_once_too(store: Store) -> None:
    hourly = al.Schedule("hourly", Q, every=HOUR, grace=HOUR)
    runners = [al.AsyncScheduler(store.aqueue(), [hourly], max_sleep=0.05) for _ in range(3)]
    runs = [asyncio.create_task(r.run(handle_signals=False)) for r in runners]
    await asyncio.sleep(0.3)
    for r in runners:
        r.stop()
    await asyncio.gather(*runs)
    for r in runners:
        await r.close()
    assert tasks(store.queue()) == 1


def test_a_scheduler_opened_by_url(store: Store) -> None:
    if store.kind == "memory":
        pytest.skip("memory:// opens a store of its own")
    hourly = al.Schedule("hourly", Q, every=HOUR, grace=HOUR)
    with al.Scheduler.connect(store.url, [hourly]) as s:
        (tick,) = s.run_once()
    assert tick.created
    assert store.queue().get(tick.task_id).state == "queued"
