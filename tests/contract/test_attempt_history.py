"""Each task's attempt history on every backend of the ``store`` fixture: the claim that starts
an attempt and the complete, fail, release or reap that ends it record it in the same atomic
step (number, worker, times on the store's clock, outcome, error type); the last 20 are kept."""

from __future__ import annotations

import itertools
import time

from agentlease import TaskTimeout
from agentlease._records import ATTEMPTS_KEPT
from tests.conftest import Store

Q = "hist"
LIVE = 30.0
SHORT = 0.3
PAST = 0.5


def test_every_ending_is_recorded_with_its_worker(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {"x": 1}, id="t")
    assert q.get("t").attempts == ()

    (j1,) = q.claim(Q, lease_for=LIVE, holder="w-a")
    running = q.get("t").attempts
    assert len(running) == 1
    assert (running[0].attempt, running[0].worker, running[0].ended) == (1, "w-a", None)
    assert running[0].outcome is None
    q.fail(j1.lease, ValueError("boom"), retry_in=0.0)

    (j2,) = q.claim(Q, lease_for=LIVE, holder="w-b")
    q.release(j2.lease)

    (j3,) = q.claim(Q, lease_for=SHORT, holder="w-c")
    time.sleep(PAST)
    assert [r.task_id for r in q.reap(Q)] == ["t"]

    (j4,) = q.claim(Q, lease_for=LIVE, holder="w-d")
    q.fail(j4.lease, TaskTimeout("t", 1.0), retry_in=0.0)

    (j5,) = q.claim(Q, lease_for=LIVE)  # a claim that names no worker
    q.complete(j5.lease, {"ok": True})

    attempts = q.get("t").attempts
    rows = [(a.attempt, a.worker, a.outcome, a.error) for a in attempts]
    assert rows == [
        (1, "w-a", "failed", "ValueError"),
        (2, "w-b", "released", None),
        (3, "w-c", "expired", None),
        (4, "w-d", "timed_out", "TaskTimeout"),
        (5, None, "done", None),
    ]
    for a in attempts:
        assert a.ended is not None
        assert a.started <= a.ended
    for earlier, later in itertools.pairwise(attempts):
        assert earlier.ended is not None
        assert earlier.ended <= later.started
    assert [a.attempt for a in attempts] == [j.attempt for j in (j1, j2, j3, j4, j5)]
    assert attempts[-1].to_dict()["outcome"] == "done"


def test_a_reap_inside_claim_and_a_dead_letter_are_recorded(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, None, id="d")
    (first,) = q.claim(Q, lease_for=SHORT, holder="dies")
    time.sleep(PAST)
    (second,) = q.claim(Q, lease_for=LIVE, holder="lives")  # reaps the first lease on the way
    assert second.attempt == first.attempt + 1
    q.fail(second.lease, KeyError("k"), retry_in=None)  # dead-lettered
    task = q.get("d")
    assert task.state == "dead"
    assert [(a.worker, a.outcome, a.error) for a in task.attempts] == [
        ("dies", "expired", None),
        ("lives", "failed", "KeyError"),
    ]


def test_complete_many_and_complete_and_claim_record_their_attempts(store: Store) -> None:
    q = store.queue()
    q.enqueue_many(Q, [{"id": i} for i in range(4)])
    jobs = q.claim(Q, 2, lease_for=LIVE, holder="batch")
    q.complete_many([(j.lease, None) for j in jobs])
    for j in jobs:
        ((attempt),) = q.get(j.task_id).attempts
        assert (attempt.worker, attempt.outcome) == ("batch", "done")
    more = q.claim(Q, 2, lease_for=LIVE, holder="next")
    outcomes, claimed = q.complete_encoded_and_claim(
        [(j.lease, None) for j in more], Q, 2, holder="next"
    )
    assert outcomes == [None, None]
    assert claimed == []
    for j in more:
        ((attempt),) = q.get(j.task_id).attempts
        assert (attempt.worker, attempt.outcome) == ("next", "done")


def test_only_the_last_attempts_are_kept(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, None, id="many")
    total = ATTEMPTS_KEPT + 3
    for n in range(total):
        (job,) = q.claim(Q, lease_for=LIVE, holder=f"w{n}")
        q.release(job.lease)
    attempts = q.get("many").attempts
    assert len(attempts) == ATTEMPTS_KEPT
    assert [a.attempt for a in attempts] == list(range(4, total + 1))
    assert {a.outcome for a in attempts} == {"released"}
    assert attempts[-1].worker == f"w{total - 1}"


async def test_async_face_records_attempts(store: Store) -> None:
    q = store.aqueue()
    try:
        await q.enqueue(Q, None, id="a")
        (job,) = await q.claim(Q, lease_for=LIVE, holder="async-w")
        await q.fail(job.lease, RuntimeError("x"), retry_in=0.0)
        (job,) = await q.claim(Q, lease_for=LIVE, holder="async-w2")
        await q.complete(job.lease, 1)
        attempts = (await q.get("a")).attempts
        assert [(a.worker, a.outcome) for a in attempts] == [
            ("async-w", "failed"),
            ("async-w2", "done"),
        ]
    finally:
        await q.close()


def test_a_cancelled_lease_ends_its_attempt_cancelled_at_the_heartbeat_or_the_reaper(
    store: Store,
) -> None:
    q = store.queue()
    q.enqueue(Q, {}, id="told")
    (told,) = q.claim(Q, lease_for=LIVE, holder="w-told")
    assert q.cancel("told", "not needed").outcome == "requested"
    assert q.get("told").attempts[-1].ended is None  # the holder has not been told yet
    assert q.extend([told.lease]) == [None]  # its heartbeat ends the task
    (a,) = q.get("told").attempts
    assert (a.worker, a.outcome) == ("w-told", "cancelled")
    assert a.ended is not None

    q.enqueue(Q, {}, id="gone")
    q.claim(Q, lease_for=SHORT, holder="w-gone")
    assert q.cancel("gone", "stop").outcome == "requested"
    time.sleep(PAST)
    q.reap(Q)  # its holder vanished: the reaper carries the cancel out
    assert q.get("gone").state == "cancelled"
    (b,) = q.get("gone").attempts
    assert (b.worker, b.outcome) == ("w-gone", "cancelled")

    q.enqueue(Q, {}, id="late")
    q.claim(Q, lease_for=SHORT, holder="w-late")
    time.sleep(PAST)
    assert q.cancel("late", "too late").outcome == "cancelled"  # the lease had run out
    (c,) = q.get("late").attempts
    assert (c.worker, c.outcome) == ("w-late", "cancelled")


def test_deleting_a_queue_deletes_its_attempt_histories(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {}, id="kept")
    (job,) = q.claim(Q, lease_for=LIVE, holder="w")
    q.complete(job.lease, None)
    assert len(q.get("kept").attempts) == 1
    assert q.delete_queue(Q) == 1
    q.enqueue(Q, {}, id="kept")  # the same id, anew: no history carried over
    assert q.get("kept").attempts == ()
