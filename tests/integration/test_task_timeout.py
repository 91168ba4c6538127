"""Time limits per attempt: the handler is stopped, the attempt fails with TaskTimeout and the
retry policy decides; a sync handler that ignores its cancel token keeps its lease until it
returns, so no retry runs beside it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import agentlease as al
from agentlease.backends.memory import MemoryBackend

FAST_RETRY = al.RetryPolicy(max_failures=2, base=0.01, cap=0.01)


def _work(queue: al.Queue, handler: object, settings: al.WorkerSettings, task_id: str) -> None:
    """Run the worker until ``task_id`` is done or dead (bounded)."""
    worker = al.Worker(queue, "q", handler, settings=settings)  # type: ignore[arg-type]

    def stop_when_over() -> None:
        for _ in range(500):
            if queue.get(task_id).state in ("done", "dead"):
                break
            time.sleep(0.02)
        worker.stop()

    threading.Thread(target=stop_when_over, daemon=True).start()
    worker.run(handle_signals=False)


def test_an_async_handler_past_the_tasks_limit_is_cancelled_and_retried() -> None:
    queue = al.Queue(MemoryBackend())
    queue.enqueue("q", None, id="slow", timeout=0.2)
    calls: list[int] = []
    cancelled: list[int] = []

    async def handler(ctx: al.AsyncJobContext) -> al.JSON:
        calls.append(ctx.attempt)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(ctx.attempt)
            raise
        return "never"

    settings = al.WorkerSettings(retry=FAST_RETRY, poll_interval=0.02)
    _work(queue, handler, settings, "slow")
    task = queue.get("slow")
    assert calls == [1, 2]  # retried once, per the policy
    assert cancelled == [1, 2]
    assert task.state == "dead"
    assert isinstance(task.error, dict)
    assert task.error["type"] == "TaskTimeout"
    assert "time limit of 0.2 s" in task.error["message"]
    queue.close()


def test_the_workers_limit_applies_and_a_tasks_own_limit_comes_first() -> None:
    queue = al.Queue(MemoryBackend())
    queue.enqueue("q", "short", id="default")
    queue.enqueue("q", "long", id="own", timeout=5.0)

    async def handler(ctx: al.AsyncJobContext) -> al.JSON:
        await asyncio.sleep(0.4)
        return "finished"

    settings = al.WorkerSettings(
        retry=al.RetryPolicy(max_failures=1), poll_interval=0.02, task_timeout=0.1, concurrency=2
    )
    _work(queue, handler, settings, "own")
    for _ in range(100):
        if queue.get("default").state == "dead":
            break
        time.sleep(0.02)
    assert queue.get("own").state == "done"
    assert queue.get("own").result == "finished"
    default = queue.get("default")
    assert default.state == "dead"
    assert isinstance(default.error, dict)
    assert default.error["type"] == "TaskTimeout"
    queue.close()


def test_a_sync_handler_sees_its_limit_and_its_late_result_is_not_accepted() -> None:
    queue = al.Queue(MemoryBackend())
    queue.enqueue("q", None, id="t", timeout=0.2)
    seen: list[tuple[bool, bool]] = []

    def handler(ctx: al.JobContext) -> al.JSON:
        before = ctx.cancelled
        ctx.wait(10)  # wakes at the limit
        seen.append((before, ctx.timed_out))
        with pytest.raises(al.TaskTimeout):
            ctx.check()
        return "too late"

    settings = al.WorkerSettings(retry=al.RetryPolicy(max_failures=1), poll_interval=0.02)
    _work(queue, handler, settings, "t")
    assert seen == [(False, True)]
    task = queue.get("t")
    assert task.state == "dead"
    assert task.result is None
    assert isinstance(task.error, dict)
    assert task.error["type"] == "TaskTimeout"
    queue.close()


def test_a_sync_handler_that_ignores_its_limit_keeps_its_lease_so_no_retry_runs_beside_it() -> None:
    queue = al.Queue(MemoryBackend(), settings=al.QueueSettings(lease_for=0.3))
    queue.enqueue("q", None, id="stubborn", timeout=0.1)
    spans: list[tuple[int, float, float]] = []

    def handler(ctx: al.JobContext) -> al.JSON:
        start = time.monotonic()
        time.sleep(0.8)  # ignores the limit, well past the lease: the heartbeat keeps it
        spans.append((ctx.attempt, start, time.monotonic()))
        return None

    settings = al.WorkerSettings(retry=FAST_RETRY, poll_interval=0.02, concurrency=2)
    _work(queue, handler, settings, "stubborn")
    assert [a for a, _, _ in spans] == [1, 2]
    (_, _, first_end), (_, second_start, _) = spans
    assert second_start >= first_end  # the retry started only after the first attempt ended
    task = queue.get("stubborn")
    assert (task.state, task.reclaims) == ("dead", 0)  # never reaped: the lease was kept
    queue.close()


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "1"])
def test_a_bad_limit_is_refused(bad: object) -> None:
    queue = al.Queue(MemoryBackend())
    with pytest.raises(al.InvalidInput):
        queue.enqueue("q", None, timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(al.InvalidInput):
        al.WorkerSettings(task_timeout=bad)  # type: ignore[arg-type]
    assert queue.queues() == []
    queue.close()
