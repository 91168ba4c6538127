"""What a handler receives: the job, its lease's fencing number, a cancel token, progress.

Sync handlers get a :class:`JobContext` and run on a worker thread; async handlers get an
:class:`AsyncJobContext` and run on the event loop. Both carry the same read-only facts.

The deadline. A task that carries a deadline (inherited from the handler or the
:func:`agentlease.deadline` block that enqueued it) runs with it in force: ``deadline_at`` is
that point on this process's monotonic clock. Once it passes, ``cancelled`` is true, ``check()``
raises :class:`~agentlease.errors.DeadlineExceeded` and ``wait()`` wakes; so does
:func:`agentlease.check_deadline` inside the handler (the worker sets the deadline in the
handler's context, copied into its thread). A deadline ends the whole tree of work: the worker
dead-letters the task (reason ``deadline``), never retries it.

Cancellation. A task cancelled while it runs (:meth:`~agentlease.Queue.cancel`) is found by the
worker's next heartbeat: from then on ``cancelled`` and ``lost`` are true, ``check()`` raises
:class:`~agentlease.errors.TaskCancelled` with the reason, ``wait()`` wakes, and an async
handler is cancelled. The task has ended ``cancelled``: nothing the attempt writes is accepted.

The time limit. An attempt may also have a time limit (the task's ``timeout``, or the worker's
``task_timeout``): ``limit_at`` is when it ends on this process's monotonic clock. Past it,
``cancelled`` is true and ``check()`` raises :class:`~agentlease.errors.TaskTimeout`: the attempt
fails and the retry policy decides whether another runs. Unlike the deadline, it ends one
attempt, not the tree.

``progress`` rides out a short store outage: a write that finds the store unavailable is retried
with jittered backoff for as long as the lease is held (its local deadline), like the worker's
final writes; past it the lease is lost and :class:`~agentlease.errors.LeaseLost` is raised.
"""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentlease import _clock
from agentlease._codec import JSON
from agentlease._heartbeat import Held
from agentlease._records import Job, Lease
from agentlease.errors import (
    BackendUnavailable,
    Cancelled,
    DeadlineExceeded,
    LeaseLost,
    TaskCancelled,
    TaskTimeout,
)

if TYPE_CHECKING:
    from agentlease._async.queue import AsyncQueue
    from agentlease._sync.queue import Queue

__all__ = ["AsyncJobContext", "JobContext"]


@dataclass(slots=True)
class _Base:
    job: Job
    held: Held
    shutdown: threading.Event
    deadline_at: float | None = field(default=None, kw_only=True)
    """The task's deadline on the monotonic clock (``_clock.monotonic()``), or ``None``."""
    limit_at: float | None = field(default=None, kw_only=True)
    """When this attempt's time limit ends on the monotonic clock, or ``None``."""
    limit: float | None = field(default=None, kw_only=True)
    """This attempt's time limit in seconds, or ``None``."""

    @property
    def task_id(self) -> str:
        """The task's id."""
        return self.job.lease.task_id

    @property
    def attempt(self) -> int:
        """This lease's fencing number: pass it to external systems so they can refuse writes
        from an older attempt."""
        return self.job.lease.attempt

    @property
    def payload(self) -> JSON:
        """The task's payload."""
        return self.job.payload

    @property
    def checkpoint(self) -> JSON:
        """The checkpoint saved by an earlier attempt, or ``None``: resume from it."""
        return self.job.checkpoint

    @property
    def lease(self) -> Lease:
        """The lease as last renewed."""
        return self.held.lease

    @property
    def lost(self) -> bool:
        """Whether the lease was lost; the worker will refuse this job's writes."""
        return self.held.lost.is_set()

    @property
    def expired(self) -> bool:
        """Whether the task's deadline has passed."""
        return self.deadline_at is not None and _clock.monotonic() >= self.deadline_at

    @property
    def timed_out(self) -> bool:
        """Whether this attempt's time limit has passed."""
        return self.limit_at is not None and _clock.monotonic() >= self.limit_at

    @property
    def cancelled(self) -> bool:
        """Whether the job should stop now (lease lost, shutdown past its grace period, the
        task's deadline or the attempt's time limit passed)."""
        return self.held.lost.is_set() or self.shutdown.is_set() or self.expired or self.timed_out

    def check(self) -> None:
        """Raise if the job should stop: call it between steps of long sync work.

        Raises:
            TaskCancelled: the task was cancelled (its reason attached); nothing more of this
                attempt is accepted.
            LeaseLost: the lease is gone; another worker may run this task now.
            Cancelled: the worker is shutting down past its grace period.
            DeadlineExceeded: the task's deadline passed (the task is dead-lettered).
            TaskTimeout: the attempt's time limit passed (the attempt fails; it may be retried).
        """
        if self.held.lost.is_set():
            lease = self.job.lease
            if self.held.cancel_reason is not None:
                raise TaskCancelled(lease.task_id, self.held.cancel_reason, attempt=lease.attempt)
            raise LeaseLost(
                lease.task_id,
                lease.attempt,
                None,
                None,
                reason=self.held.lost_reason or "lease lost",
            )
        if self.shutdown.is_set():
            raise Cancelled(self.task_id)
        at = self.deadline_at
        if at is not None:
            now = _clock.monotonic()
            if now >= at:
                raise DeadlineExceeded(f"task {self.task_id}", overdue_s=now - at)
        if self.timed_out:
            raise TaskTimeout(self.task_id, self.limit or 0.0)

    def _retry_in(self, delay: float, exc: BackendUnavailable) -> float:
        """How long to wait before writing progress again, or raise when the lease runs out."""
        if _clock.monotonic() + delay >= self.held.deadline:
            self.check()  # lost already: LeaseLost
            raise exc
        return delay * random.uniform(0.5, 1.0)

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, waking early if the job is cancelled (the deadline passing
        included); returns ``cancelled``."""
        if self.held.lost.wait(0) or self.shutdown.wait(0) or self.expired or self.timed_out:
            return True
        for at in (self.deadline_at, self.limit_at):
            if at is not None:
                seconds = min(seconds, max(0.0, at - _clock.monotonic()))
        self.held.lost.wait(seconds)
        return self.cancelled


@dataclass(slots=True)
class JobContext(_Base):
    """The context of a sync handler."""

    queue: Queue

    def progress(self, value: JSON = None, *, checkpoint: JSON = None) -> None:
        """Record progress and optionally a checkpoint, fenced by this job's lease.

        While the store is unavailable the write is retried within the lease.

        Raises:
            LeaseLost: the lease is gone (refused by the store, or not renewed in time).
            Cancelled: the worker is shutting down past its grace period.
            BackendUnavailable: the store stayed unreachable until the lease's deadline.
        """
        delay = 0.05
        while True:
            self.check()
            try:
                self.queue.progress(self.held.lease, value, checkpoint=checkpoint)
                return
            except BackendUnavailable as exc:
                self.held.lost.wait(self._retry_in(delay, exc))
                delay = min(1.0, delay * 2)


@dataclass(slots=True)
class AsyncJobContext(_Base):
    """The context of an async handler."""

    queue: AsyncQueue

    async def progress(self, value: JSON = None, *, checkpoint: JSON = None) -> None:
        """Record progress and optionally a checkpoint, fenced by this job's lease.

        While the store is unavailable the write is retried within the lease.

        Raises:
            LeaseLost: the lease is gone (refused by the store, or not renewed in time).
            Cancelled: the worker is shutting down past its grace period.
            BackendUnavailable: the store stayed unreachable until the lease's deadline.
        """
        delay = 0.05
        while True:
            self.check()
            try:
                await self.queue.progress(self.held.lease, value, checkpoint=checkpoint)
                return
            except BackendUnavailable as exc:
                await asyncio.sleep(self._retry_in(delay, exc))
                delay = min(1.0, delay * 2)
