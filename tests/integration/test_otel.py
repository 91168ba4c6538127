"""Metrics and traces of a real worker through OpenTelemetry (the SDK's in-memory exporter and
reader): the spans of enqueue, claim, run and the final writes, with their parent/child links and
attributes, and metric values that match what happened, on memory and SQLite; a handler in a
child process joins the trace of the task's enqueue in this one."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import agentlease as al
from agentlease.backends.memory import MemoryBackend
from agentlease.otel import instrument

Q = "jobs"


@dataclass
class Otel:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider

    def finished(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]

    def points(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        out: dict[str, list[Any]] = {}
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    out.setdefault(metric.name, []).extend(metric.data.data_points)
        return out

    def total(self, name: str, **attributes: str) -> int:
        return sum(
            p.value
            for p in self.points().get(name, [])
            if all(p.attributes.get(k) == v for k, v in attributes.items())
        )


@pytest.fixture
def otel() -> Iterator[Otel]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    with instrument(
        tracer_provider=tracer_provider, meter_provider=meter_provider, stats_interval=0.05
    ):
        yield Otel(spans, reader, tracer_provider)
    tracer_provider.shutdown()
    meter_provider.shutdown()


def _queue(kind: str, sqlite_url: str) -> al.Queue:
    return al.Queue(MemoryBackend()) if kind == "memory" else al.Queue.connect(sqlite_url)


def _parent(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def _id(span: ReadableSpan) -> int:
    ctx = span.get_span_context()
    assert ctx is not None
    return ctx.span_id


def _by_task(spans: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        out.setdefault(str(span.attributes["messaging.message.id"]), []).append(span)  # type: ignore[index]
    return out


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_worker_reports_the_spans_and_metrics_of_what_happened(
    otel: Otel, kind: str, sqlite_url: str
) -> None:
    queue = _queue(kind, sqlite_url)
    app = otel.tracer_provider.get_tracer("app")
    with app.start_as_current_span("request"):
        queue.enqueue_many(Q, [al.TaskSpec(payload=n, id=f"ok{n}") for n in range(3)])
        queue.enqueue(Q, "flaky", id="flaky")
        queue.enqueue(Q, "poison", id="poison")
    queue.enqueue(Q, "again", id="ok0")  # exists: nothing created, nothing counted
    leases: dict[str, al.Lease] = {}

    def handler(ctx: al.JobContext) -> al.JSON:
        leases[ctx.task_id] = ctx.lease
        with app.start_as_current_span("inside the handler"):
            if ctx.payload == "poison":
                raise ValueError("never")
            if ctx.payload == "flaky" and ctx.attempt == 1:
                raise RuntimeError("once")
        return ctx.payload

    policy = al.RetryPolicy(max_failures=3, base=0.001, cap=0.001, non_retryable=(ValueError,))
    settings = al.WorkerSettings(retry=policy, poll_interval=0.02)
    for _ in range(50):  # burst runs until the retried task is done (its retry may not be due)
        al.Worker(queue, Q, handler, settings=settings).run(burst=True, handle_signals=False)
        if queue.get("flaky").state == "done":
            break
    assert [queue.get(t).state for t in ("ok0", "ok1", "ok2", "flaky", "poison")] == [
        "done",
        "done",
        "done",
        "done",
        "dead",
    ]
    with pytest.raises(al.LeaseLost):  # a zombie write: the lease of a finished attempt
        queue.complete(leases["ok1"], "late")

    # -- metrics --
    assert otel.total("agentlease.tasks.enqueued", **{"messaging.destination.name": Q}) == 5
    assert otel.total("agentlease.tasks.claimed") == 6  # flaky twice
    assert otel.total("agentlease.tasks.completed") == 4
    assert otel.total("agentlease.tasks.failed") == 1
    assert otel.total("agentlease.tasks.dead_lettered", **{"agentlease.reason": "failures"}) == 1
    assert otel.total("agentlease.writes.refused", **{"agentlease.write": "complete"}) == 1
    assert otel.total("agentlease.tasks.reaped") == 0
    points = otel.points()
    run_times = points["agentlease.task.run_time"]
    run_time = {p.attributes["agentlease.outcome"]: p.count for p in run_times}
    assert run_time == {"ok": 4, "error": 2}
    (latency,) = points["agentlease.queue.latency"]
    assert latency.count == 6
    assert latency.min >= 0.0
    depths = points["agentlease.queue.depth"]
    depth = {p.attributes["agentlease.task.state"]: p.value for p in depths}
    assert set(depth) == {
        "parked",
        "scheduled",
        "queued",
        "leased",
        "failed",
        "done",
        "dead",
        "cancelled",
    }
    assert sum(depth.values()) == 5  # one snapshot of the five tasks
    assert {p.attributes["messaging.destination.name"] for p in depths} == {Q}
    queue.close()

    # -- spans --
    (request,) = otel.finished("request")
    trace_id = request.context.trace_id
    enqueues = otel.finished(f"enqueue {Q}")
    assert len(enqueues) == 4  # the duplicate's enqueue too, outside the request
    assert all(s.kind is SpanKind.PRODUCER for s in enqueues)
    traced = [s for s in enqueues if s.context.trace_id == trace_id]
    assert len(traced) == 3
    assert all(_parent(s) == _id(request) for s in traced)
    batch = next(s for s in traced if s.attributes.get("messaging.batch.message_count") == 3)
    producer = {f"ok{n}": batch for n in range(3)}
    for span in traced:
        if span is not batch:
            producer[str(span.attributes["messaging.message.id"])] = span
    assert set(producer) == {"ok0", "ok1", "ok2", "flaky", "poison"}

    claims = _by_task(otel.finished(f"claim {Q}"))
    runs = _by_task(otel.finished(f"run {Q}"))
    completes = _by_task(otel.finished(f"complete {Q}"))
    fails = _by_task(otel.finished(f"fail {Q}"))
    deads = _by_task(otel.finished(f"dead_letter {Q}"))
    assert {t: len(s) for t, s in runs.items()} == {
        "ok0": 1,
        "ok1": 1,
        "ok2": 1,
        "flaky": 2,
        "poison": 1,
    }
    for task_id, made_by in producer.items():
        for span in claims[task_id] + runs[task_id]:
            assert span.context.trace_id == trace_id, (task_id, span.name)
            assert _parent(span) == _id(made_by), (task_id, span.name)
    for task_id in ("ok0", "ok1", "ok2"):
        (run,) = runs[task_id]
        (complete,) = completes[task_id]
        assert _parent(complete) == _id(run)
        assert run.kind is SpanKind.CONSUMER
        assert run.status.status_code is StatusCode.UNSET
        assert run.attributes["messaging.destination.name"] == Q
        assert run.attributes["agentlease.task.attempt"] == 1
        assert run.attributes["messaging.system"] == "agentlease"
    first, second = sorted(runs["flaky"], key=lambda s: s.attributes["agentlease.task.attempt"])
    assert first.status.status_code is StatusCode.ERROR
    assert any(e.name == "exception" for e in first.events)
    (fail,) = fails["flaky"]
    assert _parent(fail) == _id(first)
    (complete,) = completes["flaky"]
    assert _parent(complete) == _id(second)
    assert second.attributes["agentlease.task.attempt"] == 2
    (dead,) = deads["poison"]
    assert _parent(dead) == _id(runs["poison"][0])
    assert dead.status.status_code is StatusCode.ERROR
    inside = otel.finished("inside the handler")
    assert len(inside) == 6
    run_ids = {_id(s) for spans in runs.values() for s in spans}
    assert {_parent(s) for s in inside} == run_ids  # the handler's own spans are children


async def test_an_async_handler_runs_inside_its_span_and_its_children_join_the_trace(
    otel: Otel,
) -> None:
    queue = al.AsyncQueue(MemoryBackend().open_async())
    await queue.enqueue(Q, "parent", id="parent")

    async def handler(ctx: al.AsyncJobContext) -> al.JSON:
        if ctx.payload == "parent":
            await queue.enqueue(Q, "child", id="child")
        await asyncio.sleep(0)
        return None

    await al.AsyncWorker(queue, Q, handler).run(burst=True, handle_signals=False)
    runs = _by_task(otel.finished(f"run {Q}"))
    enqueues = _by_task(otel.finished(f"enqueue {Q}"))
    (parent_run,), (child_run,) = runs["parent"], runs["child"]
    (child_enqueue,) = enqueues["child"]
    assert _parent(child_enqueue) == _id(parent_run)  # enqueued inside the parent's run
    assert _parent(child_run) == _id(child_enqueue)
    trace_ids = {s.context.trace_id for s in otel.spans.get_finished_spans()}
    assert len(trace_ids) == 1
    await queue.close()


def test_an_untraced_task_gets_a_trace_of_its_own_at_the_claim(otel: Otel) -> None:
    from agentlease import _telemetry

    queue = al.Queue(MemoryBackend())
    saved = _telemetry.current()
    assert saved is not None
    _telemetry.uninstall(saved)
    queue.enqueue(Q, 1, id="plain")  # not instrumented: no trace context stored
    _telemetry.install(saved)
    al.Worker(queue, Q, lambda ctx: None).run(burst=True, handle_signals=False)
    (claim,) = otel.finished(f"claim {Q}")
    (run,) = otel.finished(f"run {Q}")
    assert claim.parent is None
    assert _parent(run) == _id(claim)
    assert run.context.trace_id == claim.context.trace_id


CHILD = textwrap.dedent(
    """
    import json, sys
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    import agentlease as al
    from agentlease.otel import instrument

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    instrument(tracer_provider=provider)
    queue = al.Queue.connect(sys.argv[1])
    al.Worker(queue, "jobs", lambda ctx: ctx.payload).run(burst=True, handle_signals=False)
    queue.close()
    print(json.dumps([
        {"name": s.name, "trace": s.context.trace_id, "span": s.context.span_id,
         "parent": None if s.parent is None else s.parent.span_id}
        for s in spans.get_finished_spans()
    ]))
    """
)


def test_a_handler_in_another_process_joins_the_enqueuers_trace(
    otel: Otel, sqlite_url: str, tmp_path: Path
) -> None:
    with al.Queue.connect(sqlite_url) as queue:
        queue.enqueue(Q, 1, id="remote")
    (enqueue,) = otel.finished(f"enqueue {Q}")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = subprocess.run(
        [sys.executable, str(script), sqlite_url],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    spans = {s["name"]: s for s in json.loads(out.stdout)}
    assert set(spans) == {f"claim {Q}", f"run {Q}", f"complete {Q}"}
    assert {s["trace"] for s in spans.values()} == {enqueue.context.trace_id}
    assert spans[f"run {Q}"]["parent"] == _id(enqueue)
    assert spans[f"claim {Q}"]["parent"] == _id(enqueue)
    assert spans[f"complete {Q}"]["parent"] == spans[f"run {Q}"]["span"]
    with al.Queue.connect(sqlite_url) as queue:
        assert queue.get("remote").state == "done"


def test_the_worker_command_with_otel_exports_spans_and_metrics_configured_by_the_environment(
    otel: Otel, sqlite_url: str, tmp_path: Path
) -> None:
    """``agentlease worker --otel`` with the SDK installed: the OTEL_* variables choose the
    exporters (console here), and the handler's run joins the trace of the enqueue made here."""
    (tmp_path / "otel_handlers.py").write_text("def double(ctx):\n    return ctx.payload * 2\n")
    with al.Queue.connect(sqlite_url) as queue:
        queue.enqueue(Q, 21, id="cli")
    (enqueue,) = otel.finished(f"enqueue {Q}")
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_METRICS_EXPORTER": "console",
        "OTEL_SERVICE_NAME": "otel-test-worker",
    }
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentlease",
            "worker",
            "otel_handlers:double",
            "--backend",
            sqlite_url,
            "-q",
            Q,
            "--burst",
            "--poll-interval",
            "0.05",
            "--otel",
        ],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    with al.Queue.connect(sqlite_url) as queue:
        assert queue.get("cli").result == 42
    trace_id = f"0x{enqueue.context.trace_id:032x}"
    assert f'"name": "run {Q}"' in out.stdout
    assert f'"trace_id": "{trace_id}"' in out.stdout
    assert f'"parent_id": "0x{_id(enqueue):016x}"' in out.stdout
    assert '"service.name": "otel-test-worker"' in out.stdout
    assert '"name": "agentlease.tasks.completed"' in out.stdout


def test_the_worker_command_without_the_otel_api_names_the_extra(
    sqlite_url: str, tmp_path: Path
) -> None:
    (tmp_path / "opentelemetry").mkdir()  # a package that shadows the API and cannot load
    (tmp_path / "opentelemetry" / "__init__.py").write_text("raise ImportError('not here')\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentlease",
            "worker",
            "json:dumps",
            "--backend",
            sqlite_url,
            "-q",
            Q,
            "--burst",
            "--otel",
        ],
        check=False,
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "agentlease[otel]" in out.stderr


class _CountingMemory(MemoryBackend):
    """The memory store, counting its stats reads."""

    reads = 0

    def stats(self, queue: str) -> al.QueueStats:
        self.reads += 1
        return super().stats(queue)


def test_the_depth_gauge_reads_the_store_once_per_interval_however_often_it_is_collected() -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    backend = _CountingMemory()
    queue = al.Queue(backend)
    queue.enqueue_many(Q, [1, 2, 3])
    seen: list[dict[str, int]] = []

    def handler(ctx: al.JobContext) -> al.JSON:
        if ctx.payload != 1:
            return None
        for _ in range(500):  # the worker's first read happens as it starts
            if backend.reads:
                break
            time.sleep(0.01)
        for _ in range(5):
            data = reader.get_metrics_data()
            assert data is not None
            seen.append(
                {
                    str(p.attributes["agentlease.task.state"]): int(p.value)
                    for r in data.resource_metrics
                    for s in r.scope_metrics
                    for m in s.metrics
                    if m.name == "agentlease.queue.depth"
                    for p in m.data.data_points
                }
            )
        return None

    with instrument(meter_provider=meters, stats_interval=3600.0):
        al.Worker(queue, Q, handler).run(burst=True, handle_signals=False)
    assert backend.reads == 1
    assert len(seen) == 5
    assert all(s == seen[0] for s in seen)
    assert sum(seen[0].values()) == 3
    meters.shutdown()


def test_a_reaped_lease_and_its_holders_late_write_are_counted(otel: Otel) -> None:
    queue = al.Queue(MemoryBackend())
    queue.enqueue(Q, 1, id="stuck")
    (stale,) = queue.claim(Q, lease_for=0.2)  # a holder that stops heartbeating
    time.sleep(0.3)
    al.Worker(queue, Q, lambda ctx: "done").run(burst=True, handle_signals=False)
    with pytest.raises(al.LeaseLost):
        queue.progress(stale.lease, "still here")
    assert queue.get("stuck").state == "done"
    assert otel.total("agentlease.tasks.reaped", **{"agentlease.outcome": "requeued"}) == 1
    assert otel.total("agentlease.tasks.claimed") == 1  # the worker's claim (the stale one was
    # made outside a worker, by a bare claim call)
    assert otel.total("agentlease.tasks.completed") == 1
    assert otel.total("agentlease.writes.refused", **{"agentlease.write": "progress"}) == 1
    (run,) = otel.finished(f"run {Q}")
    assert run.attributes["agentlease.task.attempt"] == 2
    assert run.attributes["agentlease.task.reclaims"] == 1


def test_a_bad_stats_interval_is_refused_and_installs_nothing() -> None:
    from agentlease import _telemetry

    with pytest.raises(al.InvalidDuration, match="stats_interval"):
        instrument(stats_interval=0)
    assert _telemetry.current() is None
