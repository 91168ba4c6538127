"""Metrics and traces through OpenTelemetry (the ``otel`` extra: ``pip install agentlease[otel]``).

Call :func:`instrument` once per process (or run ``agentlease worker --otel``): every queue client
and worker in the process then reports to the tracer and meter providers given (the global ones
by default). Nothing here is imported by ``import agentlease``; without :func:`instrument` the
queue and the worker do not touch OpenTelemetry at all.

Traces. Each enqueue call is a span (``enqueue <queue>``, a producer span, the child of the span
current where the tasks are enqueued); its W3C trace context (``traceparent``, ``tracestate``) is
stored in each task's context (:attr:`agentlease.Task.trace_context`), so the process that
claims the task, on any machine, continues the trace: ``claim <queue>`` (from sending the claim to
its reply) and ``run <queue>`` (the handler; current while it runs, so spans the handler makes and
tasks it enqueues are its children) are children of the enqueue span, and ``complete``, ``fail``
and ``dead_letter <queue>`` (from the handler's return to the accepted write) are children of the
run span. Attributes follow OpenTelemetry's messaging conventions where they fit
(``messaging.system`` = ``agentlease``, ``messaging.destination.name`` = the queue,
``messaging.message.id`` = the task id, ``messaging.operation.type`` / ``.name``) and use
``agentlease.*`` for the rest (``agentlease.task.attempt``, ``agentlease.task.failures``,
``agentlease.task.reclaims``, ``agentlease.reason``, ...).

Metrics (meter ``agentlease``; every one has the ``messaging.destination.name`` attribute):

====================================  =========  ================================================
name                                  kind       what it counts or measures
====================================  =========  ================================================
``agentlease.tasks.enqueued``         counter    tasks created by enqueue (duplicates not counted)
``agentlease.tasks.claimed``          counter    leases handed to a worker
``agentlease.tasks.completed``        counter    completions the store accepted
``agentlease.tasks.failed``           counter    failed attempts set to be retried
``agentlease.tasks.dead_lettered``    counter    tasks given up on (``agentlease.reason``)
``agentlease.tasks.reaped``           counter    expired leases reaped (``agentlease.outcome``)
``agentlease.leases.lost``            counter    leases a worker lost while holding them
``agentlease.writes.refused``         counter    zombie writes: a holder's write refused because
                                                 its lease was gone (``agentlease.write``)
``agentlease.queue.latency``          histogram  seconds from due (enqueue, delay or retry time)
                                                 to claim, both on the store's clock
``agentlease.task.run_time``          histogram  seconds a handler ran (``agentlease.outcome``:
                                                 ``ok`` or ``error``)
``agentlease.queue.depth``            gauge      tasks by state (``agentlease.task.state``), from
                                                 each worker's read of its queue's stats every
                                                 ``stats_interval`` seconds
====================================  =========  ================================================

The counters and the settle spans are fed by the queue's and the worker's events
(:class:`agentlease.Event`), so they count what the store accepted or refused.

Prometheus: ``agentlease worker --metrics-port`` (:mod:`agentlease.prometheus`, the
``prometheus`` extra) serves these instruments on a ``/metrics`` endpoint through
OpenTelemetry's Prometheus exporter (``instrument_from_env(metric_readers=...)`` with
``--otel``).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING

from opentelemetry import metrics, trace
from opentelemetry.context import Context, attach
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from agentlease import _telemetry
from agentlease import _validate as check
from agentlease._events import Event
from agentlease._records import STATES, Enqueued, Job, NewTask, QueueStats

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

__all__ = ["Instrumentation", "instrument", "instrument_from_env"]

log = logging.getLogger("agentlease.otel")

SYSTEM = "agentlease"
QUEUE = "messaging.destination.name"
_PROPAGATOR = TraceContextTextMapPropagator()  # W3C, whatever the global propagator is
_MAX_PARENTS = 10_000  # leases whose span context is remembered for their settle span

_Attributes = dict[str, AttributeValue]


# Seconds, from a claim within milliseconds to an agent's task of an hour.
_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)


def _job_attributes(job: Job, operation: str, kind: str) -> _Attributes:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": kind,
        "messaging.operation.name": operation,
        QUEUE: job.lease.queue,
        "messaging.message.id": job.task_id,
        "agentlease.task.attempt": job.attempt,
        "agentlease.task.failures": job.failures,
        "agentlease.task.reclaims": job.reclaims,
    }


class _Run:
    """A handler run: its span, current in the handler's context."""

    def __init__(self, owner: Instrumentation, job: Job, parent: Context | None) -> None:
        self._owner = owner
        self._job = job
        self._started = time.monotonic()
        self.span = owner.tracer.start_span(
            f"run {job.lease.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=_job_attributes(job, "run", "process"),
        )

    def enter(self) -> None:
        # The handler's context is its own (a task, or a copied context on a thread): nothing
        # to detach afterwards.
        attach(trace.set_span_in_context(self.span))

    def end(self, error: BaseException | None) -> None:
        span = self.span
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end()
        job = self._job
        self._owner.run_time.record(
            time.monotonic() - self._started,
            {QUEUE: job.lease.queue, "agentlease.outcome": "ok" if error is None else "error"},
        )
        self._owner.remember(job, trace.set_span_in_context(span))


class Instrumentation:
    """The OpenTelemetry instruments agentlease reports to, installed for the process by
    :func:`instrument` (see the module docstring for the spans and metrics).

    Also a context manager: leaving it calls :meth:`uninstrument`.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        stats_interval: float = 15.0,
    ) -> None:
        self.stats_interval = check.duration(stats_interval, "stats_interval")
        from agentlease import __version__ as version

        self.tracer = trace.get_tracer(SYSTEM, version, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SYSTEM, version, meter_provider=meter_provider)

        def counter(name: str, description: str) -> metrics.Counter:
            return meter.create_counter(name, unit="{task}", description=description)

        self.enqueued_tasks = counter("agentlease.tasks.enqueued", "Tasks created by enqueue.")
        self.claimed_tasks = counter("agentlease.tasks.claimed", "Leases handed to a worker.")
        self.completed = counter("agentlease.tasks.completed", "Completions the store accepted.")
        self.failed = counter("agentlease.tasks.failed", "Failed attempts set to be retried.")
        self.dead_lettered = counter("agentlease.tasks.dead_lettered", "Tasks given up on.")
        self.reaped = counter("agentlease.tasks.reaped", "Expired leases reaped.")
        self.lost = counter("agentlease.leases.lost", "Leases lost by their holder.")
        self.refused = meter.create_counter(
            "agentlease.writes.refused",
            unit="{write}",
            description="Writes of a lease holder refused because its lease was gone.",
        )
        self.latency = meter.create_histogram(
            "agentlease.queue.latency",
            unit="s",
            description="Time from a task being due to its claim, on the store's clock.",
            explicit_bucket_boundaries_advisory=_BUCKETS,
        )
        self.run_time = meter.create_histogram(
            "agentlease.task.run_time",
            unit="s",
            description="Time a handler ran.",
            explicit_bucket_boundaries_advisory=_BUCKETS,
        )
        meter.create_observable_gauge(
            "agentlease.queue.depth",
            callbacks=[self._observe_depth],
            unit="{task}",
            description="Tasks by state, read from the queue's stats at most once an interval.",
        )
        self._lock = threading.Lock()
        self._depths: dict[tuple[str, str], QueueStats] = {}
        # (task id, attempt) -> the span context its settle span goes under, and its start.
        self._parents: OrderedDict[tuple[str, int], tuple[Context, int]] = OrderedDict()

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstrument()

    def uninstrument(self) -> None:
        """Stop reporting (the queue and the worker no longer call OpenTelemetry)."""
        _telemetry.uninstall(self)
        with self._lock:
            self._depths.clear()
            self._parents.clear()

    # -- the hooks of agentlease._telemetry.Telemetry -------------------------------------------

    @contextmanager
    def enqueuing(self, queue: str, tasks: Sequence[NewTask]) -> Iterator[dict[str, str]]:
        """The enqueue span; yields its W3C trace context for the tasks to carry."""
        attributes: _Attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "enqueue",
            QUEUE: queue,
        }
        if len(tasks) == 1:
            attributes["messaging.message.id"] = tasks[0].id
        else:
            attributes["messaging.batch.message_count"] = len(tasks)
        with self.tracer.start_as_current_span(
            f"enqueue {queue}", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            carrier: dict[str, str] = {}
            _PROPAGATOR.inject(carrier)
            yield carrier

    def enqueued(self, queue: str, results: Sequence[Enqueued]) -> None:
        created = sum(1 for r in results if r.created)
        trace.get_current_span().set_attribute("agentlease.tasks.created", created)
        if created:
            self.enqueued_tasks.add(created, {QUEUE: queue})

    def claimed(self, job: Job, sent_ns: int) -> None:
        parent = _PROPAGATOR.extract(job.trace_context) if job.trace_context else None
        span = self.tracer.start_span(
            f"claim {job.lease.queue}",
            context=parent,
            kind=SpanKind.CLIENT,
            attributes=_job_attributes(job, "claim", "receive"),
            start_time=sent_ns,
        )
        span.end()
        # A task enqueued untraced continues the trace its claim started.
        self.remember(job, parent or trace.set_span_in_context(span))

    def run(self, job: Job) -> _telemetry.Run:
        with self._lock:
            known = self._parents.get((job.task_id, job.attempt))
        parent = known[0] if known is not None else _PROPAGATOR.extract(job.trace_context)
        return _Run(self, job, parent)

    def remember(self, job: Job, context: Context) -> None:
        """Where ``job``'s next span goes (its settle span starts now)."""
        with self._lock:
            self._parents[(job.task_id, job.attempt)] = (context, time.time_ns())
            while len(self._parents) > _MAX_PARENTS:
                self._parents.popitem(last=False)

    def event(self, event: Event) -> None:
        name, fields = event.name, event.fields
        attributes: _Attributes = {QUEUE: event.queue}
        if name == "claimed":
            self.claimed_tasks.add(1, attributes)
            run_at, leased_at = fields.get("run_at"), fields.get("leased_at")
            if isinstance(run_at, int | float) and isinstance(leased_at, int | float):
                self.latency.record(max(0.0, float(leased_at) - float(run_at)), attributes)
        elif name == "completed":
            self.completed.add(1, attributes)
            self._settle(event, "complete")
        elif name == "failed":
            self.failed.add(1, attributes)
            self._settle(event, "fail")
        elif name == "dead_lettered":
            reason = fields.get("reason")
            self.dead_lettered.add(
                1, {**attributes, "agentlease.reason": str(reason or "failures")}
            )
            self._settle(event, "dead_letter")
        elif name == "reaped":
            self.reaped.add(1, {**attributes, "agentlease.outcome": str(fields.get("outcome"))})
        elif name == "released":
            with self._lock:
                self._parents.pop((event.task_id, event.attempt), None)
        elif name == "lease_lost":
            self.lost.add(1, attributes)
        elif name == "zombie_rejected":
            self.refused.add(1, {**attributes, "agentlease.write": str(fields.get("write"))})

    def stats(self, store: str, stats: QueueStats) -> None:
        with self._lock:
            self._depths[(store, stats.queue)] = stats

    # -- internals -------------------------------------------------------------------------------

    def _settle(self, event: Event, operation: str) -> None:
        """The span of a final write, under the run (or claim) of the same lease; none for a
        lease this process did not run (a reaper's dead letter, a bare ``fail`` call)."""
        with self._lock:
            known = self._parents.pop((event.task_id, event.attempt), None)
        if known is None:
            return
        parent, started = known
        attributes: _Attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "settle",
            "messaging.operation.name": operation,
            QUEUE: event.queue,
            "messaging.message.id": event.task_id,
            "agentlease.task.attempt": event.attempt,
        }
        for key in ("reason", "error", "retry_in"):
            value = event.fields.get(key)
            if isinstance(value, str | int | float) and not isinstance(value, bool):
                attributes[f"agentlease.{key}"] = value
        span = self.tracer.start_span(
            f"{operation} {event.queue}",
            context=parent,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=started,
        )
        if operation != "complete":
            span.set_status(Status(StatusCode.ERROR, str(event.fields.get("error", ""))))
        span.end()

    def _observe_depth(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            latest = list(self._depths.values())
        for stats in latest:
            for state in STATES:
                yield Observation(
                    stats.counts.get(state, 0),
                    {QUEUE: stats.queue, "agentlease.task.state": state},
                )


def instrument(
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    stats_interval: float = 15.0,
) -> Instrumentation:
    """Report agentlease's spans and metrics to OpenTelemetry, for the whole process.

    Replaces an earlier instrumentation. Call it before the workers start (a worker reads its
    queue's stats for the depth gauge only if it started instrumented).

    Args:
        tracer_provider: where spans go (default: the global tracer provider).
        meter_provider: where metrics go (default: the global meter provider).
        stats_interval: seconds between two reads of a worker's queue stats for
            ``agentlease.queue.depth`` (one read per worker and interval, however often the
            metrics are collected).

    Raises:
        InvalidDuration: ``stats_interval`` is not a positive number of seconds.

    Returns:
        The instrumentation; :meth:`Instrumentation.uninstrument` (or leaving it as a context
        manager) stops it.
    """
    installed = Instrumentation(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        stats_interval=stats_interval,
    )
    _telemetry.install(installed)
    return installed


def instrument_from_env(
    *,
    service_name: str = "agentlease-worker",
    stats_interval: float = 15.0,
    metric_readers: Sequence[object] = (),
) -> Callable[[], None]:
    """:func:`instrument` with the global providers, as ``agentlease worker --otel`` does.

    When the OpenTelemetry SDK is installed and no global provider is set (as
    ``opentelemetry-instrument`` would set them), this sets SDK providers configured the
    standard way by the ``OTEL_*`` environment variables: the exporters named by
    ``OTEL_TRACES_EXPORTER`` and ``OTEL_METRICS_EXPORTER`` (default ``otlp``; ``console``;
    ``none``; any installed exporter's entry point name), ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` for the resource (service name ``service_name`` by default), and
    each exporter's own variables (``OTEL_EXPORTER_OTLP_ENDPOINT``, ...). Without the SDK the
    global providers are OpenTelemetry's no-op ones unless the application set others.

    ``metric_readers`` (SDK metric readers, such as the Prometheus one of
    ``agentlease worker --metrics-port``) read agentlease's metrics too: they need the SDK, and
    the metrics then go to a meter provider of this function's (the global one if none was set)
    with those readers and the exporters the environment names. ``stats_interval`` is
    :func:`instrument`'s.

    Returns:
        A function that flushes and shuts down the providers set here (nothing if none was).
    """
    try:
        from opentelemetry import sdk  # noqa: F401
    except ImportError:
        if metric_readers:
            raise
        instrument(stats_interval=stats_interval)
        return lambda: None
    return _instrument_with_sdk(service_name, stats_interval, metric_readers)


def _resource(service_name: str) -> Resource:
    """The SDK resource: the ``OTEL_*`` variables', with ``service_name`` unless they name one."""
    from opentelemetry.sdk.resources import Resource

    named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    return Resource.create({} if named else {"service.name": service_name})


def _instrument_with_sdk(
    service_name: str, stats_interval: float, extra_readers: Sequence[object]
) -> Callable[[], None]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = _resource(service_name)
    meter_provider: MeterProvider | None = None
    shutdowns: list[Callable[[], object]] = []
    if type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider":
        tracers = SdkTracerProvider(resource=resource)
        for exporter in _exporters("OTEL_TRACES_EXPORTER", "opentelemetry_traces_exporter"):
            tracers.add_span_processor(BatchSpanProcessor(exporter))  # type: ignore[arg-type]
        trace.set_tracer_provider(tracers)
        shutdowns.append(tracers.shutdown)
    unset = type(metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider"
    if unset or extra_readers:
        readers: list[MetricReader] = [r for r in extra_readers if isinstance(r, MetricReader)]
        for exporter in _exporters("OTEL_METRICS_EXPORTER", "opentelemetry_metrics_exporter"):
            if isinstance(exporter, MetricReader):
                readers.append(exporter)  # a pull reader (Prometheus)
            else:
                readers.append(PeriodicExportingMetricReader(exporter))  # type: ignore[arg-type]
        meters = MeterProvider(resource=resource, metric_readers=readers)
        if unset:
            metrics.set_meter_provider(meters)
        if extra_readers:
            meter_provider = meters  # the application's provider, if set, lacks the readers
        shutdowns.append(meters.shutdown)
    installed = instrument(meter_provider=meter_provider, stats_interval=stats_interval)

    def shutdown() -> None:
        installed.uninstrument()
        for stop in shutdowns:
            try:
                stop()
            except Exception:  # an exporter that cannot flush must not fail the exit
                log.exception("OpenTelemetry provider shutdown failed")

    return shutdown


def _exporters(variable: str, group: str) -> list[object]:
    """The exporters named (comma-separated) by the environment ``variable``, from the entry
    points of ``group``; an unknown name is logged and skipped."""
    names = [n.strip() for n in os.environ.get(variable, "otlp").split(",") if n.strip()]
    out: list[object] = []
    for name in names:
        if name == "none":
            continue
        found = importlib.metadata.entry_points(group=group, name=name)
        if not found:
            log.warning(
                "%s=%s: no such OpenTelemetry exporter is installed (skipped)", variable, name
            )
            continue
        try:
            out.append(next(iter(found)).load()())
        except Exception:
            log.exception("OpenTelemetry exporter %r could not be created (skipped)", name)
    return out
