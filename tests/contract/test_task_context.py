"""A task's context (its root task and deadline) on every backend of the ``store`` fixture: stored
verbatim with the task at enqueue, returned by claim (in the job) and get (in the task), and kept
through a retry, a reclaim and a requeue from the dead letters; a task without one is its own
root with no deadline."""

from __future__ import annotations

import time

import orjson

from agentlease import TaskSpec
from agentlease._records import NewTask, encode_context
from tests.conftest import Store

Q = "ctx"
LIVE = 30.0
SHORT = 0.3
PAST = 0.5


def _new(task_id: str, context: bytes | None, **kw: object) -> NewTask:
    return NewTask(id=task_id, queue=Q, payload_json=b"{}", context_json=context, **kw)  # type: ignore[arg-type]


def test_context_round_trips_through_enqueue_claim_get_retry_reclaim_and_requeue(
    store: Store,
) -> None:
    q = store.queue()
    backend = q.backend
    at = backend.now() + 3600.0
    context = encode_context("root-1", at)
    assert context is not None
    assert orjson.loads(context) == {"root": "root-1", "deadline": at}
    created = backend.enqueue([_new("child", context), _new("plain", None)])
    assert [e.created for e in created] == [True, True]

    task = q.get("child")
    assert task.context_json == context  # byte for byte
    assert (task.root_id, task.deadline) == ("root-1", at)
    plain = q.get("plain")
    assert (plain.context_json, plain.root_id, plain.deadline) == (None, "plain", None)

    jobs = {j.task_id: j for j in q.claim(Q, n=5, lease_for=LIVE)}
    assert jobs["child"].context_json == context
    assert (jobs["child"].root_id, jobs["child"].deadline) == ("root-1", at)
    assert (jobs["plain"].context_json, jobs["plain"].root_id) == (None, "plain")
    assert jobs["plain"].deadline is None

    failed = q.fail(jobs["child"].lease, ValueError("again"), retry_in=0.0)  # a retry
    assert failed.context_json == context
    q.complete(jobs["plain"].lease, None)
    (retried,) = q.claim(Q, n=5, lease_for=SHORT)
    assert retried.task_id == "child"
    assert retried.context_json == context
    time.sleep(PAST)  # its lease runs out: the next claim reaps it and takes it again
    (reclaimed,) = q.claim(Q, n=5, lease_for=LIVE)
    assert (reclaimed.task_id, reclaimed.reclaims) == ("child", 1)
    assert reclaimed.context_json == context

    dead = q.fail(reclaimed.lease, ValueError("give up"), retry_in=None)
    assert (dead.state, dead.context_json) == ("dead", context)
    (listed,) = q.dead(Q)
    assert listed.context_json == context
    assert q.requeue_dead(Q) == 1
    (again,) = q.claim(Q, n=5, lease_for=LIVE)
    assert (again.task_id, again.context_json) == ("child", context)
    assert q.get("child").root_id == "root-1"


def test_context_with_partitions_and_a_batch_claim(store: Store) -> None:
    """The partitioned enqueue path (its own statement on PostgreSQL) stores contexts too, and a
    claim of several jobs returns each one's own."""
    q = store.queue()
    backend = q.backend
    only_root = encode_context("r", None)
    only_deadline = encode_context(None, 12345.5)
    backend.enqueue(
        [
            _new("p0", only_root, partition="acct"),
            _new("p1", only_deadline, partition="acct"),  # parked behind p0
            _new("n0", None),
            _new("n1", only_deadline),
        ]
    )
    assert q.get("p1").state == "parked"
    assert (q.get("p1").root_id, q.get("p1").deadline) == ("p1", 12345.5)
    jobs = {j.task_id: j for j in q.claim(Q, n=10, lease_for=LIVE)}
    assert sorted(jobs) == ["n0", "n1", "p0"]
    assert (jobs["p0"].root_id, jobs["p0"].deadline) == ("r", None)
    assert jobs["n0"].context_json is None
    assert jobs["n1"].context_json == only_deadline
    q.complete(jobs["p0"].lease, None)  # p1 is unparked
    (p1,) = q.claim(Q, n=10, lease_for=LIVE)
    assert (p1.task_id, p1.context_json) == ("p1", only_deadline)


def test_a_task_enqueued_with_a_deadline_carries_it_on_the_store_clock(store: Store) -> None:
    q = store.queue()
    before = q.backend.now()
    q.enqueue(Q, {}, id="d", deadline=60.0)
    q.enqueue_many(Q, [TaskSpec(id="m", deadline=30.0), TaskSpec(id="none")])
    after = q.backend.now()
    d, m = q.get("d"), q.get("m")
    assert d.deadline is not None
    assert m.deadline is not None
    # "Seconds from now", measured between the two readings of the store's clock (give or take
    # the time the call took to read it).
    assert before + 60.0 - 1.0 <= d.deadline <= after + 60.0
    assert before + 30.0 - 1.0 <= m.deadline <= after + 30.0
    assert (d.root_id, m.root_id) == ("d", "m")  # enqueued outside a handler: their own roots
    assert q.get("none").context_json is None


def test_a_task_enqueued_with_a_time_limit_carries_it(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {"n": 1}, id="limited", timeout=7.5)
    (created,) = q.enqueue_many(Q, [TaskSpec(payload=2, id="spec", timeout=2)])
    assert created.created
    q.enqueue(Q, 3, id="plain")
    assert q.get("limited").timeout == 7.5
    assert q.get("spec").timeout == 2.0
    assert q.get("plain").timeout is None
    assert q.get("plain").context_json is None  # nothing stored for a task without one
    jobs = {j.task_id: j for j in q.claim(Q, 3, lease_for=LIVE)}
    assert jobs["limited"].timeout == 7.5
    assert jobs["limited"].root_id == "limited"  # still its own root
    assert jobs["plain"].timeout is None
