"""The worker: claims tasks, runs handlers, heartbeats, cancels on lease loss, shuts down cleanly.

One implementation, two faces. :class:`AsyncWorker` is the engine and runs on an event loop;
:class:`Worker` runs that same engine for synchronous code. Async handlers run as tasks on the
loop; sync handlers run in a thread pool with the caller's context copied. Leases are kept alive
by :class:`~agentlease._heartbeat.Heartbeat`, a thread with its own connection that no handler can
starve. When a lease is lost the worker cancels the handler (asyncio cancellation, or the
``cancelled`` token a sync handler checks) and refuses its writes.

Shutdown (``stop()``, SIGTERM or SIGINT) stops claiming, lets running handlers finish within the
grace period, then cancels what is left and releases those leases to the front. A second signal
skips the rest of the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import random
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeAlias, cast

from agentlease import _validate as check
from agentlease._async.queue import AsyncQueue
from agentlease._codec import JSON
from agentlease._context import AsyncJobContext, JobContext
from agentlease._events import logger
from agentlease._heartbeat import Heartbeat, Held
from agentlease._policy.retry import RetryPolicy
from agentlease._records import Job, Lease
from agentlease._scope import enter_task
from agentlease._sync.queue import Queue
from agentlease.errors import (
    AgentLeaseError,
    BackendError,
    BackendUnavailable,
    Cancelled,
    LeaseLost,
    PayloadError,
)

__all__ = ["AsyncHandler", "AsyncWorker", "Handler", "SyncHandler", "Worker", "WorkerSettings"]

SyncHandler: TypeAlias = Callable[[JobContext], JSON]
AsyncHandler: TypeAlias = Callable[[AsyncJobContext], Awaitable[JSON]]
Handler: TypeAlias = SyncHandler | AsyncHandler


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    """How a worker runs.

    Attributes:
        concurrency: handlers running at once.
        batch: claim up to all free slots in one step (``False``: one task per claim).
        retry: what happens when a handler raises.
        poll_interval: the longest idle wait between claims on an empty queue (seconds).
        shutdown_grace: seconds running handlers get to finish after a stop.
        heartbeat_interval: seconds between heartbeats (default: a third of the lease).
        seed: seeds the jitter of backoff and heartbeats (for reproducible runs).
    """

    concurrency: int = 1
    batch: bool = True
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    poll_interval: float = 0.5
    shutdown_grace: float = 30.0
    heartbeat_interval: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        check.integer(self.concurrency, "concurrency", low=1, high=10_000)
        check.duration(self.poll_interval, "poll_interval")
        check.non_negative(self.shutdown_grace, "shutdown_grace")
        check.optional_duration(self.heartbeat_interval, "heartbeat_interval")


class AsyncWorker:
    """Runs a handler on the tasks of one queue until stopped.

    Args:
        queue: the queue client (its settings give the lease terms).
        name: the queue's name.
        handler: ``def handler(ctx: JobContext) -> JSON`` or
            ``async def handler(ctx: AsyncJobContext) -> JSON``; the return value is the result.
        settings: concurrency, batching, retry policy, polling and shutdown.
    """

    def __init__(
        self,
        queue: AsyncQueue,
        name: str,
        handler: Handler,
        *,
        settings: WorkerSettings | None = None,
    ) -> None:
        if not callable(handler):
            raise TypeError(f"handler must be callable, not {type(handler).__name__}")
        self.queue = queue
        self.name = check.queue_name(name)
        self.handler = handler
        self.settings = settings or WorkerSettings()
        self.processed = 0
        is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)  # noqa: B004 - callable objects too
        )
        self._is_async = is_async
        self._async_handler = cast(AsyncHandler, handler) if is_async else None
        self._sync_handler = None if is_async else cast(SyncHandler, handler)
        self._rand = random.Random(self.settings.seed)
        self._stopping = threading.Event()
        self._forced = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._running: dict[str, tuple[asyncio.Task[None], Held]] = {}

    def stop(self, *, force: bool = False) -> None:
        """Stop claiming and shut down gracefully; ``force`` skips the rest of the grace period.

        Safe to call from any thread or a signal handler.
        """
        if self._stopping.is_set():
            force = True
        self._stopping.set()
        if force:
            self._forced.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    async def run(self, *, burst: bool = False, handle_signals: bool = True) -> int:
        """Claim and run tasks until :meth:`stop` (or SIGTERM/SIGINT).

        Args:
            burst: also stop once a claim finds nothing and no handler is running.
            handle_signals: install SIGTERM/SIGINT handlers (main thread only).

        Returns:
            How many jobs this run finished (completed, failed or lost).
        """
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        installed = self._install_signals() if handle_signals else []
        sync_backend = self.queue.backend.open_sync()
        handler_queue = Queue(
            self.queue.backend.open_sync(),
            settings=self.queue.settings,
            on_event=self.queue.events.callback,
        )
        heartbeat = Heartbeat(
            sync_backend,
            lease_for=self.queue.settings.lease_for,
            events=self.queue.events,
            interval=self.settings.heartbeat_interval,
            rand=random.Random(self._rand.random()),
        )
        pool = ThreadPoolExecutor(
            max_workers=self.settings.concurrency, thread_name_prefix="agentlease-handler"
        )
        heartbeat.start()
        try:
            await self._claim_loop(heartbeat, pool, handler_queue, burst)
            await self._drain()
        finally:
            heartbeat.stop()
            pool.shutdown(wait=False, cancel_futures=True)
            for sig in installed:
                self._loop.remove_signal_handler(sig)
            sync_backend.close()
            handler_queue.close()
        return self.processed

    def _install_signals(self) -> list[signal.Signals]:
        if threading.current_thread() is not threading.main_thread():
            return []
        assert self._loop is not None
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self.stop)
            installed.append(sig)
        return installed

    async def _claim_loop(
        self, heartbeat: Heartbeat, pool: ThreadPoolExecutor, handler_queue: Queue, burst: bool
    ) -> None:
        assert self._wake is not None
        idle = 0.0
        while not self._stopping.is_set():
            free = self.settings.concurrency - len(self._running)
            if free <= 0:
                await self._sleep(None)
                continue
            sent_at = time.monotonic()
            try:
                jobs = await self.queue.claim(self.name, free if self.settings.batch else 1)
            except AgentLeaseError:
                # The store is unavailable: back off and try again; leases keep their heartbeat.
                jobs = []
            if not jobs:
                if burst and not self._running:
                    return
                idle = min(self.settings.poll_interval, max(0.01, idle * 2))
                await self._idle(idle * self._rand.uniform(0.5, 1.0))
                continue
            idle = 0.0
            for job in jobs:
                if self._stopping.is_set():
                    await self._give_back(job)
                    continue
                held = heartbeat.add(job.lease, functools.partial(self._lost, job), sent_at)
                self.queue.events.emit(
                    "claimed",
                    job.lease.queue,
                    job.task_id,
                    job.attempt,
                    reclaims=job.reclaims,
                    failures=job.failures,
                    leased_at=job.lease.leased_at,
                    expires_at=job.lease.expires_at,
                )
                task = asyncio.create_task(
                    self._run_job(job, held, heartbeat, pool, handler_queue),
                    name=f"agentlease-job-{job.task_id}",
                )
                self._running[job.task_id] = (task, held)

    async def _sleep(self, seconds: float | None) -> None:
        """Wait for a slot to free, a stop, or ``seconds``."""
        assert self._wake is not None
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _idle(self, seconds: float) -> None:
        """Wait for a notification of new work (where the store has them), a stop, or
        ``seconds``, whichever comes first."""
        assert self._wake is not None
        self._wake.clear()
        waits = [
            asyncio.ensure_future(self._wake.wait()),
            asyncio.ensure_future(self.queue.backend.wait_for_work(self.name, seconds)),
        ]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _give_back(self, job: Job) -> None:
        # If this fails the lease expires on its own and the reaper requeues it to the front.
        with contextlib.suppress(AgentLeaseError):
            await self.queue.release(job.lease, front=True)

    async def _drain(self) -> None:
        """Let running handlers finish within the grace period, then cancel and release."""
        deadline = time.monotonic() + self.settings.shutdown_grace
        while self._running and not self._forced.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await self._sleep(left)
        self._forced.set()
        for task, _ in list(self._running.values()):
            task.cancel()
        if self._running:
            await asyncio.wait([t for t, _ in self._running.values()], timeout=5.0)

    def _lost(self, job: Job, reason: str) -> None:
        """Called on the heartbeat thread when a lease is lost: cancel the handler."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        entry = self._running.get(job.task_id)
        if entry is not None and self._is_async:
            loop.call_soon_threadsafe(entry[0].cancel)

    async def _run_job(
        self,
        job: Job,
        held: Held,
        heartbeat: Heartbeat,
        pool: ThreadPoolExecutor,
        handler_queue: Queue,
    ) -> None:
        queue = self.queue
        lease = job.lease
        # Idempotent actions inside the handler are keyed on this task (each job runs in a task
        # of its own, so this context is the job's; a sync handler gets a copy of it).
        enter_task(job.task_id, lease.attempt)
        try:
            try:
                if self._async_handler is not None:
                    ctx_a = AsyncJobContext(job, held, self._forced, queue)
                    result = await self._async_handler(ctx_a)
                else:
                    assert self._sync_handler is not None
                    ctx_s = JobContext(job, held, self._forced, handler_queue)
                    context = contextvars.copy_context()
                    future = asyncio.get_running_loop().run_in_executor(
                        pool, functools.partial(context.run, self._sync_handler, ctx_s)
                    )
                    result = await future
            except (asyncio.CancelledError, Cancelled):
                if held.lost.is_set():
                    return  # the heartbeat said so; nothing more may be written
                await self._give_back(job)  # shutdown past grace: the task runs again first
                return
            except LeaseLost:
                return  # a fenced write inside the handler was refused: the lease is gone
            except Exception as exc:
                if held.lost.is_set():
                    self._refuse(job, "fail")
                    return
                retry_in = self.settings.retry.retry_in(job.failures, exc, self._rand)
                await self._settle(
                    held, functools.partial(queue.fail, held.lease, exc, retry_in=retry_in)
                )
                return
            if held.lost.is_set():
                self._refuse(job, "complete")
                return
            try:
                accepted = await self._settle(
                    held, functools.partial(queue.complete, held.lease, result)
                )
            except PayloadError as exc:
                # The handler returned something that cannot be stored: that never gets better.
                await self._settle(
                    held, functools.partial(queue.fail, held.lease, exc, retry_in=None)
                )
                return
            if not accepted:
                return
            queue.events.emit(
                "completed",
                lease.queue,
                lease.task_id,
                lease.attempt,
                lease_age=time.monotonic() - held.ok_at,
            )
        finally:
            heartbeat.remove(held)
            self._running.pop(job.task_id, None)
            self.processed += 1
            if self._wake is not None:
                self._wake.set()

    async def _settle(self, held: Held, write: Callable[[], Awaitable[object]]) -> bool:
        """Send a job's final write (complete or fail) and say whether the store accepted it.

        While the store is unavailable and the lease is still held, the write is retried with
        jittered backoff, so an outage shorter than the lease does not make the task run again.
        A retry refused with LeaseLost may follow a first try that was applied but whose reply
        was lost; the task's record tells which.
        """
        delay, retried = 0.05, False
        while True:
            try:
                await write()
                return True
            except LeaseLost:
                return retried and await self._applied(held.lease)
            except BackendUnavailable as exc:
                if held.lost.is_set() or self._forced.is_set():
                    logger.warning("giving up a write for %s: %s", held.lease.task_id, exc)
                    return False
                retried = True
                await asyncio.sleep(delay * self._rand.uniform(0.5, 1.0))
                delay = min(1.0, delay * 2)
            except BackendError as exc:
                logger.error("write for %s failed: %s", held.lease.task_id, exc)
                return False

    async def _applied(self, lease: Lease) -> bool:
        """Whether the store shows this lease's own final write (no later claim happened)."""
        try:
            task = await self.queue.get(lease.task_id)
        except AgentLeaseError:
            return False
        return task.attempt == lease.attempt and task.state in ("done", "failed", "dead")

    def _refuse(self, job: Job, write: str) -> None:
        lease = job.lease
        self.queue.events.emit(
            "zombie_rejected",
            lease.queue,
            lease.task_id,
            lease.attempt,
            write=write,
            source="worker",
            reason="lease lost before the write",
        )


class Worker:
    """The synchronous face of :class:`AsyncWorker`: the same engine, run to completion.

    Args:
        queue: the queue client.
        name: the queue's name.
        handler: a sync (or async) handler, as for :class:`AsyncWorker`.
        settings: as for :class:`AsyncWorker`.
    """

    def __init__(
        self,
        queue: Queue,
        name: str,
        handler: Handler,
        *,
        settings: WorkerSettings | None = None,
    ) -> None:
        self._engine = AsyncWorker(
            AsyncQueue(
                queue.backend.open_async(),
                settings=queue.settings,
                on_event=queue.events.callback,
            ),
            name,
            handler,
            settings=settings,
        )

    @property
    def processed(self) -> int:
        """Jobs finished so far."""
        return self._engine.processed

    def stop(self, *, force: bool = False) -> None:
        """Stop claiming and shut down gracefully (safe from any thread or a signal handler)."""
        self._engine.stop(force=force)

    def run(self, *, burst: bool = False, handle_signals: bool = True) -> int:
        """Claim and run tasks until stopped; see :meth:`AsyncWorker.run`."""

        async def main() -> int:
            try:
                return await self._engine.run(burst=burst, handle_signals=handle_signals)
            finally:
                await self._engine.queue.close()

        return asyncio.run(main())
