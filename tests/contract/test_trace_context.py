"""The W3C trace context of an instrumented enqueue on every backend of the ``store`` fixture:
stored in the task's context at enqueue, handed back by claim (in the job) and get (in the task),
kept through a retry and beside the root task; an enqueue without instrumentation stores none."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentlease import TaskSpec
from agentlease.otel import Instrumentation, instrument
from tests.conftest import Store

Q = "traced"


@pytest.fixture
def spans() -> Iterator[tuple[InMemorySpanExporter, TracerProvider, Instrumentation]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with instrument(tracer_provider=provider) as installed:
        yield exporter, provider, installed
    provider.shutdown()


def _traceparent(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def test_trace_context_round_trips_through_enqueue_claim_get_and_retry(
    store: Store, spans: tuple[InMemorySpanExporter, TracerProvider, Instrumentation]
) -> None:
    exporter, provider, _ = spans
    q = store.queue()
    with provider.get_tracer("app").start_as_current_span("request") as request:
        q.enqueue(Q, {"n": 1}, id="one")
        q.enqueue_many(Q, [TaskSpec(payload=2, id="two"), TaskSpec(payload=3, id="three")])
    enqueues = [s for s in exporter.get_finished_spans() if s.name == f"enqueue {Q}"]
    assert len(enqueues) == 2
    trace_id = request.get_span_context().trace_id
    for span in enqueues:
        assert span.context is not None
        assert span.parent is not None
        assert span.context.trace_id == trace_id
        assert span.parent.span_id == request.get_span_context().span_id
    single, batch = (_traceparent(span) for span in enqueues)
    expected = {"one": single, "two": batch, "three": batch}
    for task_id, traceparent in expected.items():
        assert q.get(task_id).trace_context == {"traceparent": traceparent}
    jobs = {j.task_id: j for j in q.claim(Q, n=5, lease_for=30.0)}
    assert {t: j.trace_context.get("traceparent") for t, j in jobs.items()} == expected
    assert jobs["one"].root_id == "one"  # the rest of the context is as before

    q.fail(jobs["one"].lease, ValueError("again"), retry_in=0.0)
    (retried,) = [j for j in q.claim(Q, n=5, lease_for=30.0) if j.task_id == "one"]
    assert retried.attempt == 2
    assert retried.trace_context == {"traceparent": expected["one"]}


def test_an_untraced_enqueue_stores_no_trace_context(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, 1, id="plain")
    assert q.get("plain").context_json is None
    (job,) = q.claim(Q, lease_for=30.0)
    assert job.trace_context == {}
    assert job.context_json is None


def test_trace_state_and_the_root_task_share_the_context(
    store: Store, spans: tuple[InMemorySpanExporter, TracerProvider, Instrumentation]
) -> None:
    from opentelemetry import context, trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    from agentlease._deadline import enter_work

    q = store.queue()
    remote = SpanContext(
        trace_id=0x1234,
        span_id=0x99,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "v1")]),
    )

    def enqueue_in_a_handler() -> None:
        enter_work("root-7", None, None)  # as inside a handler of task root-7
        context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
        q.enqueue(Q, 1, id="child")

    contextvars.copy_context().run(enqueue_in_a_handler)  # leaves this context as it was
    task = q.get("child")
    assert task.root_id == "root-7"
    assert task.trace_context["tracestate"] == "vendor=v1"
    assert task.trace_context["traceparent"].startswith(f"00-{0x1234:032x}-")
    (job,) = q.claim(Q, lease_for=30.0)
    assert job.trace_context == task.trace_context
    assert job.root_id == "root-7"


def test_a_claim_hands_each_job_the_time_its_task_became_due(store: Store) -> None:
    """The queue latency (``leased_at - run_at``, both on the store's clock) comes from the
    claim alone: the job carries its task's due time, the enqueue time or a retry's."""
    q = store.queue()
    q.enqueue_many(Q, [TaskSpec(payload=n, id=f"t{n}") for n in range(3)])
    due = {f"t{n}": q.get(f"t{n}").run_at for n in range(3)}
    jobs = q.claim(Q, n=2, lease_for=30.0)
    jobs += q.claim(Q, n=2, lease_for=30.0)  # one batch of two, then a single claim
    assert {j.task_id: j.run_at for j in jobs} == pytest.approx(due, abs=1e-6)
    assert all(j.lease.leased_at >= (j.run_at or 0.0) for j in jobs)
    q.fail(jobs[0].lease, ValueError("again"), retry_in=0.0)
    retry_at = q.get(jobs[0].task_id).run_at
    (again,) = q.claim(Q, lease_for=30.0)
    assert again.run_at == pytest.approx(retry_at, abs=1e-6)
