"""The dashboard's ``/metrics``: the store's queues in the Prometheus text format.

Per queue (label ``queue``): ``agentlease_queue_tasks`` (tasks by ``state``, from the queue's
stats), ``agentlease_queue_leases`` (tasks held under a lease), ``agentlease_queue_dead_letters``,
``agentlease_queue_oldest_queued_age_seconds`` (only while a task is queued) and
``agentlease_queue_workers`` (live workers registered for the queue); and
``agentlease_workers`` (the store's live workers). The store is read at most once per
``interval`` seconds however often the endpoint is scraped (concurrent scrapes share one read),
and the text format is written here: label values are escaped as the format says (backslash,
double quote, line feed), so no queue name can forge a line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from agentlease._async.queue import AsyncQueue
from agentlease._records import STATES

__all__ = ["CONTENT_TYPE", "MetricsCache", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_FAMILIES = (
    ("agentlease_queue_tasks", "Tasks of the queue by state."),
    ("agentlease_queue_leases", "Tasks of the queue held under a lease."),
    ("agentlease_queue_dead_letters", "Dead-lettered tasks of the queue."),
    (
        "agentlease_queue_oldest_queued_age_seconds",
        "Seconds the oldest queued task of the queue has waited.",
    ),
    ("agentlease_queue_workers", "Live workers registered for the queue."),
    ("agentlease_workers", "Live workers of the store."),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


async def render(queue: AsyncQueue) -> str:
    """Read the store once (its queues' stats and its live workers) and write the metrics."""
    samples: dict[str, list[str]] = {name: [] for name, _ in _FAMILIES}

    def add(name: str, value: float, labels: Iterable[tuple[str, str]] = ()) -> None:
        pairs = ",".join(f'{k}="{_label(v)}"' for k, v in labels)
        samples[name].append(
            f"{name}{{{pairs}}} {_number(value)}" if pairs else f"{name} {_number(value)}"
        )

    workers = await queue.workers()
    per_queue: dict[str, int] = {}
    for worker in workers:
        served = worker.info.get("queues")
        for name in served if isinstance(served, list) else []:
            if isinstance(name, str):
                per_queue[name] = per_queue.get(name, 0) + 1
    for name in await queue.queues():
        stats = await queue.stats(name)
        on = [("queue", name)]
        for state in STATES:
            add("agentlease_queue_tasks", stats.counts.get(state, 0), [*on, ("state", state)])
        add("agentlease_queue_leases", stats.counts.get("leased", 0), on)
        add("agentlease_queue_dead_letters", stats.counts.get("dead", 0), on)
        if stats.oldest_queued_age is not None:
            add("agentlease_queue_oldest_queued_age_seconds", stats.oldest_queued_age, on)
        add("agentlease_queue_workers", per_queue.get(name, 0), on)
    add("agentlease_workers", len(workers))
    lines: list[str] = []
    for name, description in _FAMILIES:
        lines += [f"# HELP {name} {description}", f"# TYPE {name} gauge", *samples[name]]
    return "\n".join(lines) + "\n"


class MetricsCache:
    """The last text :func:`render` wrote, kept for ``interval`` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._text: str | None = None
        self._read_at = 0.0
        self._lock = asyncio.Lock()

    async def get(self, queue: AsyncQueue) -> str:
        """The metrics, read from the store if the last read is older than the interval."""
        async with self._lock:
            if self._text is None or time.monotonic() - self._read_at >= self.interval:
                self._text = await render(queue)
                self._read_at = time.monotonic()
            return self._text

    def forget(self) -> None:
        """Read the store at the next scrape (after a failed read)."""
        self._text = None
