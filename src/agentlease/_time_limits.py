"""The time limits of a handler's run: the task's deadline and the attempt's time limit.

An async handler is cancelled at whichever comes first (:func:`run_until`), and
:class:`~agentlease.errors.DeadlineExceeded` or :class:`~agentlease.errors.TaskTimeout` takes
the place of its result. A sync handler cannot be cancelled on its thread: :func:`run_sync`
refuses a result it returns too late, and the worker keeps its lease until it returns (so a
retry never runs beside it). Times are on :func:`agentlease._clock.monotonic`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from agentlease import _clock
from agentlease._codec import JSON
from agentlease._context import JobContext
from agentlease.errors import DeadlineExceeded, TaskTimeout

__all__ = ["ended", "run_sync", "run_until"]


def run_sync(handler: Callable[[JobContext], JSON], ctx: JobContext) -> JSON:
    """Run a sync handler (on its thread, in the job's context): a result returned after the
    task's deadline is not accepted (the deadline ended the tree; an async handler would have
    been cancelled), nor one returned after the attempt's time limit (the attempt failed)."""
    result = handler(ctx)
    at = ctx.deadline_at
    now = _clock.monotonic()
    if at is not None and now >= at:
        raise DeadlineExceeded(f"task {ctx.task_id}", overdue_s=now - at)
    if ctx.limit_at is not None and now >= ctx.limit_at:
        raise TaskTimeout(ctx.task_id, ctx.limit or 0.0)
    return result


async def run_until(
    at: float | None, work: Awaitable[JSON], task_id: str, limit: float | None = None
) -> JSON:
    """Await an async handler, cancelled at the task's deadline ``at`` (monotonic) or at the end
    of the attempt's time limit of ``limit`` seconds, whichever comes first: then
    :class:`~agentlease.errors.DeadlineExceeded` or :class:`~agentlease.errors.TaskTimeout` is
    raised in its place."""
    start = _clock.monotonic()
    limit_at = None if limit is None else start + limit
    ends = [t for t in (at, limit_at) if t is not None]
    if not ends:
        return await work
    stop = min(ends)
    loop = asyncio.get_running_loop()
    # The loop's clock is _clock.monotonic() by default; convert in case it is another.
    timer = asyncio.timeout_at(loop.time() + (stop - start))
    try:
        async with timer:
            result = await work
    except TimeoutError as exc:
        if not timer.expired():
            raise  # the handler's own timeout, not the deadline or the limit
        raise ended(at, limit, task_id) from exc
    if timer.expired():  # it swallowed the cancellation and returned: too late all the same
        raise ended(at, limit, task_id)
    return result


def ended(at: float | None, limit: float | None, task_id: str) -> Exception:
    """Why an async handler was stopped: the deadline if it has passed, else the time limit."""
    now = _clock.monotonic()
    if at is not None and now >= at:
        return DeadlineExceeded(f"task {task_id}", overdue_s=now - at)
    return TaskTimeout(task_id, limit or 0.0)
