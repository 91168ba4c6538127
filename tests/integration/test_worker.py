"""The worker: heartbeats that handlers cannot starve, cancellation on lease loss, retries,
graceful shutdown. Both faces, on memory and SQLite."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import agentlease as al
from agentlease.backends.memory import MemoryBackend


class Clock:
    """Real time plus an offset the test can jump forward (the store's clock)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def test_sync_handler_blocking_in_sleep_keeps_its_lease(sqlite_url: str) -> None:
    queue = al.Queue.connect(sqlite_url, settings=al.QueueSettings(lease_for=0.6))
    queue.enqueue("q", {"x": 1}, id="t1")

    def handler(ctx: al.JobContext) -> al.JSON:
        time.sleep(2.0)  # three leases long, without checking in
        return {"attempt": ctx.attempt}

    al.Worker(queue, "q", handler).run(burst=True, handle_signals=False)
    task = queue.get("t1")
    assert task.state == "done"
    assert task.attempt == 1
    assert task.reclaims == 0
    assert task.result == {"attempt": 1}


async def test_async_handler_blocking_the_event_loop_keeps_its_lease(sqlite_url: str) -> None:
    queue = al.AsyncQueue.connect(sqlite_url, settings=al.QueueSettings(lease_for=0.6))
    await queue.enqueue("q", None, id="t1")

    async def handler(ctx: al.AsyncJobContext) -> al.JSON:
        time.sleep(2.0)  # blocks the whole event loop
        return "ok"

    await al.AsyncWorker(queue, "q", handler).run(burst=True, handle_signals=False)
    task = await queue.get("t1")
    assert (task.state, task.attempt, task.reclaims, task.result) == ("done", 1, 0, "ok")
    await queue.close()


def _steal_after_claim(backend: MemoryBackend, clock: Clock, started: threading.Event) -> None:
    """Once the handler runs, push the store's clock past the lease and let another claimer
    reap and take the task: the worker's lease is now stale."""
    assert started.wait(5)
    clock.offset += 100.0
    thief = al.Queue(backend)
    (job,) = thief.claim("q", lease_for=60)
    assert job.attempt == 2


async def test_lost_lease_cancels_an_async_handler_and_its_writes_are_refused() -> None:
    clock = Clock()
    backend = MemoryBackend(clock=clock)
    events: list[al.Event] = []
    queue = al.AsyncQueue(
        backend.open_async(), settings=al.QueueSettings(lease_for=1.0), on_event=events.append
    )
    await queue.enqueue("q", None, id="t1")
    started = threading.Event()
    cancelled = threading.Event()

    async def handler(ctx: al.AsyncJobContext) -> al.JSON:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    thief = threading.Thread(target=_steal_after_claim, args=(backend, clock, started))
    thief.start()
    worker = al.AsyncWorker(queue, "q", handler, settings=al.WorkerSettings(heartbeat_interval=0.1))
    await asyncio.wait_for(worker.run(burst=True, handle_signals=False), 20)
    thief.join()
    assert cancelled.is_set()
    task = await queue.get("t1")
    assert (task.state, task.attempt, task.result_json) == ("leased", 2, None)
    names = [e.name for e in events]
    assert "lease_lost" in names
    assert "completed" not in names


def test_lost_lease_sets_the_sync_cancel_token_and_refuses_the_result() -> None:
    clock = Clock()
    backend = MemoryBackend(clock=clock)
    events: list[al.Event] = []
    queue = al.Queue(backend, settings=al.QueueSettings(lease_for=1.0), on_event=events.append)
    queue.enqueue("q", None, id="t1")
    started = threading.Event()
    seen: list[bool] = []

    def handler(ctx: al.JobContext) -> al.JSON:
        started.set()
        seen.append(ctx.wait(20))  # returns early once the lease is lost
        with pytest.raises(al.LeaseLost):
            ctx.check()
        return "from a zombie"

    thief = threading.Thread(target=_steal_after_claim, args=(backend, clock, started))
    thief.start()
    al.Worker(queue, "q", handler, settings=al.WorkerSettings(heartbeat_interval=0.1)).run(
        burst=True, handle_signals=False
    )
    thief.join()
    assert seen == [True]
    task = queue.get("t1")
    assert (task.state, task.attempt, task.result_json) == ("leased", 2, None)
    assert any(e.name == "zombie_rejected" and e.attempt == 1 for e in events)


def test_raised_errors_retry_with_backoff_then_dead_letter() -> None:
    queue = al.Queue(MemoryBackend())
    queue.enqueue("q", None, id="flaky")
    calls: list[int] = []

    def handler(ctx: al.JobContext) -> al.JSON:
        calls.append(ctx.attempt)
        raise RuntimeError(f"boom {ctx.attempt}")

    policy = al.RetryPolicy(max_failures=3, base=0.05, cap=0.1)
    settings = al.WorkerSettings(retry=policy, poll_interval=0.02)
    worker = al.Worker(queue, "q", handler, settings=settings)
    threading.Timer(3.0, worker.stop).start()
    worker.run(handle_signals=False)
    task = queue.get("flaky")
    assert calls == [1, 2, 3]
    assert (task.state, task.failures) == ("dead", 3)
    assert isinstance(task.error, dict)
    assert (task.error["type"], task.error["message"]) == ("RuntimeError", "boom 3")
    assert "raise RuntimeError" in task.error["traceback"]
    assert [t.id for t in queue.dead("q")] == ["flaky"]


def test_non_retryable_errors_dead_letter_at_once() -> None:
    queue = al.Queue(MemoryBackend())
    queue.enqueue("q", None, id="bad")

    def handler(ctx: al.JobContext) -> al.JSON:
        raise KeyError("missing")

    policy = al.RetryPolicy(max_failures=5, non_retryable=(KeyError,))
    al.Worker(queue, "q", handler, settings=al.WorkerSettings(retry=policy)).run(
        burst=True, handle_signals=False
    )
    task = queue.get("bad")
    assert (task.state, task.failures, task.attempt) == ("dead", 1, 1)


def test_a_result_that_is_not_json_dead_letters_with_a_clear_error() -> None:
    queue = al.Queue(MemoryBackend())
    queue.enqueue("q", None, id="t")
    al.Worker(queue, "q", lambda ctx: {1, 2}).run(burst=True, handle_signals=False)  # type: ignore[arg-type,return-value]
    task = queue.get("t")
    assert task.state == "dead"
    assert isinstance(task.error, dict)
    assert task.error["type"] == "NotJSON"


def test_stop_lets_running_handlers_finish_within_grace() -> None:
    queue = al.Queue(MemoryBackend())
    queue.enqueue_many("q", [{"i": i} for i in range(3)])
    worker: al.Worker
    started = threading.Barrier(4)

    def handler(ctx: al.JobContext) -> al.JSON:
        started.wait(60)  # generous: a loaded machine may start threads slowly
        time.sleep(0.3)
        return "finished"

    worker = al.Worker(queue, "q", handler, settings=al.WorkerSettings(concurrency=3))

    def stop_when_all_started() -> None:
        try:
            started.wait(60)
        finally:  # a broken barrier fails the test below, never hangs it
            worker.stop()

    threading.Thread(target=stop_when_all_started).start()
    assert worker.run(handle_signals=False) == 3
    assert queue.stats("q").counts == {"done": 3}


def test_stop_past_grace_cancels_and_releases_to_the_front() -> None:
    queue = al.Queue(MemoryBackend())
    queue.enqueue("q", None, id="long")
    queue.enqueue("q", None, id="next")
    started = threading.Event()

    async def handler(ctx: al.AsyncJobContext) -> al.JSON:
        started.set()
        await asyncio.sleep(30)
        return "never"

    worker = al.Worker(
        queue, "q", handler, settings=al.WorkerSettings(concurrency=1, shutdown_grace=0.2)
    )

    def stop() -> None:
        started.wait(5)
        worker.stop()

    threading.Thread(target=stop).start()
    worker.run(handle_signals=False)
    long = queue.get("long")
    assert (long.state, long.attempt, long.failures, long.reclaims) == ("queued", 1, 0, 0)
    (job,) = queue.claim("q")
    assert job.task_id == "long", "released to the front, ahead of the older queued task"


class StopOnClaim(MemoryBackend):
    """A store whose claim returns while the worker is being stopped."""

    worker: al.Worker | None = None

    def claim(self, queue: str, n: int, terms: al._records.LeaseTerms):  # type: ignore[override]
        result = super().claim(queue, n, terms)
        if result[0] and self.worker is not None:
            self.worker.stop()
        return result


def test_tasks_claimed_as_shutdown_begins_are_released_unstarted_to_the_front() -> None:
    backend = StopOnClaim()
    queue = al.Queue(backend)
    queue.enqueue_many("q", [{"i": i} for i in range(4)])
    ran: list[int] = []
    worker = al.Worker(
        queue,
        "q",
        lambda ctx: ran.append(1),
        settings=al.WorkerSettings(concurrency=4),  # type: ignore[arg-type,return-value,func-returns-value]
    )
    backend.worker = worker
    worker.run(handle_signals=False)
    assert ran == []
    stats = queue.stats("q")
    assert stats.counts == {"queued": 4}
    jobs = queue.claim("q", 4)
    assert all(j.attempt == 2 for j in jobs)


WORKER_SCRIPT = """
import sys, time
import agentlease as al
q = al.Queue.connect(sys.argv[1])
def handler(ctx):
    print("started", flush=True)
    time.sleep(1.0)
    return "done after SIGTERM"
al.Worker(q, "q", handler, settings=al.WorkerSettings(shutdown_grace=10)).run()
print("exited", flush=True)
"""


def test_sigterm_finishes_the_running_handler_then_exits_cleanly(
    sqlite_url: str, tmp_path: Path
) -> None:
    queue = al.Queue.connect(sqlite_url)
    queue.enqueue("q", None, id="t")
    queue.enqueue("q", None, id="untouched")
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), sqlite_url], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert "exited" in out
    assert queue.get("t").result == "done after SIGTERM"
    assert queue.get("untouched").state == "queued"
    queue.close()
