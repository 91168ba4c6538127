"""Structured events: what happened to which lease, for logs, metrics and tests.

Every event goes to the ``agentlease`` logger (with its fields as ``extra``) and to the optional
``on_event`` callback of the queue or worker that saw it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Event", "EventName", "Events"]

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
        """Record one event."""
        level = _LEVELS[name]
        if self.callback is None and not logger.isEnabledFor(level):
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
