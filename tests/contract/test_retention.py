"""Retention on every backend: ``purge`` deletes the oldest done (or dead) tasks of one queue
past an age, in bounded atomic steps, and frees their ids and dedup keys; nothing else moves.
The retention settings refuse values under their floor with a typed error."""

from __future__ import annotations

import time

import pytest

import agentlease as al
from agentlease.errors import InvalidDuration, InvalidInput, RetentionTooShort, UnknownTask
from tests.conftest import Store

Q = "retained"
LIVE = 30.0
GAP = 0.3


def finish(q: al.Queue, n: int, *, dedup: str | None = None) -> list[str]:
    """Enqueue, claim and complete ``n`` tasks; their ids, in the order they finished."""
    ids = []
    for i in range(n):
        key = None if dedup is None else f"{dedup}-{i}"
        q.enqueue(Q, {"i": i}, dedup_key=key)
        (job,) = q.claim(Q, lease_for=LIVE)
        q.complete(job.lease, i)
        ids.append(job.task_id)
    return ids


def kill(q: al.Queue, n: int) -> list[str]:
    """Enqueue, claim and dead-letter ``n`` tasks."""
    ids = []
    for i in range(n):
        q.enqueue(Q, {"dead": i})
        (job,) = q.claim(Q, lease_for=LIVE)
        q.fail(job.lease, RuntimeError("boom"), retry_in=None)
        ids.append(job.task_id)
    return ids


def gone(q: al.Queue, task_id: str) -> bool:
    try:
        q.get(task_id)
    except UnknownTask:
        return True
    return False


def test_purge_deletes_the_oldest_done_tasks_in_bounded_batches(store: Store) -> None:
    q = store.queue()
    old = finish(q, 5)
    time.sleep(GAP)
    new = finish(q, 2)
    assert q.purge(Q, older_than=GAP, limit=3) == 3
    assert [gone(q, t) for t in old] == [True, True, True, False, False]
    assert q.purge(Q, older_than=GAP, limit=3) == 2
    assert q.purge(Q, older_than=GAP, limit=3) == 0  # the new ones are younger
    assert all(gone(q, t) for t in old)
    assert not any(gone(q, t) for t in new)
    assert q.stats(Q).counts.get("done") == 2


def test_purge_touches_only_its_state_and_leaves_live_tasks(store: Store) -> None:
    q = store.queue()
    done = finish(q, 2)
    dead = kill(q, 2)
    q.enqueue(Q, "queued")
    q.enqueue(Q, "leased")
    (held,) = q.claim(Q, lease_for=LIVE)
    q.enqueue(Q, "later", delay=60)
    assert q.purge(Q, state="dead", older_than=0) == 2
    assert all(gone(q, t) for t in dead)
    assert not any(gone(q, t) for t in done)
    assert q.purge(Q, older_than=0) == 2
    counts = q.stats(Q).counts
    assert counts.get("done") is None
    assert counts.get("dead") is None
    assert counts.get("leased") == 1
    assert counts.get("queued") == 1
    assert counts.get("scheduled") == 1
    q.complete(held.lease, "still fenced and accepted")
    assert q.get(held.task_id).state == "done"


def test_a_purged_task_frees_its_id_and_dedup_key(store: Store) -> None:
    q = store.queue()
    (first,) = finish(q, 1, dedup="once")
    again = q.enqueue(Q, "dup", dedup_key="once-0")
    assert not again.created
    assert again.task_id == first
    assert q.enqueue(Q, "same id", id=first).created is False
    assert q.purge(Q, older_than=0) == 1
    fresh = q.enqueue(Q, "dup", dedup_key="once-0")
    assert fresh.created
    assert fresh.task_id != first
    reused = q.enqueue(Q, "same id", id=first)
    assert reused.created
    assert q.get(first).payload == "same id"
    assert q.get(first).state == "queued"


def test_a_purged_dead_task_cannot_be_requeued_and_a_requeued_one_is_not_purged(
    store: Store,
) -> None:
    q = store.queue()
    first, second = kill(q, 2)
    assert q.requeue_dead(Q, [second]) == 1
    assert q.purge(Q, state="dead", older_than=0) == 1
    assert gone(q, first)
    assert q.get(second).state == "queued"
    assert q.requeue_dead(Q) == 0


def test_purge_of_an_unknown_queue_purges_nothing(store: Store) -> None:
    q = store.queue()
    assert q.purge("never-used", older_than=0) == 0
    assert q.purge("never-used", state="dead", older_than=0) == 0


def test_purge_default_age_is_the_queue_retention(store: Store) -> None:
    q = store.queue(al.QueueSettings(done_retention=3600, dead_retention=7200))
    finish(q, 1)
    kill(q, 1)
    assert q.purge(Q) == 0
    assert q.purge(Q, state="dead") == 0
    assert q.purge(Q, older_than=0) == 1


def test_purge_refuses_bad_input_and_changes_nothing(store: Store) -> None:
    q = store.queue()
    (task,) = finish(q, 1)
    with pytest.raises(InvalidDuration):
        q.purge(Q, older_than=-1)
    with pytest.raises(InvalidDuration):
        q.purge(Q, older_than=float("nan"))
    with pytest.raises(InvalidInput):
        q.purge(Q, older_than=0, limit=0)
    with pytest.raises(InvalidInput):
        q.purge(Q, older_than=0, limit=10_001)
    with pytest.raises(InvalidInput):
        q.purge(Q, state="queued", older_than=0)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        q.purge("bad queue", older_than=0)
    assert q.get(task).state == "done"


def test_a_zombie_write_after_purge_is_refused(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, "x")
    (job,) = q.claim(Q, lease_for=LIVE)
    q.complete(job.lease, 1)
    assert q.purge(Q, older_than=0) == 1
    with pytest.raises((UnknownTask, al.LeaseLost)):
        q.complete(job.lease, 2)
    assert gone(q, job.task_id)


def test_retention_settings_have_a_floor() -> None:
    with pytest.raises(RetentionTooShort) as info:
        al.QueueSettings(done_retention=59)
    assert info.value.floor == 60
    assert info.value.given == 59
    assert isinstance(info.value, InvalidDuration)
    with pytest.raises(RetentionTooShort) as info:
        al.QueueSettings(lease_for=600, dead_retention=300)
    assert info.value.floor == 600
    assert info.value.what == "dead_retention"
    with pytest.raises(InvalidDuration):
        al.QueueSettings(done_retention=0)
    defaults = al.QueueSettings()
    assert (defaults.done_retention, defaults.dead_retention) == (7 * 86_400, 30 * 86_400)
    with pytest.raises(InvalidDuration):
        al.WorkerSettings(purge_every=0)
    with pytest.raises(InvalidInput):
        al.WorkerSettings(purge_batch=10_001)
    assert al.WorkerSettings(purge_every=None).purge_every is None


async def test_async_purge(store: Store) -> None:
    q = store.aqueue()
    try:
        for i in range(3):
            await q.enqueue(Q, i, dedup_key=f"k{i}")
        jobs = await q.claim(Q, 3, lease_for=LIVE)
        await q.complete(jobs[0].lease, "a")
        await q.fail(jobs[1].lease, RuntimeError("x"), retry_in=None)
        assert await q.purge(Q, older_than=0, limit=10) == 1
        assert await q.purge(Q, state="dead", older_than=0, limit=10) == 1
        assert (await q.enqueue(Q, "again", dedup_key="k0")).created
        assert not (await q.enqueue(Q, "again", dedup_key="k2")).created
        counts = (await q.stats(Q)).counts
        assert counts.get("leased") == 1
        assert counts.get("queued") == 1
    finally:
        await q.close()


def test_purge_state_deletes_expired_budgets_and_breakers(store: Store) -> None:
    backend = store.queue().backend
    backend.retry_budget("short", 1, False, 0.1, 1, 0.2)
    backend.retry_budget("long", 1, False, 0.1, 1, 600)
    backend.breaker_record("short", 0, False, 5, 10, 0.2)
    time.sleep(0.4)
    purged = backend.purge_state(100)
    if store.kind.startswith("redis"):
        assert purged == 0  # Redis expired them itself
    else:
        assert purged == 2
    assert backend.purge_state(100) == 0
    assert backend.retry_budget("long", 0, True, 0.1, 1, 600).calls == 1  # the live one stays
    assert backend.retry_budget("short", 0, True, 0.1, 1, 600).calls == 0  # the expired one went


def test_cancelled_tasks_are_purged_however_they_were_cancelled(store: Store) -> None:
    """Cancelled tasks (waiting, parked, a leased one told at its heartbeat, one whose holder
    vanished) are purged like dead letters: each frees its id and dedup key, their attempts go
    with them, and stats stop counting them."""
    q = store.queue()
    q.enqueue(Q, {}, id="waiting", dedup_key="w")
    q.enqueue(Q, {}, id="busy", partition="p")
    q.enqueue(Q, {}, id="parked", partition="p")  # behind busy
    assert q.cancel("waiting", "no").outcome == "cancelled"
    assert q.cancel("parked", "no").outcome == "cancelled"
    (held,) = q.claim(Q, lease_for=LIVE, holder="w1")  # busy
    assert q.cancel("busy", "stop").outcome == "requested"
    assert q.extend([held.lease]) == [None]
    q.enqueue(Q, {}, id="gone")
    (_lost,) = q.claim(Q, lease_for=GAP, holder="w2")
    assert q.cancel("gone", "stop").outcome == "requested"
    time.sleep(GAP + 0.2)
    q.reap(Q)
    assert q.stats(Q).counts.get("cancelled") == 4
    kill(q, 1)
    assert q.purge(Q, state="cancelled", older_than=0, limit=3) == 3
    assert q.purge(Q, state="cancelled", older_than=0) == 1
    assert q.purge(Q, state="cancelled", older_than=0) == 0
    assert not q.stats(Q).counts.get("cancelled")
    assert q.stats(Q).counts.get("dead") == 1  # another state: untouched
    for task_id in ("waiting", "busy", "parked", "gone"):
        with pytest.raises(UnknownTask):
            q.get(task_id)
    again = q.enqueue(Q, {}, id="busy", dedup_key="w")  # id and dedup key are free
    assert again.created
    assert q.get("busy").attempts == ()  # no history carried over


def test_cancelled_tasks_wait_for_the_dead_letters_retention(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {}, id="c")
    q.cancel("c", "no")
    assert q.purge(Q, state="cancelled") == 0  # 30 days by default
    assert q.purge(Q, state="cancelled", older_than=0) == 1
