"""stats' oldest queued age follows the tasks that are queued now, on every backend: a claimed
task stops counting, a task back from a lease (released, reaped) counts from its creation again,
and priorities do not hide an old low-priority task."""

from __future__ import annotations

import time

import agentlease as al
from tests.conftest import Store

Q = "ages"
GAP = 0.4  # between the creation of two tasks
LIVE = 30.0


def oldest(q: al.Queue) -> float:
    age = q.stats(Q).oldest_queued_age
    assert age is not None
    return age


def test_the_oldest_queued_task_is_the_oldest_not_the_next(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, "low, old", priority=0)
    time.sleep(GAP)
    q.enqueue(Q, "high, new", priority=5)
    (job,) = q.claim(Q, lease_for=LIVE)
    assert job.payload == "high, new"
    assert oldest(q) >= GAP  # the old low-priority task, still queued


def test_a_claimed_task_stops_counting_and_a_released_one_counts_again(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, "old")
    time.sleep(GAP)
    q.enqueue(Q, "new")
    (job,) = q.claim(Q, lease_for=LIVE)
    assert job.payload == "old"
    assert oldest(q) < GAP  # only the new task is queued
    q.release(job.lease, front=False)
    assert oldest(q) >= GAP  # the old task is queued again, with its creation time
    (first,) = q.claim(Q, lease_for=LIVE)
    (second,) = q.claim(Q, lease_for=LIVE)
    assert (first.payload, second.payload) == ("new", "old")
    assert q.stats(Q).oldest_queued_age is None
    assert q.stats(Q).counts.get("leased") == 2


def test_a_reaped_task_counts_again(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, "old")
    (job,) = q.claim(Q, lease_for=0.2)
    time.sleep(GAP)
    q.enqueue(Q, "new")
    assert oldest(q) < GAP
    assert [r.task_id for r in q.reap(Q)] == [job.task_id]
    assert oldest(q) >= GAP
    assert q.stats(Q).counts.get("leased") is None
