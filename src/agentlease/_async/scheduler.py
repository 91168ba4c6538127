"""The scheduler: fires the ticks of periodic tasks, once each however many schedulers run.

Written once for asyncio; the synchronous face is generated from this file by scripts/unasync.py.

A pass reads the store's clock once, asks each :class:`~agentlease.Schedule` which ticks are due
(its misfire policy, bounded by its grace) and enqueues them in one atomic step per schedule,
each with the id and dedup key of its tick: when several schedulers fire one tick, the store
creates its task once and the others find it there. Nothing is coordinated between schedulers
but the store, so any number of them may run (on different machines, against one store) and any
of them may die at any moment.

Between passes the scheduler sleeps until the next tick of any schedule, at most ``max_sleep``
seconds (so that a jump of the store's clock is noticed). A pass that fails because the store is
unreachable (:class:`~agentlease.errors.BackendUnavailable`, or any other store failure) is logged
(rate-limited) and tried again after a jittered backoff: the ticks it meant to fire are still due
on the next pass, while within their grace. Ticks a scheduler sees it has skipped (past their
grace, or dropped by ``misfire="latest"``) are logged as a warning when it fires the next one.
A store that refuses the scheduler for good (:class:`~agentlease.errors.BackendRefused`) ends
:meth:`run` with that error.
"""

from __future__ import annotations

import logging
import random
import signal
from collections.abc import Iterable
from contextlib import nullcontext
from types import TracebackType
from typing import TYPE_CHECKING

from agentlease import _clock
from agentlease import _validate as check
from agentlease._codec import encode
from agentlease._records import TaskSpec
from agentlease._schedule import SECOND, Schedule, Tick, tick_label
from agentlease._settings import QueueSettings
from agentlease._wakeup import AsyncWakeup
from agentlease.errors import BackendError, BackendRefused, InvalidDuration, InvalidSchedule

if TYPE_CHECKING:
    from agentlease._async.queue import AsyncQueue

__all__ = ["AsyncScheduler"]

log = logging.getLogger("agentlease.scheduler")

# A store failure is logged at most this often (seconds) while it lasts.
LOG_EVERY = 30.0
# The longest backoff between passes while the store fails (seconds).
MAX_BACKOFF = 5.0
# The longest max_sleep accepted (seconds).
MAX_SLEEP = 3600.0


class AsyncScheduler:
    """Fires the ticks of ``schedules`` on the store of ``queue`` until stopped.

    Args:
        queue: the queue client whose store the tasks go to.
        schedules: the schedules; their names must be distinct.
        max_sleep: the longest sleep between passes, in seconds (at most an hour).

    Raises:
        InvalidSchedule: two schedules share a name, or an item is not a Schedule.
        PayloadTooLarge: a schedule's payload is over the queue's size limit.
        InvalidDuration: ``max_sleep`` is not a positive number of seconds up to an hour.
    """

    def __init__(
        self,
        queue: AsyncQueue,
        schedules: Iterable[Schedule],
        *,
        max_sleep: float = 1.0,
    ) -> None:
        items = list(schedules)
        names: set[str] = set()
        for item in items:
            if not isinstance(item, Schedule):
                raise InvalidSchedule(f"not a Schedule: {item!r}")
            if item.name in names:
                raise InvalidSchedule(f"two schedules are named {item.name!r}")
            names.add(item.name)
            encode(item.payload, limit=queue.settings.max_payload_bytes)
        if check.duration(max_sleep, "max_sleep") > MAX_SLEEP:
            raise InvalidDuration(f"max_sleep must be at most {MAX_SLEEP:g} s, not {max_sleep!r}")
        self.queue = queue
        self.schedules = items
        self.max_sleep = float(max_sleep)
        self._fired_through: dict[str, int] = {}
        self._started_us: int | None = None
        self._now_us = 0  # the store's clock at the last pass
        self._wakeup = AsyncWakeup()
        self._next_us: int | None = None
        self._read_at = 0.0  # monotonic time of the last read of the store's clock

    @classmethod
    def connect(
        cls,
        url: str,
        schedules: Iterable[Schedule],
        *,
        max_sleep: float = 1.0,
        settings: QueueSettings | None = None,
    ) -> AsyncScheduler:
        """A scheduler on the store named by ``url`` (``sqlite:///tasks.db``, ...)."""
        from agentlease._async.queue import AsyncQueue

        return cls(AsyncQueue.connect(url, settings=settings), schedules, max_sleep=max_sleep)

    async def __aenter__(self) -> AsyncScheduler:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Release the store's connections."""
        await self.queue.close()

    def stop(self) -> None:
        """End :meth:`run` after the pass under way (safe from any thread or signal handler)."""
        self._wakeup.set()

    async def run_once(self) -> list[Tick]:
        """One pass: fire every schedule's due ticks now; return them, oldest first per schedule.

        Raises:
            BackendError: the store failed; ticks not fired are still due on the next pass.
        """
        now = await self.queue.backend.now()
        self._read_at = _clock.monotonic()
        now_us = self._now_us = int(now * SECOND)
        if self._started_us is None:
            self._started_us = now_us
        fired: list[Tick] = []
        for schedule in self.schedules:
            ticks = schedule.due(
                now_us,
                fired_through=self._fired_through.get(schedule.name),
                started_us=self._started_us,
            )
            if not ticks:
                continue
            specs = [
                TaskSpec(
                    payload=schedule.payload,
                    id=schedule.task_id(at),
                    dedup_key=schedule.dedup_key(at),
                )
                for at in ticks
            ]
            results = await self.queue.enqueue_many(schedule.queue, specs)
            known = self._fired_through.get(schedule.name)
            first_missed = None if known is None else schedule.next_after(known)
            if first_missed is not None and first_missed < ticks[0]:
                log.warning(
                    "schedule %r: ticks from %s to before %s were missed and are not fired "
                    "(misfire=%r, grace %gs)",
                    schedule.name,
                    tick_label(first_missed),
                    tick_label(ticks[0]),
                    schedule.misfire,
                    schedule.grace,
                )
            self._fired_through[schedule.name] = ticks[-1]
            for at, result in zip(ticks, results, strict=True):
                tick = Tick(
                    schedule.name, schedule.queue, at / SECOND, result.task_id, result.created
                )
                fired.append(tick)
                if result.created:
                    log.info("schedule %r: fired %s", schedule.name, tick_label(at))
                else:
                    log.debug("schedule %r: %s was fired already", schedule.name, tick_label(at))
        upcoming = [s.next_after(now_us) for s in self.schedules]
        self._next_us = min((at for at in upcoming if at is not None), default=None)
        return fired

    async def run(self, *, handle_signals: bool = True) -> None:
        """Fire ticks until :meth:`stop`, SIGTERM or SIGINT; a failing store is retried.

        Args:
            handle_signals: stop on SIGTERM/SIGINT (installed on the main thread only).

        Raises:
            BackendRefused: the store refuses this client for good (authentication,
                permission, a missing or newer schema).
        """
        names = ", ".join(repr(s.name) for s in self.schedules) or "none"
        log.info("scheduler on %s: schedules %s", self.queue.backend.url, names)
        with self._wakeup.signals(self._on_signal) if handle_signals else nullcontext():
            backoff = 0.1
            failing_since: float | None = None
            logged_at: float | None = None
            while not self._wakeup.is_set():
                try:
                    await self.run_once()
                except BackendRefused:
                    raise
                except BackendError as exc:
                    now = _clock.monotonic()
                    if failing_since is None:
                        failing_since = now
                    if logged_at is None or now - logged_at >= LOG_EVERY:
                        logged_at = now
                        log.warning(
                            "store failed (%.1fs): %s: %s; the due ticks are retried",
                            now - failing_since,
                            type(exc).__name__,
                            exc,
                        )
                    await self._wakeup.wait(random.uniform(0.5, 1.0) * backoff)
                    backoff = min(MAX_BACKOFF, self.max_sleep, backoff * 2)
                    continue
                if failing_since is not None:
                    log.info("store back after %.1fs", _clock.monotonic() - failing_since)
                failing_since = logged_at = None
                backoff = 0.1
                await self._wakeup.wait(self._until_next())
        log.info("scheduler stopped")

    def _until_next(self) -> float:
        """Seconds until the next tick of any schedule (a millisecond past it), counted from the
        last read of the store's clock, at most ``max_sleep``."""
        if self._next_us is None:
            return self.max_sleep
        ahead = (self._next_us - self._now_us) / SECOND - (_clock.monotonic() - self._read_at)
        return max(0.001, min(self.max_sleep, ahead + 0.001))

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("%s: stopping", sig.name)
        self.stop()
