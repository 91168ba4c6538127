"""Structured events: what happened to which lease, for logs, metrics and tests.

Every event goes to the ``agentlease`` logger (with its fields as ``extra``), to the optional
``on_event`` callback of the queue or worker that saw it, and to the installed telemetry exporter
(:mod:`agentlease._telemetry`: OpenTelemetry's counters and spans), if any.

A worker delivers its events through an :class:`EventDispatcher`: the heartbeat and watchdog
threads only put them in a bounded queue, and one thread of the dispatcher's own runs the
callback and the logging I/O. So a slow or raising callback, or a blocked stderr pipe, never
delays a renewal. When the queue is full an event is counted, not kept, and the count is logged.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from agentlease import _telemetry

__all__ = ["Event", "EventDispatcher", "EventName", "Events"]

EventName = Literal[
    "claimed",
    "extended",
    "lease_lost",
    "reaped",
    "zombie_rejected",
    "dead_lettered",
    "released",
    "completed",
    "failed",
]

logger = logging.getLogger("agentlease")

_LEVELS: dict[str, int] = {
    "claimed": logging.DEBUG,
    "extended": logging.DEBUG,
    "completed": logging.DEBUG,
    "released": logging.INFO,
    "failed": logging.INFO,
    "reaped": logging.WARNING,
    "lease_lost": logging.WARNING,
    "zombie_rejected": logging.WARNING,
    "dead_lettered": logging.ERROR,
}


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened to one task's lease.

    Attributes:
        name: what happened.
        queue: the task's queue.
        task_id: the task.
        attempt: the fencing number of the lease concerned.
        fields: anything else worth knowing (reason, outcome, lease age, ...).
    """

    name: EventName
    queue: str
    task_id: str
    attempt: int
    fields: dict[str, object] = field(default_factory=dict)


class Events:
    """Delivers events to the logger and a callback; a failing callback never breaks the caller."""

    def __init__(self, callback: Callable[[Event], None] | None = None) -> None:
        self.callback = callback

    def emit(
        self, name: EventName, queue: str, task_id: str, attempt: int, **fields: object
    ) -> None:
        """Record one event.

        A field ``exc_info`` (the exception a failed attempt raised) is not one of the event's
        fields: the log record carries it, so the log shows its traceback.
        """
        level = _LEVELS[name]
        exc = fields.pop("exc_info", None)
        telemetry = _telemetry.current()
        if self.callback is None and telemetry is None and not logger.isEnabledFor(level):
            return
        event = Event(name, queue, task_id, attempt, fields)
        logger.log(
            level,
            "%s %s/%s attempt=%d %s",
            name,
            queue,
            task_id,
            attempt,
            fields or "",
            exc_info=exc if isinstance(exc, BaseException) else None,
            extra={
                "agentlease_event": name,
                "queue": queue,
                "task_id": task_id,
                "attempt": attempt,
                **{f"agentlease_{k}": v for k, v in fields.items()},
            },
        )
        if self.callback is not None:
            try:
                self.callback(event)
            except Exception:
                logger.exception("on_event callback failed for %s", name)
        if telemetry is not None:
            try:
                telemetry.event(event)
            except Exception:
                logger.exception("telemetry failed for event %s", name)


_Pending = tuple[EventName, str, str, int, dict[str, object]]


class EventDispatcher:
    """Delivers events on a thread of its own, so that the threads which emit them never wait.

    :meth:`emit` never blocks and runs no user code: it puts the event in a bounded queue (or
    counts it as dropped when the queue is full). The dispatcher's thread hands each event to
    ``events`` (the logger and the callback), and logs how many were dropped.

    Args:
        events: where the events go.
        capacity: the most events waiting at once.
        report_every: the shortest time between two warnings about dropped events (seconds).
    """

    def __init__(
        self, events: Events, *, capacity: int = 10_000, report_every: float = 10.0
    ) -> None:
        self.events = events
        self._queue: queue.Queue[_Pending | None] = queue.Queue(maxsize=capacity)
        self._lock = threading.Lock()
        self._dropped = 0
        self._reported = 0
        self._report_every = report_every
        self._reported_at = 0.0
        self._thread: threading.Thread | None = None

    @property
    def dropped(self) -> int:
        """Events dropped so far because the queue was full."""
        return self._dropped

    def start(self) -> None:
        """Start the delivering thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="agentlease-events", daemon=True)
            self._thread.start()

    def emit(
        self, name: EventName, queue: str, task_id: str, attempt: int, **fields: object
    ) -> None:
        """Queue one event for delivery; never blocks."""
        if (
            self.events.callback is None
            and _telemetry.current() is None
            and not logger.isEnabledFor(_LEVELS[name])
        ):
            return
        try:
            self._queue.put_nowait((name, queue, task_id, attempt, fields))
        except _Full:
            with self._lock:
                self._dropped += 1

    def stop(self, timeout: float = 2.0) -> None:
        """Deliver what is queued (for up to ``timeout`` seconds), then stop the thread."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._queue.put(None, timeout=max(0.01, deadline - time.monotonic()))
                break
            except _Full:
                if time.monotonic() >= deadline:
                    break
        thread.join(max(0.0, deadline - time.monotonic()))
        self._report(force=True)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            name, queue_name, task_id, attempt, fields = item
            self.events.emit(name, queue_name, task_id, attempt, **fields)
            if self._dropped != self._reported:
                self._report(force=False)

    def _report(self, *, force: bool) -> None:
        now = time.monotonic()
        with self._lock:
            new = self._dropped - self._reported
            if new <= 0 or (not force and now - self._reported_at < self._report_every):
                return
            self._reported, self._reported_at = self._dropped, now
        logger.warning(
            "%d agentlease events were dropped (%d in all): the on_event callback or the log "
            "handler could not keep up",
            new,
            self._dropped,
        )


_Full = queue.Full
