"""The contract of the leased work queue, held against every backend.

Every test runs once per store of the ``store`` fixture (memory and SQLite now; Redis and
PostgreSQL when they join the fixture) and must pass on each unchanged. So the tests reach no
backend internals, assume no fake clock, and use real durations with generous margins: a lease
meant to expire is ``SHORT`` and the test sleeps ``PAST`` it; a lease that must stay live for the
whole test is ``LIVE``. Store times (``leased_at``, ``expires_at``) are only compared with other
store times, never with this process's clock.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from enum import Enum

import pytest

import agentlease as al
from agentlease import (
    InvalidDuration,
    InvalidInput,
    InvalidName,
    LeaseLost,
    NotJSON,
    PayloadTooLarge,
    QueueSettings,
    TaskSpec,
    UnknownQueue,
    UnknownTask,
)

Q = "jobs"
SHORT = 0.3  # a lease meant to expire
PAST = 0.5  # a sleep that outlives SHORT
LIVE = 30.0  # a lease that must stay live for the whole test
EPS = 1e-3  # slack for comparing store times that went through a float column


def claim_one(q: al.Queue, queue: str = Q, *, lease_for: float = LIVE) -> al.Job:
    """Claim exactly one task (fails the test if there is none)."""
    jobs = q.claim(queue, lease_for=lease_for)
    assert len(jobs) == 1, f"expected one job from {queue!r}, got {jobs}"
    return jobs[0]


def drain_payloads(q: al.Queue, queue: str = Q) -> list[object]:
    """Claim one task at a time until the queue is empty; the payloads in pick order."""
    out = []
    while jobs := q.claim(queue, lease_for=LIVE):
        (job,) = jobs
        out.append(job.payload)
    return out


def counts(q: al.Queue, queue: str = Q) -> dict[str, int]:
    return {state: n for state, n in q.stats(queue).counts.items() if n}


def expire_and_reap(q: al.Queue, queue: str = Q) -> list[al.Reaped]:
    time.sleep(PAST)
    return q.reap(queue)


# -- the happy path ------------------------------------------------------------------------------


def test_round_trip_payload_and_result(store):
    q = store.queue()
    other = store.queue()  # a second client on the same store sees the same truth
    payload = {"prompt": "summarise", "docs": [1, 2.5, "three", None, True], "meta": {"k": []}}

    enq = q.enqueue(Q, payload)
    assert enq.created
    task = other.get(enq.task_id)
    assert (task.id, task.queue, task.state, task.attempt) == (enq.task_id, Q, "queued", 0)
    assert task.payload == payload
    assert (task.reclaims, task.failures, task.result, task.error) == (0, 0, None, None)

    job = claim_one(q)
    assert job.task_id == enq.task_id
    assert job.payload == payload
    assert job.attempt == 1
    assert job.checkpoint is None
    assert job.lease.queue == Q
    assert job.lease.expires_at - job.lease.leased_at == pytest.approx(LIVE, abs=0.5)
    held = other.get(enq.task_id)
    assert held.state == "leased"
    assert held.attempt == 1
    assert held.expires_at == pytest.approx(job.lease.expires_at, abs=EPS)
    assert other.claim(Q, lease_for=LIVE) == []  # held tasks are not claimable

    result = {"summary": "ok", "tokens": 123, "scores": [0.5, 0.001], "none": None}
    q.complete(job.lease, result)
    done = other.get(enq.task_id)
    assert done.state == "done"
    assert done.result == result
    assert done.payload == payload
    assert done.finished_at is not None
    assert done.expires_at is None
    assert other.claim(Q, lease_for=LIVE) == []
    assert counts(other) == {"done": 1}
    assert other.stats(Q).depth == 0

    # Completing twice is a stale write: refused, nothing changes.
    with pytest.raises(LeaseLost):
        q.complete(job.lease, "again")
    assert other.get(enq.task_id) == done


def test_complete_without_result(store):
    q = store.queue()
    task_id = q.enqueue(Q).task_id
    assert q.get(task_id).payload is None
    q.complete(claim_one(q).lease)
    task = q.get(task_id)
    assert task.state == "done"
    assert task.result is None


def test_stats_count_every_state(store):
    q = store.queue()
    q.enqueue_many(Q, [1, 2, 3, 4])
    time.sleep(0.15)
    q.enqueue(Q, 5, delay=LIVE)
    a, b, c = q.claim(Q, 3, lease_for=LIVE)
    q.complete(a.lease, None)
    q.fail(b.lease, "boom", retry_in=LIVE)
    stats = q.stats(Q)
    assert stats.queue == Q
    assert {s: n for s, n in stats.counts.items() if n} == {
        "queued": 1,
        "scheduled": 1,
        "leased": 1,
        "done": 1,
        "failed": 1,
    }
    assert stats.depth == 3
    assert stats.oldest_queued_age is not None
    assert 0.15 <= stats.oldest_queued_age < 60
    assert q.queues() == [Q]
    (info,) = q.inspect(Q)
    assert (info.task_id, info.attempt) == (c.task_id, 1)
    assert 0 < info.expires_in <= LIVE + 1
    assert info.leased_for >= 0


def test_inspect_lists_live_leases_soonest_expiry_first(store):
    q = store.queue()
    q.enqueue_many(Q, ["a", "b", "c"])
    a = claim_one(q, lease_for=LIVE)
    b = claim_one(q, lease_for=LIVE / 2)
    c = claim_one(q, lease_for=LIVE * 2)
    assert [i.task_id for i in q.inspect(Q)] == [b.task_id, a.task_id, c.task_id]
    assert [i.task_id for i in q.inspect(Q, limit=2)] == [b.task_id, a.task_id]
    q.complete(b.lease, None)
    assert [i.task_id for i in q.inspect(Q)] == [a.task_id, c.task_id]


# -- ordering ------------------------------------------------------------------------------------


def test_higher_priority_first_then_fifo(store):
    q = store.queue()
    items = [(0, "a"), (2, "b"), (1, "c"), (2, "d"), (0, "e"), (-1, "f"), (1, "g"), (0, "h")]
    for name in ("one", "batch"):
        for priority, payload in items:
            q.enqueue(name, payload, priority=priority)
    expected = ["b", "d", "c", "g", "a", "e", "h", "f"]
    assert drain_payloads(q, "one") == expected
    # One claim of many returns them in the same pick order.
    assert [j.payload for j in q.claim("batch", len(items), lease_for=LIVE)] == expected


def test_enqueue_many_keeps_batch_order_within_a_priority(store):
    q = store.queue()
    specs = [TaskSpec(payload=i, priority=i % 2) for i in range(10)]
    q.enqueue_many(Q, specs)
    assert drain_payloads(q) == [1, 3, 5, 7, 9, 0, 2, 4, 6, 8]


def test_claim_n_returns_up_to_n_distinct_tasks(store):
    q = store.queue()
    ids = {e.task_id for e in q.enqueue_many(Q, list(range(10)))}
    assert len(ids) == 10
    first = q.claim(Q, 4, lease_for=LIVE)
    assert len(first) == 4
    rest = q.claim(Q, 10, lease_for=LIVE)
    assert len(rest) == 6
    assert q.claim(Q, 10, lease_for=LIVE) == []
    claimed = [j.task_id for j in first + rest]
    assert len(set(claimed)) == 10
    assert set(claimed) == ids
    assert len({j.lease.token for j in first + rest}) == 10
    assert all(j.attempt == 1 for j in first + rest)
    assert counts(q) == {"leased": 10}


# -- delayed tasks -------------------------------------------------------------------------------


def test_delayed_task_not_claimable_before_due(store):
    q = store.queue()
    # The delay leaves room for the four calls below on a loaded machine, where a process can
    # wait a second or more for a core.
    later = q.enqueue(Q, "later", delay=2.0).task_id
    now = q.enqueue(Q, "now").task_id
    assert q.get(later).state == "scheduled"
    assert q.stats(Q).counts.get("scheduled") == 1
    assert [j.task_id for j in q.claim(Q, 5, lease_for=LIVE)] == [now]
    assert q.claim(Q, 5, lease_for=LIVE) == []
    time.sleep(2.1)
    job = claim_one(q)
    assert (job.task_id, job.payload, job.attempt) == (later, "later", 1)


def test_long_delay_stays_scheduled(store):
    q = store.queue()
    task_id = q.enqueue(Q, "x", delay=3600).task_id
    time.sleep(0.05)
    assert q.claim(Q, lease_for=LIVE) == []
    task = q.get(task_id)
    assert task.state == "scheduled"
    assert task.run_at - task.created_at == pytest.approx(3600, abs=1)


# -- ids and dedup keys --------------------------------------------------------------------------


def test_caller_given_id_is_enqueued_once(store):
    q = store.queue()
    first = q.enqueue(Q, {"v": 1}, id="job-1")
    assert first == al.Enqueued("job-1", True)
    second = q.enqueue(Q, {"v": 2}, id="job-1", priority=5)
    assert second == al.Enqueued("job-1", False)
    task = q.get("job-1")
    assert task.payload == {"v": 1}
    assert task.priority == 0
    assert counts(q) == {"queued": 1}
    # Still nothing once the first one is done.
    q.complete(claim_one(q).lease, "ok")
    assert q.enqueue(Q, {"v": 3}, id="job-1") == al.Enqueued("job-1", False)
    assert q.get("job-1").state == "done"
    assert q.claim(Q, lease_for=LIVE) == []


def test_dedup_key_is_enqueued_once_per_queue(store):
    q = store.queue()
    first = q.enqueue(Q, "x", dedup_key="send-email:42")
    assert first.created
    second = q.enqueue(Q, "y", id="another", dedup_key="send-email:42")
    assert second == al.Enqueued(first.task_id, False)
    with pytest.raises(UnknownTask):
        q.get("another")
    assert q.get(first.task_id).payload == "x"
    assert counts(q) == {"queued": 1}
    # The key is per queue.
    elsewhere = q.enqueue("other", "z", dedup_key="send-email:42")
    assert elsewhere.created
    assert elsewhere.task_id != first.task_id
    # And still deduplicates once the task is done.
    q.complete(claim_one(q).lease, None)
    assert q.enqueue(Q, "w", dedup_key="send-email:42") == al.Enqueued(first.task_id, False)
    assert counts(q) == {"done": 1}


def test_enqueue_many_reports_duplicates_in_and_across_batches(store):
    q = store.queue()
    q.enqueue(Q, "old", id="t-0")
    out = q.enqueue_many(
        Q,
        [
            TaskSpec(payload="a", id="t-1"),
            TaskSpec(payload="b", id="t-0"),
            TaskSpec(payload="c", dedup_key="k"),
            TaskSpec(payload="d", dedup_key="k"),
            TaskSpec(payload="e", id="t-1"),
            "bare payload",
        ],
    )
    assert [e.created for e in out] == [True, False, True, False, False, True]
    assert out[0].task_id == "t-1"
    assert out[1].task_id == "t-0"
    assert out[3].task_id == out[2].task_id
    assert out[4].task_id == "t-1"
    assert q.get("t-0").payload == "old"
    assert q.get("t-1").payload == "a"
    assert q.get(out[2].task_id).payload == "c"
    assert q.get(out[5].task_id).payload == "bare payload"
    assert counts(q) == {"queued": 4}
    assert drain_payloads(q) == ["old", "a", "c", "bare payload"]


def test_enqueue_many_of_nothing(store):
    q = store.queue()
    assert q.enqueue_many(Q, []) == []
    assert Q not in q.queues()


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(TaskSpec(payload={1, 2}), id="set-payload"),
        pytest.param(TaskSpec(payload=float("nan")), id="nan-payload"),
        pytest.param(TaskSpec(payload="x" * 200), id="oversized"),
        pytest.param(TaskSpec(payload=1, id="bad id"), id="bad-id"),
        pytest.param(TaskSpec(payload=1, delay=-1), id="negative-delay"),
        pytest.param(TaskSpec(payload=1, priority=1.5), id="float-priority"),  # type: ignore[arg-type]
        pytest.param(TaskSpec(payload=1, dedup_key=""), id="empty-dedup-key"),
        pytest.param(object(), id="bare-object"),
    ],
)
def test_enqueue_many_is_all_or_nothing(store, bad):
    q = store.queue(QueueSettings(max_payload_bytes=100))
    q.enqueue(Q, "existing")
    before = counts(q)
    batch = [TaskSpec(payload="first", id="first"), "second", bad, TaskSpec(payload="last")]
    with pytest.raises(InvalidInput):
        q.enqueue_many(Q, batch)
    with pytest.raises(InvalidInput):
        q.enqueue_many("fresh", batch)
    assert counts(q) == before
    assert q.queues() == [Q]
    with pytest.raises(UnknownTask):
        q.get("first")
    assert drain_payloads(q) == ["existing"]


# -- attempts and fencing ------------------------------------------------------------------------


def test_attempt_increments_at_every_claim(store):
    q = store.queue()
    task_id = q.enqueue(Q, "x").task_id
    attempts = []

    job = claim_one(q)
    attempts.append(job.attempt)
    q.release(job.lease)
    job = claim_one(q)
    attempts.append(job.attempt)
    q.fail(job.lease, "transient", retry_in=0)
    job = claim_one(q, lease_for=SHORT)
    attempts.append(job.attempt)
    time.sleep(PAST)  # let it expire; the next claim reaps it on the way
    job = claim_one(q)
    attempts.append(job.attempt)

    assert attempts == [1, 2, 3, 4]
    task = q.get(task_id)
    assert (task.attempt, task.reclaims, task.failures) == (4, 1, 1)


def test_stale_lease_writes_are_fenced_after_reap_and_reclaim(store):
    q = store.queue()
    zombie = store.queue()  # the worker whose lease was reaped
    task_id = q.enqueue(Q, "x").task_id
    old = claim_one(zombie, lease_for=SHORT)
    reaped = expire_and_reap(q)
    assert [(r.task_id, r.attempt, r.outcome) for r in reaped] == [(task_id, 1, "requeued")]
    new = claim_one(q)
    assert new.attempt == 2
    assert new.lease.token != old.lease.token

    writes = {
        "complete": lambda: zombie.complete(old.lease, {"from": "zombie"}),
        "fail": lambda: zombie.fail(old.lease, "zombie", retry_in=0),
        "fail-dead": lambda: zombie.fail(old.lease, "zombie", retry_in=None),
        "release": lambda: zombie.release(old.lease),
        "release-back": lambda: zombie.release(old.lease, front=False),
        "progress": lambda: zombie.progress(old.lease, {"p": 1}, checkpoint={"c": 1}),
    }
    for name, write in writes.items():
        before = q.get(task_id)
        with pytest.raises(LeaseLost) as info:
            write()
        exc = info.value
        assert (exc.task_id, exc.attempt, exc.current_attempt) == (task_id, 1, 2), name
        assert exc.state == "leased", name
        assert q.get(task_id) == before, f"stale {name} changed the task"
    before = q.get(task_id)
    assert zombie.extend([old.lease], lease_for=LIVE) == [None]
    assert q.get(task_id) == before

    # The live holder is untouched and can finish.
    q.progress(new.lease, {"p": 2})
    q.complete(new.lease, {"from": "live"})
    task = q.get(task_id)
    assert (task.state, task.result, task.attempt, task.reclaims) == (
        "done",
        {"from": "live"},
        2,
        1,
    )
    assert task.progress == {"p": 2}
    assert task.checkpoint is None


def test_stale_lease_after_the_task_finished(store):
    q = store.queue()
    task_id = q.enqueue(Q, "x").task_id
    old = claim_one(q, lease_for=SHORT)
    expire_and_reap(q)
    new = claim_one(q)
    q.complete(new.lease, "done by attempt 2")
    before = q.get(task_id)
    with pytest.raises(LeaseLost) as info:
        q.complete(old.lease, "done by attempt 1")
    assert (info.value.attempt, info.value.current_attempt) == (1, 2)
    assert info.value.state == "done"
    assert q.get(task_id) == before


def test_write_after_expiry_before_any_reaper_is_rejected(store):
    q = store.queue()
    task_id = q.enqueue(Q, "x").task_id
    job = claim_one(q, lease_for=SHORT)
    time.sleep(PAST)  # expired, and no claim or reap has run since
    for write in (
        lambda: q.complete(job.lease, "late"),
        lambda: q.fail(job.lease, "late", retry_in=0),
        lambda: q.release(job.lease),
        lambda: q.progress(job.lease, "late", checkpoint="late"),
    ):
        before = q.get(task_id)
        with pytest.raises(LeaseLost) as info:
            write()
        assert (info.value.task_id, info.value.attempt, info.value.current_attempt) == (
            task_id,
            1,
            1,
        )
        assert q.get(task_id) == before
    assert q.extend([job.lease], lease_for=LIVE) == [None]
    assert q.inspect(Q) == []
    assert [r.task_id for r in q.reap(Q)] == [task_id]
    task = q.get(task_id)
    assert (task.state, task.reclaims, task.result, task.progress) == ("queued", 1, None, None)


def test_leases_are_per_claim_not_per_client(store):
    """A lease is the proof, not the client: another client holding it may write."""
    q = store.queue()
    other = store.queue()
    q.enqueue(Q, "x")
    job = claim_one(q)
    other.complete(job.lease, "by another client")
    assert q.get(job.task_id).result == "by another client"


# -- extend --------------------------------------------------------------------------------------


def test_extend_many_leases_in_one_call(store):
    q = store.queue()
    q.enqueue_many("short", ["s1", "s2"])
    q.enqueue_many("long", ["l1", "l2"])
    short = q.claim("short", 2, lease_for=SHORT)
    long = q.claim("long", 2, lease_for=5.0)
    assert len(short) == len(long) == 2
    time.sleep(PAST)
    q.complete(long[1].lease, "finished")

    asked = [short[0].lease, long[0].lease, short[1].lease, long[1].lease]
    renewed = q.extend(asked, lease_for=LIVE)
    assert len(renewed) == 4
    assert renewed[0] is None
    assert renewed[2] is None
    assert renewed[3] is None  # finished tasks are no longer held
    live = renewed[1]
    assert live is not None
    old = long[0].lease
    assert (live.task_id, live.token, live.attempt, live.queue) == (
        old.task_id,
        old.token,
        old.attempt,
        old.queue,
    )
    assert live.expires_at > old.expires_at
    assert live.expires_at - old.leased_at == pytest.approx(PAST + LIVE, abs=1.0)
    assert q.get(old.task_id).expires_at == pytest.approx(live.expires_at, abs=EPS)
    # Extending did not rescue the expired ones: they are still reaped.
    assert sorted(r.task_id for r in q.reap("short")) == sorted(j.task_id for j in short)
    assert q.reap("long") == []
    assert q.extend([], lease_for=LIVE) == []


def test_extend_renewed_lease_fences_like_the_original(store):
    q = store.queue()
    q.enqueue(Q, "x")
    job = claim_one(q, lease_for=SHORT)
    (renewed,) = q.extend([job.lease], lease_for=5.0)
    assert renewed is not None
    time.sleep(PAST)  # past the original expiry, well within the renewed one
    assert q.reap(Q) == []
    q.progress(renewed, "still here")
    q.complete(job.lease, "the original lease object still names the same claim")
    assert q.get(job.task_id).state == "done"


def test_extend_stale_and_live_lease_of_the_same_task(store):
    """A zombie's heartbeat is never told it still holds the task, whatever else is in the batch."""
    q = store.queue()
    task_id = q.enqueue(Q, "x").task_id
    old = claim_one(q, lease_for=SHORT)
    expire_and_reap(q)
    new = claim_one(q)
    before = q.get(task_id)
    renewed = q.extend([old.lease, new.lease], lease_for=LIVE)
    assert renewed[0] is None, "the reaped lease (attempt 1) was reported as renewed"
    assert renewed[1] is not None
    assert renewed[1].attempt == 2
    after = q.get(task_id)
    assert (after.state, after.attempt, after.reclaims) == (before.state, 2, before.reclaims)


# -- reaping -------------------------------------------------------------------------------------


@pytest.mark.parametrize("reap_front", [True, False])
def test_reaped_tasks_go_to_the_front_of_their_priority(store, reap_front):
    producer = store.queue()
    # "older" and "old" are enqueued first but only due after "victim" is claimed, so they wait
    # in the queue with earlier sequence numbers than the victim.
    producer.enqueue(Q, "older", delay=0.2)
    producer.enqueue(Q, "old", delay=0.2)
    victim = producer.enqueue(Q, "victim").task_id
    job = claim_one(producer, lease_for=SHORT)
    assert job.task_id == victim
    producer.enqueue(Q, "urgent", priority=1)
    producer.enqueue(Q, "low", priority=-1)
    time.sleep(PAST)

    events: list[al.Event] = []
    q = store.queue(QueueSettings(reap_front=reap_front), on_event=events.append)
    order = drain_payloads(q)
    if reap_front:
        assert order == ["urgent", "victim", "older", "old", "low"]
    else:
        assert order == ["urgent", "older", "old", "victim", "low"]
    assert [(e.task_id, e.fields.get("outcome")) for e in events if e.name == "reaped"] == [
        (victim, "requeued")
    ]
    assert q.get(victim).reclaims == 1


@pytest.mark.parametrize("reap_front", [True, False])
def test_explicit_reap_respects_reap_front(store, reap_front):
    q = store.queue(QueueSettings(reap_front=reap_front))
    q.enqueue(Q, "older", delay=0.2)
    victim = q.enqueue(Q, "victim").task_id
    claim_one(q, lease_for=SHORT)
    reaped = expire_and_reap(q)
    assert [(r.task_id, r.queue, r.attempt, r.outcome) for r in reaped] == [
        (victim, Q, 1, "requeued")
    ]
    assert q.reap(Q) == []  # reaped once only
    expected = ["victim", "older"] if reap_front else ["older", "victim"]
    assert drain_payloads(q) == expected


def test_reap_leaves_live_leases_and_other_queues_alone(store):
    q = store.queue()
    q.enqueue(Q, "short")
    q.enqueue(Q, "live")
    q.enqueue("elsewhere", "short elsewhere")
    short = claim_one(q, lease_for=SHORT)
    live = claim_one(q)
    claim_one(q, "elsewhere", lease_for=SHORT)
    reaped = expire_and_reap(q)
    assert [r.task_id for r in reaped] == [short.task_id]
    assert q.get(live.task_id).state == "leased"
    assert counts(q, "elsewhere") == {"leased": 1}
    assert q.reap("never-used") == []


def test_max_reclaims_dead_letters_with_a_reason(store):
    q = store.queue(QueueSettings(max_reclaims=1))
    task_id = q.enqueue(Q, "poison").task_id
    claim_one(q, lease_for=SHORT)
    assert [r.outcome for r in expire_and_reap(q)] == ["requeued"]
    assert q.get(task_id).reclaims == 1
    job = claim_one(q, lease_for=SHORT)
    assert job.reclaims == 1
    reaped = expire_and_reap(q)
    assert [(r.task_id, r.attempt, r.outcome) for r in reaped] == [(task_id, 2, "dead")]
    task = q.get(task_id)
    assert task.state == "dead"
    assert task.reclaims == 2
    assert task.failures == 0
    assert task.finished_at is not None
    assert isinstance(task.error, dict)
    assert task.error.get("message"), f"no reason recorded: {task.error!r}"
    assert q.claim(Q, lease_for=LIVE) == []
    assert [t.id for t in q.dead(Q)] == [task_id]
    with pytest.raises(LeaseLost) as info:
        q.complete(job.lease, "too late")
    assert info.value.state == "dead"


def test_max_reclaims_zero_dead_letters_at_first_expiry_during_claim(store):
    events: list[al.Event] = []
    q = store.queue(QueueSettings(max_reclaims=0), on_event=events.append)
    task_id = q.enqueue(Q, "x").task_id
    claim_one(q, lease_for=SHORT)
    time.sleep(PAST)
    assert q.claim(Q, lease_for=LIVE) == []  # the claim reaps it, and it is dead
    assert q.get(task_id).state == "dead"
    assert ("dead_lettered", task_id) in [(e.name, e.task_id) for e in events]


# -- failures ------------------------------------------------------------------------------------


def test_fail_with_retry_in_retries_later(store):
    q = store.queue()
    task_id = q.enqueue(Q, "x").task_id
    job = claim_one(q)
    task = q.fail(job.lease, ValueError("model returned garbage"), retry_in=0.4)
    assert task.id == task_id
    assert task.state == "failed"
    assert task.failures == 1
    assert task.error == {"type": "ValueError", "message": "model returned garbage"}
    assert q.get(task_id) == task
    assert q.claim(Q, lease_for=LIVE) == []
    assert q.stats(Q).depth == 1
    time.sleep(0.6)
    job = claim_one(q)
    assert (job.task_id, job.attempt, job.failures, job.reclaims) == (task_id, 2, 1, 0)
    task = q.fail(job.lease, "again", retry_in=0)
    assert (task.state, task.failures) == ("failed", 2)
    assert task.error == {"type": "Error", "message": "again"}
    job = claim_one(q)
    assert (job.attempt, job.failures) == (3, 2)


def test_fail_without_retry_dead_letters(store):
    q = store.queue()
    task_id = q.enqueue(Q, "x").task_id
    job = claim_one(q)
    task = q.fail(job.lease, KeyError("missing"), retry_in=None)
    assert task.state == "dead"
    assert task.failures == 1
    assert task.error["type"] == "KeyError"
    assert task.finished_at is not None
    assert q.claim(Q, lease_for=LIVE) == []
    assert [t.id for t in q.dead(Q)] == [task_id]
    assert counts(q) == {"dead": 1}


def test_dead_letters_are_listed_and_requeued_with_fresh_budgets(store):
    q = store.queue()
    ids = [e.task_id for e in q.enqueue_many(Q, ["a", "b", "c"])]
    jobs = q.claim(Q, 3, lease_for=LIVE)
    for job in jobs:
        q.fail(job.lease, f"fatal {job.payload}", retry_in=None)
        time.sleep(0.01)
    dead = q.dead(Q)
    assert [t.id for t in dead] == [j.task_id for j in reversed(jobs)], "most recent first"
    assert all(t.state == "dead" for t in dead)
    assert [t.error["message"] for t in dead] == ["fatal c", "fatal b", "fatal a"]
    assert [t.id for t in q.dead(Q, limit=2)] == [t.id for t in dead[:2]]

    assert q.requeue_dead(Q, []) == 0
    assert q.requeue_dead(Q, [ids[1], "not-a-task"]) == 1
    assert q.get(ids[1]).state == "queued"
    assert sorted(t.id for t in q.dead(Q)) == sorted([ids[0], ids[2]])
    assert q.requeue_dead(Q) == 2
    assert q.dead(Q) == []
    assert q.requeue_dead(Q) == 0

    again = q.claim(Q, 3, lease_for=LIVE)
    assert sorted(j.task_id for j in again) == sorted(ids)
    for job in again:
        assert job.attempt == 2, "the fencing counter must keep increasing"
        assert job.failures == 0
        assert job.reclaims == 0
    # The old leases stay fenced off.
    with pytest.raises(LeaseLost) as info:
        q.complete(jobs[0].lease, "zombie")
    assert (info.value.attempt, info.value.current_attempt) == (1, 2)


def test_requeued_dead_letter_gets_a_fresh_reclaim_budget(store):
    q = store.queue(QueueSettings(max_reclaims=0))
    task_id = q.enqueue(Q, "x").task_id
    claim_one(q, lease_for=SHORT)
    assert [r.outcome for r in expire_and_reap(q)] == ["dead"]
    assert q.requeue_dead(Q, [task_id], front=True) == 1
    task = q.get(task_id)
    assert (task.state, task.reclaims, task.failures, task.attempt) == ("queued", 0, 0, 1)
    job = claim_one(q)
    assert job.attempt == 2
    q.complete(job.lease, "ok")
    assert q.get(task_id).state == "done"


# -- lease limits --------------------------------------------------------------------------------


def test_max_lease_caps_total_lease_even_with_extends(store):
    max_lease = 0.8
    q = store.queue(QueueSettings(lease_for=5.0, max_lease=max_lease))
    task_id = q.enqueue(Q, "x").task_id
    job = claim_one(q, lease_for=5.0)
    lease = job.lease
    assert lease.expires_at - lease.leased_at <= max_lease + EPS
    time.sleep(0.1)
    (renewed,) = q.extend([lease], lease_for=5.0)
    assert renewed is not None
    assert renewed.expires_at - lease.leased_at <= max_lease + EPS
    time.sleep(max_lease + 0.3 - 0.1)
    assert q.extend([renewed], lease_for=5.0) == [None]
    with pytest.raises(LeaseLost):
        q.complete(renewed, "too late")
    assert [r.task_id for r in q.reap(Q)] == [task_id]


def test_progress_timeout_reaps_a_lease_without_progress(store):
    timeout = 0.6
    q = store.queue(QueueSettings(lease_for=5.0, progress_timeout=timeout))
    task_id = q.enqueue(Q, "x").task_id
    job = claim_one(q, lease_for=5.0)
    lease = job.lease
    start = lease.leased_at
    assert lease.expires_at - start <= timeout + EPS

    time.sleep(0.1)
    (renewed,) = q.extend([lease], lease_for=5.0)
    assert renewed is not None
    assert renewed.expires_at - start <= timeout + EPS, "extend without progress went past it"

    time.sleep(0.15)
    q.progress(lease, {"step": 1})  # progress resets the progress deadline
    (after_progress,) = q.extend([lease], lease_for=5.0)
    assert after_progress is not None
    assert after_progress.expires_at - start >= 0.25 + timeout - 0.05
    assert after_progress.expires_at - start <= 5.0

    # No more progress: heartbeats alone cannot move it past the progress deadline.
    time.sleep(0.3)
    (renewed,) = q.extend([lease], lease_for=5.0)
    assert renewed is not None
    assert renewed.expires_at == pytest.approx(after_progress.expires_at, abs=EPS)
    time.sleep(0.75)
    assert q.extend([lease], lease_for=5.0) == [None]
    assert [r.task_id for r in q.reap(Q)] == [task_id]
    assert q.get(task_id).progress == {"step": 1}


def test_checkpoint_survives_a_reap(store):
    q = store.queue()
    task_id = q.enqueue(Q, {"doc": 7}).task_id
    job = claim_one(q, lease_for=SHORT)
    q.progress(job.lease, {"pct": 10}, checkpoint={"pages_done": [1, 2]})
    q.progress(job.lease, {"pct": 20})  # no checkpoint: the saved one is kept
    task = q.get(task_id)
    assert task.progress == {"pct": 20}
    assert task.checkpoint == {"pages_done": [1, 2]}
    time.sleep(PAST)
    nxt = claim_one(q)
    assert (nxt.task_id, nxt.attempt, nxt.reclaims) == (task_id, 2, 1)
    assert nxt.checkpoint == {"pages_done": [1, 2]}
    assert nxt.payload == {"doc": 7}


# -- release -------------------------------------------------------------------------------------


def test_release_front_puts_it_back_first_without_counting(store):
    q = store.queue()
    first = q.enqueue(Q, "first").task_id
    q.enqueue(Q, "second")
    job = claim_one(q)
    assert job.task_id == first
    q.release(job.lease)
    task = q.get(first)
    assert (task.state, task.failures, task.reclaims, task.attempt) == ("queued", 0, 0, 1)
    again = claim_one(q)
    assert (again.task_id, again.attempt, again.failures, again.reclaims) == (first, 2, 0, 0)
    with pytest.raises(LeaseLost):
        q.release(job.lease)


def test_release_front_goes_ahead_of_older_tasks(store):
    q = store.queue()
    q.enqueue(Q, "older", delay=0.2)
    q.enqueue(Q, "newer")
    job = claim_one(q)
    time.sleep(0.3)
    q.release(job.lease, front=True)
    assert drain_payloads(q) == ["newer", "older"]


def test_release_back_goes_behind(store):
    q = store.queue()
    q.enqueue_many(Q, ["a", "b", "c"])
    job = claim_one(q)
    q.release(job.lease, front=False)
    assert drain_payloads(q) == ["b", "c", "a"]
    task = q.get(job.task_id)
    assert (task.failures, task.reclaims) == (0, 0)


# -- unknown things ------------------------------------------------------------------------------


def test_unknown_queue(store):
    q = store.queue()
    q.enqueue("known", "x")
    assert q.claim("nothing-here", 5, lease_for=LIVE) == []
    for read in (
        lambda: q.stats("nothing-here"),
        lambda: q.inspect("nothing-here"),
        lambda: q.dead("nothing-here"),
        lambda: q.requeue_dead("nothing-here"),
    ):
        with pytest.raises(UnknownQueue) as info:
            read()
        assert info.value.queue == "nothing-here"
        assert isinstance(info.value, LookupError)
    assert q.queues() == ["known"]


def test_queues_lists_every_queue_sorted(store):
    q = store.queue()
    assert q.queues() == []
    for name in ("b", "a", "c.d", "a"):
        q.enqueue(name, None)
    assert q.queues() == ["a", "b", "c.d"]


def test_unknown_task(store):
    q = store.queue()
    with pytest.raises(UnknownTask) as info:
        q.get("no-such-task")
    assert info.value.task_id == "no-such-task"
    assert isinstance(info.value, LookupError)


def test_lease_for_an_unknown_task_is_refused(store):
    q = store.queue()
    q.enqueue(Q, "x")
    real = claim_one(q).lease
    forged = al.Lease("no-such-task", Q, real.token, 1, real.leased_at, real.expires_at)
    with pytest.raises((LeaseLost, UnknownTask)):
        q.complete(forged, "x")
    assert q.extend([forged], lease_for=LIVE) == [None]
    wrong_token = al.Lease(real.task_id, Q, "0" * 32, real.attempt, real.leased_at, real.expires_at)
    before = q.get(real.task_id)
    with pytest.raises(LeaseLost):
        q.complete(wrong_token, "x")
    assert q.extend([wrong_token], lease_for=LIVE) == [None]
    assert q.get(real.task_id) == before


# -- bad input: a typed error, and nothing written -----------------------------------------------


class Colour(Enum):
    RED = "red"


NOT_JSON = [
    pytest.param({1, 2}, id="set"),
    pytest.param(frozenset({1}), id="frozenset"),
    pytest.param(object(), id="object"),
    pytest.param(float("nan"), id="nan"),
    pytest.param({"score": float("inf")}, id="nested-inf"),
    pytest.param([1, [2, float("-inf")]], id="deep-minus-inf"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param({1: "int key"}, id="int-key"),
    pytest.param(2**70, id="huge-int"),
    pytest.param(1 + 2j, id="complex"),
]


@pytest.mark.parametrize("payload", NOT_JSON)
def test_enqueue_refuses_non_json_payloads(store, payload):
    q = store.queue()
    q.enqueue(Q, "existing")
    with pytest.raises(NotJSON):
        q.enqueue(Q, payload)
    with pytest.raises(NotJSON):
        q.enqueue("fresh", payload)
    assert counts(q) == {"queued": 1}
    assert q.queues() == [Q]


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(uuid.UUID(int=1), id="uuid"),
        pytest.param(Colour.RED, id="enum"),
        pytest.param({"id": uuid.UUID(int=1), "note": None}, id="uuid-next-to-null"),
        pytest.param([None, Colour.RED], id="enum-next-to-null"),
    ],
)
def test_enqueue_refuses_objects_that_look_like_json(store, payload):
    """What a handler receives must equal what the producer sent: objects are refused, not
    reshaped into strings, and refused with the typed error."""
    q = store.queue()
    with pytest.raises(NotJSON):
        q.enqueue(Q, payload)
    assert q.queues() == []


def test_enqueue_refuses_oversized_payloads(store):
    q = store.queue(QueueSettings(max_payload_bytes=64))
    q.enqueue(Q, "x" * 50)  # 52 bytes encoded: fits
    with pytest.raises(PayloadTooLarge) as info:
        q.enqueue(Q, "x" * 63)
    assert (info.value.size, info.value.limit, info.value.what) == (65, 64, "payload")
    assert counts(q) == {"queued": 1}


BAD_QUEUE_NAMES = [
    pytest.param("", id="empty"),
    pytest.param("a b", id="space"),
    pytest.param("{x}", id="braces"),
    pytest.param("x" * 200, id="too-long"),
    pytest.param("-x", id="leading-dash"),
    pytest.param("a\nb", id="newline"),
    pytest.param("a*", id="glob"),
    pytest.param("é", id="non-ascii"),
    pytest.param(123, id="int"),
    pytest.param(None, id="none"),
    pytest.param(b"jobs", id="bytes"),
]


@pytest.mark.parametrize("name", BAD_QUEUE_NAMES)
def test_bad_queue_names_are_refused_everywhere(store, name):
    q = store.queue()
    q.enqueue(Q, "x")
    for call in (
        lambda: q.enqueue(name, "x"),
        lambda: q.enqueue_many(name, ["x"]),
        lambda: q.claim(name),
        lambda: q.reap(name),
        lambda: q.stats(name),
        lambda: q.inspect(name),
        lambda: q.dead(name),
        lambda: q.requeue_dead(name),
    ):
        with pytest.raises(InvalidName):
            call()
    assert q.queues() == [Q]
    assert counts(q) == {"queued": 1}


def test_longest_queue_name_is_accepted(store):
    q = store.queue()
    name = "q" * 128
    q.enqueue(name, "x")
    assert q.queues() == [name]
    assert claim_one(q, name).payload == "x"


BAD_IDS = [
    pytest.param("", id="empty"),
    pytest.param("a b", id="space"),
    pytest.param("x" * 201, id="too-long"),
    pytest.param("{id}", id="braces"),
    pytest.param("../etc", id="leading-dot"),
    pytest.param(5, id="int"),
    pytest.param(b"id", id="bytes"),
]


@pytest.mark.parametrize("task_id", BAD_IDS)
def test_bad_task_ids_are_refused(store, task_id):
    q = store.queue()
    q.enqueue(Q, "x", id="good")
    job = claim_one(q)
    q.fail(job.lease, "x", retry_in=None)
    with pytest.raises(InvalidName):
        q.enqueue(Q, "y", id=task_id)
    with pytest.raises(InvalidName):
        q.enqueue_many(Q, [TaskSpec(payload="z"), TaskSpec(payload="y", id=task_id)])
    with pytest.raises(InvalidName):
        q.get(task_id)
    with pytest.raises(InvalidName):
        q.requeue_dead(Q, ["good", task_id])
    assert counts(q) == {"dead": 1}


BAD_DURATIONS = [
    pytest.param(0, id="zero"),
    pytest.param(0.0, id="zero-float"),
    pytest.param(-1.0, id="negative"),
    pytest.param(float("nan"), id="nan"),
    pytest.param(float("inf"), id="inf"),
    pytest.param(True, id="bool"),
    pytest.param("5", id="str"),
]


@pytest.mark.parametrize("lease_for", BAD_DURATIONS)
def test_bad_lease_durations_are_refused(store, lease_for):
    q = store.queue()
    task_id = q.enqueue(Q, "x").task_id
    with pytest.raises(InvalidDuration):
        q.claim(Q, lease_for=lease_for)
    assert q.get(task_id).state == "queued"
    assert q.get(task_id).attempt == 0
    job = claim_one(q)
    with pytest.raises(InvalidDuration):
        q.extend([job.lease], lease_for=lease_for)
    assert q.get(task_id).expires_at == pytest.approx(job.lease.expires_at, abs=EPS)


@pytest.mark.parametrize(
    "delay",
    [
        pytest.param(-0.5, id="negative"),
        pytest.param(float("nan"), id="nan"),
        pytest.param(float("inf"), id="inf"),
        pytest.param(True, id="bool"),
        pytest.param("1", id="str"),
        pytest.param(None, id="none"),
    ],
)
def test_bad_delays_are_refused(store, delay):
    q = store.queue()
    with pytest.raises(InvalidDuration):
        q.enqueue(Q, "x", delay=delay)
    with pytest.raises(InvalidDuration):
        q.enqueue_many(Q, [TaskSpec(payload="x", delay=delay)])
    assert q.queues() == []


@pytest.mark.parametrize("retry_in", [-1.0, float("nan"), float("inf"), "soon", True])
def test_bad_retry_in_is_refused_and_the_lease_stays_held(store, retry_in):
    q = store.queue()
    task_id = q.enqueue(Q, "x").task_id
    job = claim_one(q)
    before = q.get(task_id)
    with pytest.raises(InvalidDuration):
        q.fail(job.lease, "x", retry_in=retry_in)
    assert q.get(task_id) == before
    q.complete(job.lease, "fine")


@pytest.mark.parametrize("n", [0, -1, 10_001, 1.5, True, "2", None])
def test_bad_batch_sizes_are_refused(store, n):
    q = store.queue()
    task_id = q.enqueue(Q, "x").task_id
    with pytest.raises(InvalidInput):
        q.claim(Q, n, lease_for=LIVE)
    with pytest.raises(InvalidInput):
        q.inspect(Q, limit=n)
    with pytest.raises(InvalidInput):
        q.dead(Q, limit=n)
    assert q.get(task_id).state == "queued"


@pytest.mark.parametrize("priority", [1.5, "1", True, None, 2**31, -(2**31) - 1])
def test_bad_priorities_are_refused(store, priority):
    q = store.queue()
    with pytest.raises(InvalidInput):
        q.enqueue(Q, "x", priority=priority)
    assert q.queues() == []


def test_extreme_priorities_are_accepted_and_ordered(store):
    q = store.queue()
    q.enqueue(Q, "low", priority=-(2**31))
    q.enqueue(Q, "high", priority=2**31 - 1)
    q.enqueue(Q, "mid")
    assert drain_payloads(q) == ["high", "mid", "low"]


@pytest.mark.parametrize("dedup_key", ["", 5, "k" * 501, b"k"])
def test_bad_dedup_keys_are_refused(store, dedup_key):
    q = store.queue()
    with pytest.raises(InvalidInput):
        q.enqueue(Q, "x", dedup_key=dedup_key)
    assert q.queues() == []


def test_input_errors_are_value_errors():
    for cls in (InvalidInput, InvalidName, InvalidDuration, NotJSON, PayloadTooLarge):
        assert issubclass(cls, ValueError)
        assert issubclass(cls, al.AgentLeaseError)


@pytest.mark.parametrize(
    "result",
    [
        pytest.param({1, 2}, id="set"),
        pytest.param(object(), id="object"),
        pytest.param({"score": float("nan")}, id="nan"),
        pytest.param(b"raw", id="bytes"),
        pytest.param("x" * 200, id="oversized"),
    ],
)
def test_bad_results_are_refused_and_the_lease_stays_held(store, result):
    q = store.queue(QueueSettings(max_payload_bytes=100))
    task_id = q.enqueue(Q, "x").task_id
    job = claim_one(q)
    before = q.get(task_id)
    with pytest.raises((NotJSON, PayloadTooLarge)):
        q.complete(job.lease, result)
    assert q.get(task_id) == before
    with pytest.raises((NotJSON, PayloadTooLarge)):
        q.progress(job.lease, result)
    with pytest.raises((NotJSON, PayloadTooLarge)):
        q.progress(job.lease, "fine", checkpoint=result)
    assert q.get(task_id) == before
    q.complete(job.lease, {"ok": True})
    task = q.get(task_id)
    assert (task.state, task.result) == ("done", {"ok": True})


def test_settings_refuse_bad_values():
    for kwargs in (
        {"lease_for": 0},
        {"lease_for": float("nan")},
        {"max_lease": -1},
        {"progress_timeout": 0},
        {"max_reclaims": -1},
        {"max_reclaims": 1.5},
        {"max_payload_bytes": 0},
    ):
        with pytest.raises(InvalidInput):
            QueueSettings(**kwargs)  # type: ignore[arg-type]


# -- the async face ------------------------------------------------------------------------------


async def test_async_round_trip(store):
    q = store.aqueue()
    try:
        enq = await q.enqueue(Q, {"a": [1, 2]}, priority=1)
        await q.enqueue(Q, "low")
        (job,) = await q.claim(Q, lease_for=LIVE)
        assert (job.task_id, job.payload, job.attempt) == (enq.task_id, {"a": [1, 2]}, 1)
        await q.progress(job.lease, {"pct": 50}, checkpoint={"at": 1})
        (renewed,) = await q.extend([job.lease], lease_for=LIVE)
        assert renewed is not None
        await q.complete(job.lease, {"answer": 42})
        task = await q.get(enq.task_id)
        assert (task.state, task.result, task.checkpoint) == ("done", {"answer": 42}, {"at": 1})
        stats = await q.stats(Q)
        assert stats.counts.get("done") == 1
        assert stats.counts.get("queued") == 1
        assert await q.queues() == [Q]
        # The sync face on the same store sees the same task.
        assert store.queue().get(enq.task_id) == task
    finally:
        await q.close()


async def test_async_fencing_after_reap(store):
    q = store.aqueue()
    try:
        task_id = (await q.enqueue(Q, "x")).task_id
        (old,) = await q.claim(Q, lease_for=SHORT)
        await asyncio.sleep(PAST)
        reaped = await q.reap(Q)
        assert [(r.task_id, r.outcome) for r in reaped] == [(task_id, "requeued")]
        (new,) = await q.claim(Q, lease_for=LIVE)
        assert new.attempt == 2
        before = await q.get(task_id)
        with pytest.raises(LeaseLost) as info:
            await q.complete(old.lease, "zombie")
        assert (info.value.task_id, info.value.attempt, info.value.current_attempt) == (
            task_id,
            1,
            2,
        )
        with pytest.raises(LeaseLost):
            await q.fail(old.lease, "zombie", retry_in=None)
        with pytest.raises(LeaseLost):
            await q.release(old.lease)
        with pytest.raises(LeaseLost):
            await q.progress(old.lease, 1)
        assert (await q.extend([old.lease], lease_for=LIVE)) == [None]
        after = await q.get(task_id)
        assert (after.state, after.attempt, after.result) == (before.state, 2, None)
        await q.complete(new.lease, "live")
        assert (await q.get(task_id)).result == "live"
    finally:
        await q.close()


async def test_async_bad_input_is_refused(store):
    q = store.aqueue()
    try:
        with pytest.raises(NotJSON):
            await q.enqueue(Q, {1, 2})
        with pytest.raises(InvalidName):
            await q.enqueue("a b", 1)
        with pytest.raises(InvalidDuration):
            await q.enqueue(Q, 1, delay=float("nan"))
        with pytest.raises(InvalidInput):
            await q.enqueue_many(Q, [1, TaskSpec(payload=2, id="")])
        assert await q.queues() == []
        await q.enqueue(Q, "x")
        with pytest.raises(InvalidInput):
            await q.claim(Q, 0)
        with pytest.raises(InvalidDuration):
            await q.claim(Q, lease_for=-1)
        (job,) = await q.claim(Q, lease_for=LIVE)
        with pytest.raises(NotJSON):
            await q.complete(job.lease, object())
        assert (await q.get(job.task_id)).state == "leased"
        await q.complete(job.lease, "ok")
        with pytest.raises(UnknownQueue):
            await q.stats("nothing-here")
        with pytest.raises(UnknownTask):
            await q.get("nothing-here")
        assert await q.claim("nothing-here") == []
    finally:
        await q.close()


async def test_async_concurrent_claims_are_distinct(store):
    clients = [store.aqueue() for _ in range(4)]
    try:
        await clients[0].enqueue_many(Q, list(range(20)))
        batches = await asyncio.gather(*(c.claim(Q, 3, lease_for=LIVE) for c in clients * 3))
        claimed = [j.task_id for batch in batches for j in batch]
        assert len(claimed) == 20
        assert len(set(claimed)) == 20
    finally:
        for c in clients:
            await c.close()
