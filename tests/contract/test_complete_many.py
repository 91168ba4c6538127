"""complete_many: many completions in one round trip, each fenced on its own, on every backend."""

from __future__ import annotations

import dataclasses
import time

import pytest

import agentlease as al
from tests.conftest import Store

Q = "batch"
LIVE = 30.0


def test_completes_every_live_lease(store: Store) -> None:
    q = store.queue()
    q.enqueue_many(Q, [{"i": i} for i in range(5)])
    jobs = q.claim(Q, 5, lease_for=LIVE)
    outcomes = q.complete_many([(j.lease, {"i": j.payload["i"] * 10}) for j in jobs])  # type: ignore[index, operator]
    assert outcomes == [None] * 5
    for j in jobs:
        task = q.get(j.task_id)
        assert task.state == "done"
        assert task.result == {"i": j.payload["i"] * 10}  # type: ignore[index, operator]
    assert q.complete_many([]) == []


def test_each_item_is_fenced_on_its_own(store: Store) -> None:
    q = store.queue()
    zombie_task = q.enqueue(Q, "reaped").task_id
    (stale,) = q.claim(Q, lease_for=0.3)
    time.sleep(0.5)
    (live,) = q.claim(Q, lease_for=LIVE)  # reaps the stale lease and takes the task
    assert live.task_id == zombie_task
    assert live.attempt == stale.attempt + 1
    other = q.enqueue(Q, "other").task_id
    (fine,) = q.claim(Q, lease_for=LIVE)
    assert fine.task_id == other
    ghost = dataclasses.replace(fine.lease, task_id="no-such-task")

    outcomes = q.complete_many(
        [(stale.lease, "from the zombie"), (fine.lease, "fine"), (ghost, "ghost")]
    )
    lost, accepted, unknown = outcomes
    assert isinstance(lost, al.LeaseLost)
    assert (lost.task_id, lost.attempt, lost.current_attempt) == (zombie_task, 1, 2)
    assert accepted is None
    assert isinstance(unknown, al.UnknownTask)
    assert q.get(other).result == "fine"
    held = q.get(zombie_task)
    assert (held.state, held.attempt, held.result_json) == ("leased", 2, None)

    # The live lease of the task the zombie lost still completes.
    assert q.complete_many([(live.lease, "live")]) == [None]
    assert q.get(zombie_task).result == "live"


def test_a_result_that_is_not_json_writes_nothing(store: Store) -> None:
    q = store.queue()
    q.enqueue_many(Q, ["a", "b"])
    a, b = q.claim(Q, 2, lease_for=LIVE)
    with pytest.raises(al.NotJSON):
        q.complete_many([(a.lease, "ok"), (b.lease, {1, 2})])  # type: ignore[list-item]
    assert q.stats(Q).counts == {"leased": 2}


async def test_async_face(store: Store) -> None:
    q = store.aqueue()
    try:
        await q.enqueue_many(Q, ["x", "y"])
        jobs = await q.claim(Q, 2, lease_for=LIVE)
        assert await q.complete_many([(j.lease, j.payload) for j in jobs]) == [None, None]
        assert (await q.stats(Q)).counts == {"done": 2}
    finally:
        await q.close()


def test_complete_and_claim_applies_the_completions_before_the_claim(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {"i": 0}, id="a0", partition="acct")
    q.enqueue(Q, {"i": 1}, id="a1", partition="acct")  # parked until a0 is done
    q.enqueue(Q, {"i": 2}, id="b0")
    first = q.claim(Q, 5, lease_for=LIVE)
    assert sorted(j.task_id for j in first) == ["a0", "b0"]
    terms = q.settings.terms(LIVE)
    outcomes, jobs, reaped = q.backend.complete_and_claim(
        [(j.lease, b'"done"') for j in first], Q, 5, terms
    )
    assert outcomes == [None, None]
    assert reaped == []
    # a0's completion freed its partition within the same step: the claim takes a1.
    assert [j.task_id for j in jobs] == ["a1"]
    assert all(q.get(i).result == "done" for i in ("a0", "b0"))
    assert q.get("a1").state == "leased"
    outcomes, jobs, _ = q.backend.complete_and_claim([(jobs[0].lease, None)], Q, 5, terms)
    assert (outcomes, jobs) == ([None], [])
    assert q.get("a1").state == "done"


def test_complete_and_claim_fences_each_completion_and_still_claims(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, "reaped", id="z")
    (stale,) = q.claim(Q, lease_for=0.3)
    time.sleep(0.5)
    q.enqueue(Q, "next", id="n")
    terms = q.settings.terms(LIVE)
    outcomes, jobs, reaped = q.backend.complete_and_claim([(stale.lease, b'"late"')], Q, 5, terms)
    (lost,) = outcomes
    assert isinstance(lost, al.LeaseLost)
    assert lost.task_id == "z"
    # The claim reaped the stale lease and took both tasks, the reaped one first.
    assert [j.task_id for j in jobs] == ["z", "n"]
    assert [r.task_id for r in reaped] == ["z"]
    assert q.get("z").result_json is None
    assert q.backend.complete_and_claim([], Q, 5, terms) == ([], [], [])
