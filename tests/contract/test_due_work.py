"""Claim finds work that fell due while other leases run, whatever made it due, on every backend.

A store may skip its search for due tasks and expired leases while it knows nothing can be due
(Redis keeps a wake time, the earliest score of its waiting and leases sets). These tests make
work fall due *before* a long lease granted earlier runs out, in each way that can happen: a
delayed enqueue, a retry, a lease shortened by extend, a shorter lease granted by a later claim.
"""

from __future__ import annotations

import time

import agentlease as al
from tests.conftest import Store

Q = "due"
SHORT = 0.3
PAST = 0.5
LIVE = 30.0


def holding_a_long_lease(store: Store) -> tuple[al.Queue, al.Job]:
    """A queue whose only lease runs for LIVE seconds (and whose ready set is then empty)."""
    q = store.queue()
    q.enqueue(Q, "long")
    (job,) = q.claim(Q, lease_for=LIVE)
    assert q.claim(Q, lease_for=LIVE) == []
    return q, job


def test_a_delayed_task_enqueued_during_a_long_lease_is_claimed_when_due(store: Store) -> None:
    q, _ = holding_a_long_lease(store)
    task_id = q.enqueue(Q, "later", delay=SHORT).task_id
    assert q.claim(Q, lease_for=LIVE) == []
    time.sleep(PAST)
    (job,) = q.claim(Q, lease_for=LIVE)
    assert job.task_id == task_id


def test_a_retry_due_before_a_long_lease_runs_out_is_claimed_when_due(store: Store) -> None:
    q, long = holding_a_long_lease(store)
    q.enqueue(Q, "flaky")
    (job,) = q.claim(Q, lease_for=LIVE)
    q.fail(job.lease, "try again soon", retry_in=SHORT)
    assert q.claim(Q, lease_for=LIVE) == []
    time.sleep(PAST)
    (again,) = q.claim(Q, lease_for=LIVE)
    assert (again.task_id, again.attempt, again.failures) == (job.task_id, 2, 1)
    assert q.get(long.task_id).state == "leased"


def test_a_lease_shortened_by_extend_is_reaped_by_the_next_claim(store: Store) -> None:
    q, job = holding_a_long_lease(store)
    (shorter,) = q.extend([job.lease], lease_for=SHORT)
    assert shorter is not None
    assert shorter.expires_at < job.lease.expires_at
    time.sleep(PAST)
    (again,) = q.claim(Q, lease_for=LIVE)  # reaps the expired lease and leases the task anew
    assert (again.task_id, again.attempt, again.reclaims) == (job.task_id, 2, 1)


def test_a_short_lease_after_a_long_one_is_reaped_by_the_next_claim(store: Store) -> None:
    q, long = holding_a_long_lease(store)
    q.enqueue(Q, "short")
    (short,) = q.claim(Q, lease_for=SHORT)
    time.sleep(PAST)
    (again,) = q.claim(Q, lease_for=LIVE)
    assert (again.task_id, again.attempt, again.reclaims) == (short.task_id, 2, 1)
    assert q.get(long.task_id).state == "leased"


def test_work_due_after_idle_claims_is_found(store: Store) -> None:
    """Claims that find nothing (an idle worker polling) do not hide work that falls due."""
    q = store.queue()
    first = q.enqueue(Q, "first", delay=SHORT).task_id
    for _ in range(3):
        assert q.claim(Q, lease_for=LIVE) == []
    time.sleep(PAST)
    second = q.enqueue(Q, "second", delay=SHORT).task_id
    (job,) = q.claim(Q, lease_for=LIVE)
    assert job.task_id == first
    assert q.claim(Q, lease_for=LIVE) == []
    time.sleep(PAST)
    (job,) = q.claim(Q, lease_for=LIVE)
    assert job.task_id == second
