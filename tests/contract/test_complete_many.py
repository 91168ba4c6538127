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
