"""The worker: claims tasks, runs handlers, heartbeats, cancels on lease loss, shuts down cleanly.

One implementation, two faces. :class:`AsyncWorker` is the engine and runs on an event loop;
:class:`Worker` runs that same engine for synchronous code. Async handlers run as tasks on the
loop; sync handlers run in a thread pool with the caller's context copied. Leases are kept alive
by :class:`~agentlease._heartbeat.Heartbeat`, a thread with its own connection that no handler can
starve. When a lease is lost the worker cancels the handler (asyncio cancellation, or the
``cancelled`` token a sync handler checks) and refuses its writes.

Everything the worker tracks is keyed by the lease (task id and token), never by the task id
alone: after an outage longer than the lease the same worker often claims its own reaped task
back (attempt 2) while attempt 1 still unwinds; the new claim makes attempt 1 lost at once.

Batching. A claim asks for every free slot plus, while recent handlers took under 50 ms, up to
``prefetch`` tasks more; those wait (their leases kept alive by the heartbeat) and start as soon
as a slot frees. A handler's completion is queued, and one ``complete_many`` write sends all that
are queued, always before the next claim: while one write is in flight the next batch gathers,
so a SIGKILL can re-run only tasks whose handlers returned since the last write was sent or in it
(never more than the ``concurrency + prefetch`` leases the worker holds).
``batch=False`` claims one task at a time and writes each completion on its own. A sync handler
runs on a pool thread; when it returns, the loop is woken once for every handler that returned
meanwhile (:meth:`AsyncWorker._collect`), so the hot path creates no asyncio task per job.

Deadlines. A task may carry the root task it belongs to and a deadline on the store's clock
(inherited from the handler or the ``al.deadline`` block that enqueued it). A task whose deadline
is at or before its lease's ``leased_at`` never runs: it is dead-lettered at once (error reason
``deadline``) through the same fenced ``fail`` and events as any dead letter; so is a claimed-ahead
task whose deadline passes before a slot frees. Otherwise the handler runs with the task's root
and deadline in its context (:func:`agentlease._deadline.enter_work`): the deadline turned into a
point on the monotonic clock with the offset measured at the claim (``leased_at`` minus the
monotonic time the claim returned), so the rest is enforced locally and tasks the handler
enqueues inherit both. An async handler is cancelled at the deadline; a sync one sees
``ctx.cancelled`` turn true and ``ctx.check()`` / ``al.check_deadline()`` raise. A handler that
raises :class:`~agentlease.errors.DeadlineExceeded` (or is cancelled at the deadline, or returns
after it) is dead-lettered with reason ``deadline``, never retried under the RetryPolicy, and a
retry whose delay would end past the deadline is dead-lettered at once. A deadline ends the whole
tree of work; it is not a per-attempt time limit.

Time limits. An attempt may run for at most the task's ``timeout`` (given at enqueue, kept in the
task's context) or else the worker's ``task_timeout``. Past it an async handler is cancelled and a
sync one sees ``ctx.cancelled`` / ``ctx.check()``; the attempt fails with
:class:`~agentlease.errors.TaskTimeout`, retried or dead-lettered by the retry policy like any
error. A sync handler that ignores its cancel token keeps its lease (the heartbeat goes on) until
it returns, so a retry never runs beside it; what it returns then is not accepted.

Cancellation. A task cancelled while its handler runs (:meth:`~agentlease.Queue.cancel`) is
refused its next extension: the heartbeat reads the task, finds it cancelled and loses the lease
with the cancel's reason, so an async handler is cancelled and a sync one sees ``ctx.cancelled``
(``ctx.check()`` raises :class:`~agentlease.errors.TaskCancelled`). Nothing is written for it.
If the handler meets the cancellation first (a progress write or its final write refused with
``TaskCancelled``), the worker extends the lease once more, which ends the task ``cancelled``
at once instead of when its lease runs out.

Shutdown (``stop()``, SIGTERM or SIGINT) stops claiming, lets running handlers finish within the
grace period, then cancels what is left. Tasks claimed ahead that never started go back to
the front at once. A lease goes back to the front of its queue only when no
code of its handler can run any more: it never started, it returned, or (async) it was
cancelled and has unwound. A sync handler still running on its thread keeps its lease, which
expires and is reaped as after a crash (its late writes are refused). A second signal skips the
rest of the grace period and ends the run within about a second. Every signal is logged.

Retention. Unless ``purge_every`` is ``None``, the worker purges on a timer, beside its claim
loop (:mod:`agentlease._janitor`): done and dead tasks of its queue past the queue's retention,
idempotency keys past their window, expired lock leases, budgets and breakers; each step bounded
and atomic. A failed round is logged and tried again at the next; it never stops the worker.

Telemetry. While an exporter is installed (``agentlease.otel.instrument()``, see
:mod:`agentlease._telemetry`), the worker reports each claim (with the task's due time, for the
queue latency) and each handler run (its span current in the handler's context, ended with the
handler's error if it raised), and reads its queue's stats once per ``stats_interval`` in a task
of its own for the depth gauge. Without one, none of this runs.

Live workers: a worker registers in the store when it starts (its id ``host:pid:random``, its
queue, concurrency and the tasks in its hands; see :mod:`agentlease._registry`), again at every
heartbeat interval, and removes its entry once a shutdown has drained; its claims name it as
the holder of each lease and of each attempt the store records.

Store errors: an unreachable store (:class:`~agentlease.errors.BackendUnavailable`), or any other
failure of a claim, is logged (rate-limited, with the URL without its password) while the worker
backs off with jitter and tries again. A store that refuses the worker for good
(:class:`~agentlease.errors.BackendRefused`: authentication, permission, TLS, a missing or
newer schema) ends the run with that error at once, whether it refused a claim or a job's final
write. In burst mode a store unreachable for longer than a lease ends the run with the last
error.
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
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeAlias, cast

from agentlease import _clock, _telemetry
from agentlease import _validate as check
from agentlease._async.queue import AsyncQueue
from agentlease._codec import JSON
from agentlease._context import AsyncJobContext, JobContext
from agentlease._deadline import enter_work
from agentlease._events import EventDispatcher, EventName, logger
from agentlease._final_writes import FinalWrites
from agentlease._heartbeat import Heartbeat, Held
from agentlease._janitor import Janitor
from agentlease._outage import Outage
from agentlease._records import Job, Lease
from agentlease._registry import Registration, new_worker_id
from agentlease._scope import enter_task
from agentlease._settings import WorkerSettings, heartbeat_interval
from agentlease._sync.queue import Queue
from agentlease._threads import Call, HandlerThreads
from agentlease._time_limits import run_sync, run_until
from agentlease.backends.base import Backend
from agentlease.errors import (
    AgentLeaseError,
    BackendError,
    BackendRefused,
    BackendUnavailable,
    Cancelled,
    DeadlineExceeded,
    LeaseLost,
    PayloadError,
    TaskCancelled,
)

__all__ = ["AsyncHandler", "AsyncWorker", "Handler", "SyncHandler", "Worker", "WorkerSettings"]

SyncHandler: TypeAlias = Callable[[JobContext], JSON]
AsyncHandler: TypeAlias = Callable[[AsyncJobContext], Awaitable[JSON]]
Handler: TypeAlias = SyncHandler | AsyncHandler
LeaseKey: TypeAlias = tuple[str, str]

_UNWIND = 1.0  # seconds cancelled handlers get to unwind once shutdown is forced
_MAX_ROOTS = 10_000  # root tasks whose unsent calls the retry budgets remember
_SHORT_TASK = 0.05  # tasks are claimed ahead of free slots while handlers take less (seconds)


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
        self._interval = heartbeat_interval(self.settings, queue.settings)
        self._call_timeout = queue.settings.lease_for / 3  # the bound of a heartbeat or final write
        self._rand = random.Random(self.settings.seed)
        self._calls: dict[str, int] = {}  # per root task: first attempts not yet sent
        self._stopping = threading.Event()
        self._forced = threading.Event()
        self._writes = FinalWrites(queue, self._call_timeout, self._forced, self._rand)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._running: dict[LeaseKey, _Running] = {}  # every job whose lease this run holds
        self._waiting: deque[_Running] = deque()  # claimed, not started yet
        self._done: list[tuple[_Running, bytes | None]] = []  # returned, completion not sent
        self._active = 0  # handlers running
        self._mean_run = _SHORT_TASK  # recent handler time (seconds, moving average)
        self._prefetch = (
            self.settings.concurrency if self.settings.prefetch is None else self.settings.prefetch
        )
        self._heartbeat: Heartbeat | None = None
        self._start: Callable[[_Running], None] | None = None
        self._returned: deque[_Running] = deque()  # sync handlers that returned, to collect
        self._collecting = False  # a collection of returned sync handlers is scheduled
        self._events: EventDispatcher | None = None
        self._signals = 0
        self._id = new_worker_id()

    @property
    def id(self) -> str:
        """This worker's id (``host:pid:random``): its entry among the store's live workers and
        the holder its claims record."""
        return self._id

    def stop(self, *, force: bool = False) -> None:
        """Stop claiming and shut down gracefully; ``force`` skips the rest of the grace period.

        A second call forces. Safe to call from any thread or a signal handler.
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

        Raises:
            BackendRefused: the store refused the worker for good (authentication, permission,
                TLS, a missing or newer schema); running handlers were cancelled first.
            BackendError: in burst mode, the store failed every claim for a whole lease.
        """
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        events = self._events = EventDispatcher(self.queue.events)
        events.start()
        installed: list[signal.Signals] = []
        opened: list[Queue | Backend] = []
        heartbeat: Heartbeat | None = None
        threads = HandlerThreads(self.settings.concurrency)
        watching: asyncio.Task[None] | None = None
        try:
            installed = self._install_signals() if handle_signals else []
            # A heartbeat call that hangs must fail before the lease runs out, to be tried again.
            sync_backend = self.queue.backend.open_sync(call_timeout=self._call_timeout)
            opened.append(sync_backend)
            handler_queue = Queue(
                self.queue.backend.open_sync(),
                settings=self.queue.settings,
                on_event=self.queue.events.callback,
            )
            opened.append(handler_queue)
            heartbeat = Heartbeat(
                sync_backend,
                lease_for=self.queue.settings.lease_for,
                events=events,
                interval=self._interval,
                rand=random.Random(self._rand.random()),
            )
            heartbeat.start()
            self._heartbeat = heartbeat
            janitor = self._janitor()
            telemetry = _telemetry.current()
            if telemetry is not None:
                watching = asyncio.create_task(self._watch_stats(telemetry))
            registration = Registration(
                self.queue,
                self.id,
                queues=[self.name],
                concurrency=self.settings.concurrency,
                every=self._interval,
                ttl=max(self.queue.settings.lease_for, 3 * self._interval),
                call_timeout=self._call_timeout,
                tasks=lambda: [task_id for task_id, _ in self._running],
            )
            try:
                await registration.start()
                await self._warn_if_unknown()
                await self._claim_loop(heartbeat, threads, handler_queue, burst)
            except AgentLeaseError as exc:
                logger.error(
                    "worker on queue %r at %s stops: %s: %s",
                    self.name,
                    self.queue.backend.url,
                    type(exc).__name__,
                    exc,
                )
                self._stopping.set()
                self._forced.set()
                raise
            finally:
                if janitor is not None:
                    janitor.cancel()
                    await asyncio.gather(janitor, return_exceptions=True)
                if watching is not None:
                    watching.cancel()
                    # Whatever ended it, the depth gauge is never a reason for the run to fail.
                    await asyncio.gather(watching, return_exceptions=True)
                try:
                    await self._drain(heartbeat)
                finally:
                    await registration.stop()
        finally:
            # A heartbeat thread still inside a store call keeps its backend (it is a daemon).
            ended = heartbeat is None or heartbeat.stop()
            threads.shutdown()
            for sig in installed:
                self._loop.remove_signal_handler(sig)
            for resource in opened[0 if ended else 1 :]:
                resource.close()
            events.stop()
        return self.processed

    def _janitor(self) -> asyncio.Task[None] | None:
        """Start purging on a timer (see :mod:`agentlease._janitor`), unless switched off."""
        every = self.settings.purge_every
        if every is None:
            return None
        seed = None if self.settings.seed is None else self.settings.seed + 1
        janitor = Janitor(
            self.queue, self.name, every, self.settings.purge_batch, random.Random(seed)
        )
        return asyncio.create_task(janitor.run())

    async def _watch_stats(self, telemetry: _telemetry.Telemetry) -> None:
        """Read the queue's stats every ``stats_interval`` seconds for the depth gauge (one read
        per interval, whatever the number of scrapes; a read that fails is skipped)."""
        while True:
            try:
                async with asyncio.timeout(self._call_timeout):
                    stats = await self.queue.stats(self.name)
            except (AgentLeaseError, TimeoutError):
                pass  # an unknown queue has no depth yet; an unreachable store, the claims report
            else:
                telemetry.stats(self.queue.backend.url, stats)
            await asyncio.sleep(telemetry.stats_interval)

    def _install_signals(self) -> list[signal.Signals]:
        if threading.current_thread() is not threading.main_thread():
            return []
        assert self._loop is not None
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._on_signal, sig)
            installed.append(sig)
        return installed

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals == 1:
            logger.warning(
                "%s: the worker stops claiming; running jobs have %gs to finish (another "
                "signal stops them now)",
                sig.name,
                self.settings.shutdown_grace,
            )
        else:
            logger.warning("%s again: stopping now", sig.name)
        self.stop()

    async def _warn_if_unknown(self) -> None:
        """Warn once if nothing was ever enqueued to this queue (a typo is otherwise silent)."""
        try:
            known = await self.queue.queues()
        except BackendRefused:
            raise
        except BackendError:
            return  # the claim loop reports it
        if self.name not in known:
            logger.warning(
                "queue %r has never been used on %s; waiting for tasks to be enqueued to it "
                "(queues there: %s)",
                self.name,
                self.queue.backend.url,
                ", ".join(repr(q) for q in sorted(known)) or "none",
            )

    async def _claim_loop(
        self, heartbeat: Heartbeat, threads: HandlerThreads, handler_queue: Queue, burst: bool
    ) -> None:
        assert self._wake is not None
        idle = 0.0
        outage = Outage(self.queue.backend.url, self.name)
        self._start = functools.partial(self._start_job, threads, handler_queue)
        while not self._stopping.is_set():
            if self._writes.refused is not None:
                raise self._writes.refused  # a final write the store refuses for good
            want = self._wanted()
            if want <= 0:
                if self._done:
                    await self._flush()
                else:
                    await self._sleep(None)
                continue
            sent_at = _clock.monotonic()
            sent_ns = time.time_ns()
            try:
                # Completions reach the store before the next claim (in the same call).
                jobs = await self._flush_and_claim(want)
            except BackendRefused:
                raise  # the same every time: the run ends with it
            except BackendError as exc:
                # Leases keep their heartbeat; the claim is tried again after a jittered backoff.
                down_for = outage.failed(exc)
                if burst and down_for > self.queue.settings.lease_for:
                    raise
                await self._sleep(outage.backoff(self._rand))
                continue
            outage.reached()
            if not jobs:
                if burst and not self._running:
                    return
                idle = min(self.settings.poll_interval, max(0.01, idle * 2))
                await self._idle(idle * self._rand.uniform(0.5, 1.0))
                continue
            idle = 0.0
            claimed_at = _clock.monotonic()
            telemetry = _telemetry.current()
            for job in jobs:
                entry = _Running(job)
                entry.offset = job.lease.leased_at - claimed_at
                if job.deadline is not None:
                    entry.at = job.deadline - entry.offset
                entry.held = heartbeat.add(job.lease, functools.partial(self._lost, entry), sent_at)
                if telemetry is not None:
                    telemetry.claimed(job, sent_ns)
                due = {} if job.run_at is None else {"run_at": job.run_at}
                self._emit(
                    "claimed",
                    job.lease,
                    reclaims=job.reclaims,
                    failures=job.failures,
                    leased_at=job.lease.leased_at,
                    expires_at=job.lease.expires_at,
                    **due,
                )
                self._running[entry.key] = entry
                if job.deadline is not None and job.deadline <= job.lease.leased_at:
                    self._expired(entry)  # past its deadline when claimed: it never runs
                else:
                    self._waiting.append(entry)
            self._start_waiting()

    def _wanted(self) -> int:
        """How many tasks the next claim asks for (0: do not claim now).

        Up to the free slots, plus the prefetch while handlers are short; the prefetch is
        refilled once half of it has started, so that claims stay batched.
        """
        held = len(self._running) - len(self._done)  # completions go before the claim
        if not self.settings.batch:
            return 1 if held < self.settings.concurrency else 0
        ahead = self._prefetch if self._mean_run < _SHORT_TASK else 0
        if len(self._waiting) > ahead // 2:
            return 0
        return self.settings.concurrency + ahead - held

    def _start_waiting(self) -> None:
        """Start claimed tasks while slots are free (never once the worker is stopping)."""
        while self._waiting and self._active < self.settings.concurrency:
            if self._stopping.is_set():
                return  # the drain gives them back
            entry = self._waiting.popleft()
            assert entry.held is not None
            if entry.held.lost.is_set():  # lost while it waited: it never ran
                self._finish(entry)
                continue
            if entry.at is not None and _clock.monotonic() >= entry.at:
                self._expired(entry)  # its deadline passed while it waited: it never runs
                continue
            self._active += 1
            entry.started = _clock.monotonic()
            limit = entry.job.timeout or self.settings.task_timeout
            if limit is not None:
                entry.limit, entry.limit_at = limit, entry.started + limit
            assert self._start is not None
            self._start(entry)

    def _start_job(self, threads: HandlerThreads, handler_queue: Queue, entry: _Running) -> None:
        """Start a job's handler: an async one as a task of its own, a sync one on a handler
        thread, whose return the loop collects (see :meth:`_collect`)."""
        job, held = entry.job, entry.held
        assert held is not None
        telemetry = _telemetry.current()
        if telemetry is not None:
            entry.run = telemetry.run(job)
        if self._async_handler is not None:
            entry.task = asyncio.create_task(
                self._run_async(entry, self._async_handler),
                name=f"agentlease-job-{job.task_id}-{job.attempt}",
            )
            entry.task.add_done_callback(functools.partial(self._never_began, entry))
            return
        assert self._sync_handler is not None
        # Idempotent actions inside the handler are keyed on this task; its root task and
        # deadline are in force there (check_deadline, and the tasks it enqueues).
        context = contextvars.copy_context()
        context.run(enter_task, job.task_id, job.lease.attempt)
        context.run(enter_work, job.root_id, entry.offset, entry.at)
        if entry.run is not None:
            context.run(entry.run.enter)  # the run's span is current in the handler
        ctx = JobContext(
            job,
            held,
            self._forced,
            handler_queue,
            deadline_at=entry.at,
            limit_at=entry.limit_at,
            limit=entry.limit,
        )
        entry.future = threads.submit(
            functools.partial(context.run, run_sync, self._sync_handler, ctx),
            functools.partial(self._returned_on_thread, entry),
        )

    def _expired(self, entry: _Running) -> None:
        """Dead-letter a claimed task whose deadline passed before its handler started."""
        job = entry.job
        overdue = 0.0 if entry.at is None else max(0.0, _clock.monotonic() - entry.at)
        if job.deadline is not None:
            overdue = max(overdue, job.lease.leased_at - job.deadline)
        error = DeadlineExceeded(f"task {job.task_id}", overdue_s=overdue)
        entry.task = asyncio.create_task(self._conclude(entry, None, error))

    def _returned_on_thread(self, entry: _Running, _: Call[JSON]) -> None:
        """A sync handler returned (on its thread): have the loop collect it, waking the loop
        once for all the handlers that return before it runs."""
        self._returned.append(entry)
        if self._collecting:
            return
        self._collecting = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._collect)

    def _collect(self) -> None:
        """On the loop: conclude the sync handlers that returned."""
        self._collecting = False
        while self._returned:
            entry = self._returned.popleft()
            if entry.over:
                continue  # given up at shutdown while its thread still ran
            future = entry.future
            assert future is not None
            self._ran(entry, asyncio.CancelledError() if future.cancelled() else future.error)
            if future.cancelled():  # it never started (shutdown)
                entry.task = asyncio.create_task(
                    self._conclude(entry, None, asyncio.CancelledError())
                )
                continue
            exc = future.error
            if exc is not None and not isinstance(exc, Exception):
                self._finish(entry)
                raise exc  # SystemExit, KeyboardInterrupt: as if raised by the loop
            result = future.result
            if exc is None and self._completed(entry, result):
                continue
            entry.task = asyncio.create_task(self._conclude(entry, result, exc))

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

    async def _drain(self, heartbeat: Heartbeat | None) -> None:
        """Give back the tasks that never started, let running handlers finish within the grace
        period, then cancel them; send the completions of those that returned. Leases go back
        only for handlers that can run no more (see the module docstring)."""
        while self._waiting:
            entry = self._waiting.popleft()
            if heartbeat is not None and entry.held is not None and not entry.held.lost.is_set():
                await self._give_back(entry.job)
            self._finish(entry)
        deadline = _clock.monotonic() + self.settings.shutdown_grace
        while self._running:
            if self._done:
                await self._flush()
                continue
            left = deadline - _clock.monotonic()
            if left <= 0 or self._forced.is_set() or self._active == 0:
                break
            await self._sleep(left)
        self._forced.set()
        self._cancel_handlers()
        # Cancelled handlers unwind; those that never started give their tasks back.
        unwind = _clock.monotonic() + _UNWIND
        while (left := unwind - _clock.monotonic()) > 0:
            await asyncio.sleep(0)  # sync handlers cancelled before they started are collected
            tasks = [e.task for e in self._running.values() if e.task and not e.task.done()]
            if not tasks:
                break
            await asyncio.wait(tasks, timeout=left)
        if self._done:
            await self._flush()

    def _cancel_handlers(self) -> None:
        """Cancel every running handler: an async one is cancelled; a sync one that has not
        started never will; a sync one still running keeps its lease until it expires."""
        for entry in list(self._running.values()):
            if entry.task is not None:
                entry.task.cancel()
            future, held = entry.future, entry.held
            if future is None or future.done() or future.cancel():
                continue
            # Its thread still runs and may still write: the lease must not go back to the
            # queue. It expires and is reaped, as after a crash.
            assert held is not None
            assert self._heartbeat is not None
            self._heartbeat.lose(
                held, "the worker stopped while this sync handler was still running"
            )
            lease = held.lease
            logger.warning(
                "sync handler for %s/%s (attempt %d) still running at shutdown: its lease is kept "
                "and expires within %gs; then the task runs again",
                lease.queue,
                lease.task_id,
                lease.attempt,
                self.queue.settings.lease_for,
            )
            self._finish(entry)

    def _lost(self, entry: _Running, reason: str) -> None:
        """Called on a heartbeat thread when a lease is lost: cancel an async handler (a sync
        one sees its cancel token set)."""
        loop, task = self._loop, entry.task
        if loop is None or loop.is_closed() or task is None or not self._is_async:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(task.cancel)

    def _emit(self, name: EventName, lease: Lease, **fields: object) -> None:
        events = self._events or self.queue.events
        events.emit(name, lease.queue, lease.task_id, lease.attempt, **fields)

    def _never_began(self, entry: _Running, task: asyncio.Task[None]) -> None:
        """An async job's task ended: if it was cancelled before its first step (a lease lost,
        or a forced stop, right after it was started), its handler never ran."""
        if entry.began:
            return
        self._ran(entry, asyncio.CancelledError())
        if entry.held is not None and entry.held.lost.is_set():
            self._finish(entry)
        else:  # it goes back to the front of the queue
            entry.task = asyncio.create_task(self._conclude(entry, None, asyncio.CancelledError()))

    async def _run_async(self, entry: _Running, handler: AsyncHandler) -> None:
        """An async handler's job: run it in this task, then conclude."""
        entry.began = True
        job, held = entry.job, entry.held
        assert held is not None
        # Idempotent actions inside the handler are keyed on this task, and its root task and
        # deadline are in force (each job runs in a task of its own, so this context is the
        # job's).
        enter_task(job.task_id, job.lease.attempt)
        enter_work(job.root_id, entry.offset, entry.at)
        if entry.run is not None:
            entry.run.enter()  # the run's span is current in the handler
        ctx = AsyncJobContext(
            job,
            held,
            self._forced,
            self.queue,
            deadline_at=entry.at,
            limit_at=entry.limit_at,
            limit=entry.limit,
        )
        result: JSON = None
        error: BaseException | None = None
        try:
            result = await run_until(entry.at, handler(ctx), job.task_id, entry.limit)
        except (asyncio.CancelledError, Exception) as exc:
            error = exc
        finally:
            self._ran(entry, error)
        if error is None and self._completed(entry, result):
            return
        await self._conclude(entry, result, error)

    def _completed(self, entry: _Running, result: JSON) -> bool:
        """A handler returned ``result``: queue its completion for the next batch, without
        waiting. False when the job needs :meth:`_conclude` (no batching, or a result that
        cannot be stored)."""
        held = entry.held
        assert held is not None
        if not self.settings.batch:
            return False
        if held.lost.is_set():
            self._refuse(entry.job, "complete")
            self._finish(entry)
            return True
        try:
            data = self.queue.encode_result(result)
        except PayloadError:
            return False
        self._done.append((entry, data))
        return True

    async def _conclude(self, entry: _Running, result: JSON, error: BaseException | None) -> None:
        """A job's final write (or none) after its handler returned or raised ``error``."""
        queue, job, held = self.queue, entry.job, entry.held
        assert held is not None
        lease = job.lease
        if job.lease.attempt == 1 and self.settings.retry.budget_ratio is not None:
            self._calls[job.root_id] = self._calls.get(job.root_id, 0) + 1  # a new call
        try:
            if isinstance(error, asyncio.CancelledError | Cancelled):
                if not held.lost.is_set():  # else the lease is gone: nothing may be written
                    await self._give_back(job)  # shutdown past grace: it runs again first
                return
            if isinstance(error, TaskCancelled):
                await self._writes.end_cancelled(held)  # the task ends cancelled now
                return
            if isinstance(error, LeaseLost):
                return  # a fenced write inside the handler was refused: the lease is gone
            if error is not None:
                if held.lost.is_set():
                    self._refuse(job, "fail")
                    return
                retry_in, reason = self._retry_in(entry, error)
                if retry_in is not None and not await self._budget_allows(job):
                    retry_in, reason = None, "retry_budget"
                await self._writes.one(
                    held,
                    functools.partial(
                        queue.fail, held.lease, error, retry_in=retry_in, reason=reason
                    ),
                )
                return
            if held.lost.is_set():
                self._refuse(job, "complete")
                return
            try:
                data = queue.encode_result(result)
            except PayloadError as exc:
                # The handler returned something that cannot be stored: that never gets better.
                await self._writes.one(
                    held, functools.partial(queue.fail, held.lease, exc, retry_in=None)
                )
                return
            accepted = await self._writes.many(
                [held], functools.partial(queue.complete_encoded, [(held.lease, data)])
            )
            if accepted[0]:
                self._emit("completed", lease, lease_age=_clock.monotonic() - held.ok_at)
        finally:
            self._finish(entry)

    async def _budget_allows(self, job: Job) -> bool:
        """Whether the retry budget of ``job``'s root task lets it retry (one atomic step on
        the store, sending the calls counted here since the last one). A budget the store cannot
        answer for now lets the retry policy decide alone, with a warning."""
        policy = self.settings.retry
        if policy.budget_ratio is None:
            return True
        root = job.root_id
        calls = self._calls.pop(root, 0)
        try:
            got = await self.queue.backend.retry_budget(
                f"retry:{root}",
                calls,
                True,
                float(policy.budget_ratio),
                policy.budget_minimum,
                policy.budget_ttl,
            )
        except BackendError as exc:
            self._calls[root] = self._calls.get(root, 0) + calls
            logger.warning(
                "retry budget of root task %s unavailable (%s): the retry policy decides alone",
                root,
                exc,
            )
            return True
        if len(self._calls) > _MAX_ROOTS:  # roots that never retried: their calls go unsent
            self._calls.clear()
        return got.granted

    def _retry_in(self, entry: _Running, error: BaseException) -> tuple[float | None, str | None]:
        """When to retry a job whose handler raised ``error`` (``None``: dead-letter it), and
        why it is given up on when the deadline decides: a deadline ends the tree, so a task
        past it, or whose retry would start past it, is never retried."""
        if isinstance(error, DeadlineExceeded):
            return None, "deadline"
        retry_in = self.settings.retry.retry_in(entry.job.failures, error, self._rand)
        at = entry.at
        if retry_in is not None and at is not None and _clock.monotonic() + retry_in >= at:
            return None, "deadline"
        return retry_in, None

    def _ran(self, entry: _Running, error: BaseException | None) -> None:
        """A handler returned or raised ``error``: its slot is free for the next claimed task."""
        run, entry.run = entry.run, None
        if run is not None:
            run.end(error)
        self._active -= 1
        took = _clock.monotonic() - entry.started
        self._mean_run += (took - self._mean_run) * 0.2
        self._start_waiting()
        if self._wake is not None:
            self._wake.set()

    def _finish(self, entry: _Running) -> None:
        """A job is over (its final write was sent, refused or given up): forget its lease."""
        if entry.over:
            return
        entry.over = True
        if entry.held is not None and self._heartbeat is not None:
            self._heartbeat.remove(entry.held)
        if self._running.get(entry.key) is entry:
            del self._running[entry.key]
        self.processed += 1
        if self._wake is not None:
            self._wake.set()

    def _take_done(self) -> list[tuple[_Running, bytes | None]]:
        """The completions to send now; those of leases lost meanwhile are refused here."""
        batch, self._done = self._done, []
        sending: list[tuple[_Running, bytes | None]] = []
        for entry, data in batch:
            assert entry.held is not None
            if entry.held.lost.is_set():
                self._refuse(entry.job, "complete")
                self._finish(entry)
            else:
                sending.append((entry, data))
        return sending

    @staticmethod
    def _items(sending: list[tuple[_Running, bytes | None]]) -> list[tuple[Lease, bytes | None]]:
        return [(entry.held.lease, data) for entry, data in sending if entry.held is not None]

    def _concluded(
        self, sending: list[tuple[_Running, bytes | None]], accepted: list[bool]
    ) -> None:
        for (entry, _), ok in zip(sending, accepted, strict=True):
            if ok and entry.held is not None:
                lease_age = _clock.monotonic() - entry.held.ok_at
                self._emit("completed", entry.job.lease, lease_age=lease_age)
            self._finish(entry)

    async def _flush(
        self, sending: list[tuple[_Running, bytes | None]] | None = None, *, retried: bool = False
    ) -> None:
        """Send the completions waiting for a write, in one round trip (retried like
        :meth:`FinalWrites.one` while the store is unavailable and the leases are held)."""
        if sending is None:
            sending = self._take_done()
        if not sending:
            return
        accepted = await self._writes.many(
            [e.held for e, _ in sending if e.held is not None],
            functools.partial(self.queue.complete_encoded, self._items(sending)),
            retried=retried,
        )
        self._concluded(sending, accepted)

    async def _flush_and_claim(self, want: int) -> list[Job]:
        """Send the waiting completions and claim ``want`` tasks in one call (one transaction
        on SQLite and PostgreSQL). If it fails, the completions are sent again on their own,
        with :meth:`_flush`'s retries, and the claim error is raised."""
        sending = self._take_done()
        if not sending:
            return await self.queue.claim(self.name, want, holder=self.id)
        try:
            async with asyncio.timeout(self._call_timeout):
                outcomes, jobs = await self.queue.complete_encoded_and_claim(
                    self._items(sending), self.name, want, holder=self.id
                )
        except BackendRefused:
            self._done[:0] = sending  # the drain tries them once more
            raise
        except (BackendError, TimeoutError) as exc:
            await self._flush(sending, retried=True)
            if isinstance(exc, TimeoutError):
                raise BackendUnavailable(f"{self.queue.backend.url}: claim timed out") from exc
            raise
        helds = [e.held for e, _ in sending if e.held is not None]
        self._concluded(sending, await self._writes.accepted(helds, outcomes, retried=False))
        return jobs

    def _refuse(self, job: Job, write: str) -> None:
        self._emit(
            "zombie_rejected",
            job.lease,
            write=write,
            source="worker",
            reason="lease lost before the write",
        )


@dataclass(slots=True, eq=False)
class _Running:
    """One job of this worker: its claim, its heartbeat entry, and what runs it."""

    job: Job
    held: Held | None = None
    task: asyncio.Task[None] | None = None
    future: Call[JSON] | None = None  # a sync handler's call on its thread
    started: float = 0.0  # monotonic time its handler started
    over: bool = False  # finished: its lease is no longer tracked
    began: bool = False  # its async task took its first step
    offset: float | None = None  # the store's clock minus the monotonic clock, at the claim
    at: float | None = None  # the task's deadline on the monotonic clock
    limit: float | None = None  # the attempt's time limit in seconds
    limit_at: float | None = None  # when it ends on the monotonic clock
    run: _telemetry.Run | None = None  # the handler's run as the telemetry exporter sees it

    @property
    def key(self) -> LeaseKey:
        return (self.job.lease.task_id, self.job.lease.token)


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
    def id(self) -> str:
        """This worker's id (``host:pid:random``), as ``agentlease workers`` lists it and as
        the holder of its leases and attempts."""
        return self._engine.id

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
