"""Cancelling tasks and deleting queues, on every backend of the ``store`` fixture (both faces).

A waiting task is cancelled at once and frees its partition; a leased one is flagged, its
holder's writes are refused with TaskCancelled, and its next heartbeat (extend) or the reaper
ends it cancelled, never requeued. A task that has ended stays as it is.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import agentlease as al
from agentlease import (
    InvalidInput,
    InvalidName,
    QueueInUse,
    TaskCancelled,
    TaskSpec,
    UnknownQueue,
    UnknownTask,
)
from tests.conftest import Store

Q = "jobs"
LIVE = 30.0
SHORT = 0.3
PAST = 0.5


def cancelled_with(q: al.Queue, task_id: str, reason: str) -> al.Task:
    task = q.get(task_id)
    assert task.state == "cancelled"
    assert task.cancel_reason == reason
    assert task.finished_at is not None
    assert isinstance(task.error, dict)
    assert task.error["type"] == "TaskCancelled"
    assert task.error["reason"] == reason
    return task


def test_each_waiting_state_is_cancelled_at_once(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {}, id="failing")
    (failing,) = q.claim(Q, lease_for=LIVE)
    q.fail(failing.lease, ValueError("later"), retry_in=LIVE)
    q.enqueue(Q, {}, id="busy", partition="p")
    q.enqueue(Q, {}, id="parked", partition="p")
    (busy,) = q.claim(Q, lease_for=LIVE)
    assert busy.task_id == "busy"
    q.enqueue(Q, {}, id="queued")
    q.enqueue(Q, {}, id="scheduled", delay=LIVE)
    for task_id, before in [
        ("queued", "queued"),
        ("scheduled", "scheduled"),
        ("failing", "failed"),
        ("parked", "parked"),
    ]:
        assert q.get(task_id).state == before
        reason = f"no longer needed: {task_id}"
        assert q.cancel(task_id, reason) == al.Cancellation(
            task_id, "cancelled", "cancelled", reason
        )
        cancelled_with(q, task_id, reason)
    stats = q.stats(Q)
    assert stats.counts.get("cancelled") == 4
    assert stats.counts.get("leased") == 1
    assert stats.depth == 0
    assert q.claim(Q, n=10, lease_for=LIVE) == []  # nothing cancelled is ever claimed
    q.complete(busy.lease, None)
    assert q.get("parked").state == "cancelled"  # a cancelled parked task stays cancelled


def test_a_cancelled_queued_task_is_never_claimed(store: Store) -> None:
    q = store.queue()
    q.enqueue_many(Q, [TaskSpec(id="a"), TaskSpec(id="b", priority=5)])
    assert q.cancel("b", "wrong input").outcome == "cancelled"
    (job,) = q.claim(Q, n=5, lease_for=LIVE)
    assert job.task_id == "a"
    stats = q.stats(Q)
    assert stats.counts.get("cancelled") == 1
    assert stats.counts.get("leased") == 1
    assert stats.depth == 0


def test_a_leased_task_is_flagged_and_its_holders_writes_are_refused(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {}, id="t")
    (job,) = q.claim(Q, lease_for=LIVE)
    done = q.cancel("t", "user pressed stop")
    assert done == al.Cancellation("t", "requested", "leased", "user pressed stop")
    task = q.get("t")
    assert task.state == "leased"
    assert task.cancel_requested
    assert task.cancel_reason == "user pressed stop"
    # Asked again: nothing changes, the first reason stays.
    assert q.cancel("t", "again").reason == "user pressed stop"
    for write in (
        lambda: q.complete(job.lease, "result"),
        lambda: q.fail(job.lease, ValueError("x"), retry_in=1.0),
        lambda: q.progress(job.lease, {"step": 1}, checkpoint={"at": 1}),
        lambda: q.release(job.lease),
    ):
        with pytest.raises(TaskCancelled) as refused:
            write()
        assert refused.value.reason == "user pressed stop"
        assert refused.value.task_id == "t"
        assert isinstance(refused.value, al.LeaseLost)
    assert q.get("t").state == "leased"  # refused writes changed nothing
    assert q.get("t").checkpoint is None
    # The heartbeat: not renewed, and the task ends cancelled.
    assert q.extend([job.lease]) == [None]
    cancelled_with(q, "t", "user pressed stop")
    with pytest.raises(TaskCancelled):
        q.complete(job.lease, "late")
    assert q.extend([job.lease]) == [None]
    assert q.cancel("t", "once more").outcome == "finished"
    assert isinstance(q.complete_many([(job.lease, None)])[0], TaskCancelled)


def test_cancelling_the_running_task_of_a_partition_frees_it(store: Store) -> None:
    q = store.queue()
    q.enqueue_many(Q, [TaskSpec(id=f"p{i}", partition="acct") for i in range(3)])
    (p0,) = q.claim(Q, n=5, lease_for=LIVE)
    assert q.cancel("p1", "skip").outcome == "cancelled"  # parked: cancelled at once
    assert q.get("p2").state == "parked"  # p0 still runs: the partition stays busy
    assert q.cancel("p0", "stop").outcome == "requested"
    assert q.claim(Q, n=5, lease_for=LIVE) == []  # still busy until the holder is told
    assert q.extend([p0.lease]) == [None]
    (p2,) = q.claim(Q, n=5, lease_for=LIVE)  # freed exactly as a completion frees it
    assert p2.task_id == "p2"


def test_cancelling_a_queued_task_starts_its_partitions_next(store: Store) -> None:
    q = store.queue()
    q.enqueue_many(Q, [TaskSpec(id=f"c{i}", partition="doc") for i in range(2)])
    assert q.get("c1").state == "parked"
    q.cancel("c0", "superseded")
    assert q.get("c1").state == "queued"
    (job,) = q.claim(Q, n=5, lease_for=LIVE)
    assert job.task_id == "c1"


def test_the_reaper_ends_a_flagged_task_whose_holder_vanished_as_cancelled(store: Store) -> None:
    q = store.queue(al.QueueSettings(max_reclaims=5))
    q.enqueue(Q, {}, id="orphan", partition="p")
    q.enqueue(Q, {}, id="next", partition="p")
    (job,) = q.claim(Q, lease_for=SHORT)
    assert q.cancel("orphan", "holder went away").outcome == "requested"
    time.sleep(PAST)  # the holder never beats again
    reaped = q.reap(Q)
    assert [(r.task_id, r.outcome) for r in reaped] == [("orphan", "cancelled")]
    task = cancelled_with(q, "orphan", "holder went away")
    assert task.reclaims == 0  # not a reclaim: never requeued
    (nxt,) = q.claim(Q, n=5, lease_for=LIVE)
    assert nxt.task_id == "next"
    with pytest.raises(TaskCancelled):
        q.complete(job.lease, None)


def test_a_claim_reaps_a_flagged_expired_lease_as_cancelled(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {}, id="x")
    q.claim(Q, lease_for=SHORT)
    q.cancel("x", "stop")
    time.sleep(PAST)
    assert q.claim(Q, n=5, lease_for=LIVE) == []
    cancelled_with(q, "x", "stop")


def test_a_lease_that_ran_out_is_cancelled_at_once(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {}, id="late")
    q.claim(Q, lease_for=SHORT)
    time.sleep(PAST)
    assert q.cancel("late", "too slow").outcome == "cancelled"
    cancelled_with(q, "late", "too slow")


def test_cancelling_a_finished_task_changes_nothing(store: Store) -> None:
    q = store.queue()
    q.enqueue_many(Q, [TaskSpec(id="ok"), TaskSpec(id="bad"), TaskSpec(id="gone")])
    jobs = {j.task_id: j for j in q.claim(Q, n=3, lease_for=LIVE)}
    q.complete(jobs["ok"].lease, {"answer": 42})
    q.fail(jobs["bad"].lease, ValueError("no"), retry_in=None)
    q.complete(jobs["gone"].lease, None)
    assert q.cancel("ok", "too late") == al.Cancellation("ok", "finished", "done", None)
    assert q.get("ok").result == {"answer": 42}
    assert q.cancel("bad", "too late") == al.Cancellation("bad", "finished", "dead", None)
    assert q.get("bad").error["type"] == "ValueError"  # type: ignore[index]
    q.enqueue(Q, {}, id="twice")
    q.cancel("twice", "first")
    assert q.cancel("twice", "second") == al.Cancellation("twice", "finished", "cancelled", "first")
    cancelled_with(q, "twice", "first")


def test_unknown_task_and_bad_input_change_nothing(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {}, id="t")
    with pytest.raises(UnknownTask):
        q.cancel("nope", "why")
    with pytest.raises(InvalidName):
        q.cancel("", "why")
    with pytest.raises(InvalidName):
        q.cancel(42, "why")  # type: ignore[arg-type]
    for bad in ["", "   ", "x" * 1001, "two\nlines", "nul\x00", "lone \ud800", None, 3]:
        with pytest.raises(InvalidInput):
            q.cancel("t", bad)  # type: ignore[arg-type]
    assert q.get("t").state == "queued"
    assert q.get("t").cancel_reason is None
    assert q.cancel("t", "x" * 1000).outcome == "cancelled"


async def test_the_async_face_cancels_too(store: Store) -> None:
    q = store.aqueue()
    try:
        await q.enqueue(Q, {}, id="a")
        await q.enqueue(Q, {}, id="b")
        assert (await q.cancel("a", "async stop")).outcome == "cancelled"
        (job,) = await q.claim(Q, lease_for=LIVE)
        assert (await q.cancel("b", "async stop")).outcome == "requested"
        with pytest.raises(TaskCancelled):
            await q.progress(job.lease, 1)
        assert await q.extend([job.lease]) == [None]
        assert (await q.get("b")).state == "cancelled"
        with pytest.raises(UnknownTask):
            await q.cancel("c", "x")
    finally:
        await q.close()


def _until(q: al.Queue, task_id: str, states: tuple[str, ...]) -> al.Task:
    for _ in range(500):
        task = q.get(task_id)
        if task.state in states:
            return task
        time.sleep(0.02)
    raise AssertionError(f"{task_id} stayed {q.get(task_id).state}")


def _run_worker(q: al.Queue, handler: object, started: threading.Event, task_id: str) -> None:
    settings = al.WorkerSettings(heartbeat_interval=0.1, poll_interval=0.05)
    worker = al.Worker(q, Q, handler, settings=settings)  # type: ignore[arg-type]

    def cancel_then_stop() -> None:
        assert started.wait(10)
        q.cancel(task_id, "operator said stop")
        _until(q, task_id, ("cancelled",))
        time.sleep(0.3)  # the handler unwinds
        worker.stop()

    threading.Thread(target=cancel_then_stop, daemon=True).start()
    worker.run(handle_signals=False)


def test_a_worker_cancels_an_async_handler_at_its_next_heartbeat(store: Store) -> None:
    q = store.queue(al.QueueSettings(lease_for=3.0))
    q.enqueue(Q, {}, id="long")
    started = threading.Event()
    seen: list[str] = []

    async def handler(ctx: al.AsyncJobContext) -> al.JSON:
        started.set()
        try:
            await asyncio.sleep(20)
        except asyncio.CancelledError:
            seen.append("cancelled")
            with pytest.raises(TaskCancelled) as refused:
                ctx.check()
            seen.append(refused.value.reason)
            raise
        return "never"

    _run_worker(q, handler, started, "long")
    assert seen == ["cancelled", "operator said stop"]
    task = cancelled_with(q, "long", "operator said stop")
    assert task.result is None


def test_a_worker_tells_a_sync_handler_through_its_context(store: Store) -> None:
    q = store.queue(al.QueueSettings(lease_for=3.0))
    q.enqueue(Q, {}, id="sync")
    started = threading.Event()
    seen: list[object] = []

    def handler(ctx: al.JobContext) -> al.JSON:
        ctx.progress({"step": 0})
        started.set()
        ctx.wait(20)  # woken by the heartbeat that finds the task cancelled
        seen.append(ctx.cancelled)
        try:
            ctx.check()
        except TaskCancelled as exc:
            seen.append(exc.reason)
        with pytest.raises(TaskCancelled):
            q.progress(ctx.lease, {"late": True})  # the store refuses the attempt's writes
        return "ignored"

    _run_worker(q, handler, started, "sync")
    assert seen == [True, "operator said stop"]
    task = cancelled_with(q, "sync", "operator said stop")
    assert task.result is None


def _run_until_cancelled(q: al.Queue, handler: object, task_id: str) -> None:
    """Run a worker whose heartbeat comes too late to matter (a long lease, a long interval):
    the handler meets the cancellation itself, and the task must still end cancelled now."""
    settings = al.WorkerSettings(heartbeat_interval=20.0, poll_interval=0.05)
    worker = al.Worker(q, Q, handler, settings=settings)  # type: ignore[arg-type]

    def stop_when_cancelled() -> None:
        _until(q, task_id, ("cancelled",))
        worker.stop()

    threading.Thread(target=stop_when_cancelled, daemon=True).start()
    worker.run(handle_signals=False)


def test_a_handler_refused_by_the_store_ends_its_task_cancelled_at_once(store: Store) -> None:
    q = store.queue(al.QueueSettings(lease_for=60.0))
    q.enqueue(Q, {}, id="writes")
    raised: list[str] = []

    def handler(ctx: al.JobContext) -> al.JSON:
        q.cancel(ctx.task_id, "stop writing")
        try:
            ctx.progress({"step": 1})  # refused: the task was cancelled
        except TaskCancelled as exc:
            raised.append(exc.reason)
            raise
        return "never"

    _run_until_cancelled(q, handler, "writes")
    assert raised == ["stop writing"]
    task = cancelled_with(q, "writes", "stop writing")
    assert task.progress is None


def test_a_result_returned_after_a_cancel_is_refused_and_the_task_ends(store: Store) -> None:
    q = store.queue(al.QueueSettings(lease_for=60.0))
    q.enqueue(Q, {}, id="returns")

    async def handler(ctx: al.AsyncJobContext) -> al.JSON:
        await asyncio.to_thread(q.cancel, ctx.task_id, "too late")
        return {"answer": 42}  # the completion is refused

    _run_until_cancelled(q, handler, "returns")
    task = cancelled_with(q, "returns", "too late")
    assert task.result is None


# -- deleting a queue ------------------------------------------------------------------------


def test_delete_queue_removes_every_task_and_the_queue_in_batches(store: Store) -> None:
    q = store.queue()
    q.enqueue_many(Q, [TaskSpec(id=f"t{i}", partition="p" if i < 3 else None) for i in range(7)])
    q.enqueue(Q, {}, id="later", delay=LIVE, dedup_key="d1")
    q.enqueue("other", {}, id="kept")
    jobs = q.claim(Q, n=2, lease_for=LIVE)
    q.complete(jobs[0].lease, None)
    q.fail(jobs[1].lease, ValueError("x"), retry_in=None)
    q.cancel("t5", "no")
    assert q.delete_queue(Q, batch=3) == 8
    assert q.queues() == ["other"]
    for i in range(7):
        with pytest.raises(UnknownTask):
            q.get(f"t{i}")
    with pytest.raises(UnknownQueue):
        q.stats(Q)
    with pytest.raises(UnknownQueue):
        q.delete_queue(Q)
    assert q.get("kept").state == "queued"
    # The name can be used again, from scratch (the dedup key too).
    assert q.enqueue(Q, {}, id="t0", dedup_key="d1").created
    (again,) = q.claim(Q, lease_for=LIVE)
    assert again.task_id == "t0"


def test_delete_queue_refuses_leased_tasks_unless_forced(store: Store) -> None:
    q = store.queue()
    q.enqueue_many(Q, [TaskSpec(id=f"t{i}") for i in range(3)])
    (job,) = q.claim(Q, lease_for=LIVE)
    with pytest.raises(QueueInUse) as refused:
        q.delete_queue(Q)
    assert refused.value.leased == 1
    assert q.stats(Q).counts.get("queued") == 2  # nothing deleted
    assert q.delete_queue(Q, force=True) == 3
    assert Q not in q.queues()
    with pytest.raises((UnknownTask, al.LeaseLost)):
        q.complete(job.lease, "late")  # the holder is fenced off
    assert q.extend([job.lease]) == [None]


def test_delete_queue_bad_input_changes_nothing(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {}, id="t")
    with pytest.raises(InvalidName):
        q.delete_queue("")
    for bad in [0, -1, 10_001, "3", True]:
        with pytest.raises(InvalidInput):
            q.delete_queue(Q, batch=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        q.delete_queue(Q, force="yes")  # type: ignore[arg-type]
    assert q.get("t").state == "queued"


async def test_the_async_face_deletes_queues(store: Store) -> None:
    q = store.aqueue()
    try:
        await q.enqueue_many(Q, [TaskSpec(id=f"a{i}") for i in range(5)])
        assert await q.delete_queue(Q, batch=2) == 5
        assert Q not in await q.queues()
    finally:
        await q.close()


def test_the_harness_completions_checker_accepts_a_store_cancellation(store: Store) -> None:
    """What the harness records for a task the store cancelled (its settle step reads the
    stored error's reason) ends that task for the ``completions`` checker."""
    from agentlease.harness.checkers import completions
    from agentlease.harness.history import History

    q = store.queue()
    q.enqueue(Q, {}, id="h1")
    q.cancel("h1", "the user changed their mind")
    stored = q.get("h1")
    assert isinstance(stored.error, dict)
    h = History()
    h.invoke("client", "enqueue", task="h1").ok()
    h.world("cancel", task="h1", reason=stored.error.get("reason") or "")
    assert completions(h.ops) == []
    assert q.claim(Q) == []  # and it never runs again
