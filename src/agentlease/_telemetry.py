"""The seam between the queue and worker and an optional telemetry exporter (metrics, traces).

The queue and the worker call the hooks below only while an exporter is installed
(:func:`current` is not ``None``); otherwise each hook site costs one global read. The only
exporter is :mod:`agentlease.otel` (OpenTelemetry), installed by ``agentlease.otel.instrument()``;
this module imports nothing of it, so ``import agentlease`` and ``agentlease worker`` without
``--otel`` or ``--metrics-port`` load no OpenTelemetry module (``--metrics-port``,
:mod:`agentlease.prometheus`, installs the same exporter with a meter provider that
Prometheus scrapes).

One installed exporter per process, like the OpenTelemetry providers it feeds: instrumentation
follows the process (every queue client and worker in it), not one object.

Where each hook is called:

- :meth:`Telemetry.enqueuing` wraps an enqueue call (one span for the call); the carrier it
  yields (W3C ``traceparent`` and ``tracestate``) is stored in each task's context
  (:func:`agentlease._records.encode_context`), so the handler's spans, in whatever process
  claims the task, join the enqueuer's trace.
- :meth:`Telemetry.claimed`: the worker leased a job (a claim span under the task's trace).
- :meth:`Telemetry.run`: the worker starts a handler; the returned :class:`Run` is entered in
  the handler's context (its span is current there) and ended when the handler returns or raises.
- :meth:`Telemetry.event`: every :class:`~agentlease._events.Event` any queue client or worker
  emits (counters, and the completion, failure and dead-letter spans).
- :meth:`Telemetry.stats`: a worker's periodic read of its queue's stats (the depth gauge).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agentlease._events import Event
    from agentlease._records import Enqueued, Job, NewTask, QueueStats

__all__ = ["Run", "Telemetry", "current", "install", "uninstall"]


class Run(Protocol):
    """One handler run as the exporter sees it."""

    def enter(self) -> None:
        """Make the run's span current in the calling context (the handler's)."""

    def end(self, error: BaseException | None) -> None:
        """The handler returned (``error`` is ``None``) or raised ``error``."""


class Telemetry(Protocol):
    """What an exporter implements (see the module docstring for when each is called)."""

    stats_interval: float
    """Seconds between two reads of a worker's queue stats for the depth gauge."""

    def enqueuing(
        self, queue: str, tasks: Sequence[NewTask]
    ) -> AbstractContextManager[dict[str, str]]:
        """Wrap an enqueue of ``tasks``; yields the trace carrier to store in each task."""
        ...

    def enqueued(self, queue: str, results: Sequence[Enqueued]) -> None:
        """The enqueue inside :meth:`enqueuing` returned ``results``."""

    def claimed(self, job: Job, sent_ns: int) -> None:
        """A worker leased ``job`` by a claim sent at ``sent_ns`` (``time.time_ns()``)."""

    def run(self, job: Job) -> Run:
        """A worker starts ``job``'s handler."""
        ...

    def event(self, event: Event) -> None:
        """An event was emitted."""

    def stats(self, store: str, stats: QueueStats) -> None:
        """A worker read its queue's stats on the store named ``store`` (its URL)."""


_installed: list[Telemetry] = []  # at most one


def current() -> Telemetry | None:
    """The installed exporter, or ``None``."""
    return _installed[0] if _installed else None


def install(telemetry: Telemetry) -> None:
    """Install ``telemetry`` for the whole process (replacing any other)."""
    _installed[:] = [telemetry]


def uninstall(telemetry: Telemetry) -> None:
    """Remove ``telemetry`` if it is the one installed."""
    if _installed and _installed[0] is telemetry:
        _installed.clear()
