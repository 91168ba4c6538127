"""The public API is exactly this: adding or removing a name is a deliberate change."""

from __future__ import annotations

import subprocess
import sys

import pytest

import agentlease

PUBLIC = {
    "versioned_update",
    "AsyncCounterHold",
    "AsyncLockSet",
    "CounterHold",
    "AsyncSharedState",
    "LockSet",
    "ModelCall",
    "SharedState",
    "StateMachine",
    "Versioned",
    "held_locks",
    "model_call",
    "ConflictError",
    "FencedOff",
    "GuardError",
    "HoldLost",
    "LimitReached",
    "LockHeldAcrossModelCall",
    "LockLost",
    "LockTimeout",
    "NotLockOwner",
    "TransitionRefused",
    "Action",
    "AsyncAction",
    "AsyncIdempotency",
    "AsyncIdempotentFunction",
    "DuplicateInFlight",
    "IdempotencyConflict",
    "IdempotencyError",
    "Idempotency",
    "IdempotencySettings",
    "IdempotentFunction",
    "KeyRecord",
    "KeyState",
    "MissingIdentity",
    "NotApplied",
    "Outcome",
    "ReplayedFailure",
    "ReservationLost",
    "current_fence",
    "current_key",
    "idempotency_scope",
    "idempotent",
    "JSON",
    "AgentLeaseError",
    "AsyncBackend",
    "AsyncJobContext",
    "AsyncQueue",
    "AsyncWorker",
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "BackendRefused",
    "AuthenticationFailed",
    "PermissionDenied",
    "SchemaNotMigrated",
    "SchemaTooNew",
    "TLSRefused",
    "Cancelled",
    "CancelOutcome",
    "Cancellation",
    "TaskCancelled",
    "QueueInUse",
    "TaskTimeout",
    "AsyncFactBoard",
    "FactBoard",
    "Fact",
    "LatestByVersion",
    "MustAgree",
    "Policy",
    "PreferSource",
    "Union",
    "reconcile",
    "ReconciliationConflict",
    "PlanDiverged",
    "PlanExpired",
    "PlanReceipt",
    "Plan",
    "AsyncPlan",
    "PlanRefused",
    "StalePlan",
    "StaleRead",
    "AsyncCircuitBreaker",
    "AsyncRetryBudget",
    "AsyncSpendBudget",
    "AsyncSpendHold",
    "CircuitBreaker",
    "RetryBudget",
    "SpendBudget",
    "SpendHold",
    "BudgetExceeded",
    "CircuitOpen",
    "DeadlineExceeded",
    "RetentionTooShort",
    "RetryBudgetExhausted",
    "ToolUnavailable",
    "call_timeout",
    "check_deadline",
    "deadline",
    "remaining",
    "retry",
    "Enqueued",
    "Event",
    "InvalidDuration",
    "InvalidInput",
    "InvalidName",
    "InvalidSchedule",
    "InvalidURL",
    "Job",
    "JobContext",
    "Lease",
    "LeaseInfo",
    "LeaseLost",
    "MemoryBackend",
    "MissingDriver",
    "NotFound",
    "NotJSON",
    "PayloadError",
    "PayloadTooLarge",
    "Queue",
    "QueueSettings",
    "QueueStats",
    "Reaped",
    "RetryPolicy",
    "Task",
    "TaskSpec",
    "TaskState",
    "UnknownQueue",
    "UnknownTask",
    "Worker",
    "WorkerError",
    "WorkerSettings",
    "Attempt",
    "WorkerInfo",
    "__version__",
    "connect",
    "connect_async",
    "full_jitter",
    "AsyncScheduler",
    "Schedule",
    "Scheduler",
    "Tick",
}


def test_public_names_are_pinned() -> None:
    assert set(agentlease.__all__) == PUBLIC
    for name in PUBLIC:
        assert hasattr(agentlease, name), name


def test_importing_the_package_loads_only_the_exception_tree() -> None:
    """The other public names are imported on first use: a worker does not pay for the rest."""
    code = (
        "import sys, agentlease\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('agentlease'))))\n"
        "agentlease.Queue\n"
        "print('agentlease._sync.queue' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["agentlease,agentlease.errors", "True"]


def test_importing_the_package_loads_no_optional_extra() -> None:
    """Neither ``import agentlease`` nor its queue load a driver, the dashboard's stack, the cron
    parser, OpenTelemetry, the Prometheus client, MCP or an agent framework."""
    code = (
        "import sys, agentlease\n"
        "agentlease.Queue, agentlease.AsyncQueue, agentlease.connect\n"
        "extras = ('redis', 'psycopg', 'starlette', 'uvicorn', 'jinja2', 'agentlease.dashboard',"
        " 'cronsim', 'opentelemetry', 'agentlease.otel', 'prometheus_client',"
        " 'agentlease.prometheus', 'mcp', 'agentlease.mcp', 'agents', 'openai',"
        " 'agentlease.openai_agents', 'langgraph', 'langchain_core', 'agentlease.langgraph',"
        " 'pydantic_ai', 'pydantic', 'agentlease.pydantic_ai')\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith(extras))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_a_queue_and_a_worker_load_no_opentelemetry_unless_instrumented() -> None:
    """Metrics and traces are an extra: enqueueing, claiming and running a worker without
    ``agentlease.otel.instrument()`` imports no OpenTelemetry module."""
    code = (
        "import sys, agentlease as al\n"
        "q = al.Queue.connect('memory://')\n"
        "q.enqueue('q', 1)\n"
        "al.Worker(q, 'q', lambda ctx: None).run(burst=True, handle_signals=False)\n"
        "otel = ('opentelemetry', 'agentlease.otel', 'prometheus_client',"
        " 'agentlease.prometheus')\n"
        "print(sorted(m for m in sys.modules if m.startswith(otel)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["[]"]


def test_every_public_name_but_the_errors_is_imported_on_first_use() -> None:
    import agentlease.errors as errors

    assert set(agentlease._LAZY) == PUBLIC - set(errors.__all__) - {"__version__"}


def test_every_public_name_is_listed_and_an_unknown_one_is_an_attribute_error() -> None:
    assert set(dir(agentlease)) >= PUBLIC
    with pytest.raises(AttributeError, match="has no attribute 'Queues'"):
        agentlease.Queues  # type: ignore[attr-defined]  # noqa: B018
    from agentlease import Queue, connect

    assert Queue is agentlease.Queue
    assert connect is agentlease.connect


def test_sync_and_async_faces_have_the_same_method_names() -> None:
    def methods(cls: type) -> set[str]:
        return {n for n in vars(cls) if not n.startswith("_")}

    assert methods(agentlease.Queue) == methods(agentlease.AsyncQueue)
    assert methods(agentlease.Worker) - {"processed"} <= methods(agentlease.AsyncWorker)
    assert methods(agentlease.Idempotency) == methods(agentlease.AsyncIdempotency)
    assert methods(agentlease.Action) == methods(agentlease.AsyncAction)
    assert methods(agentlease.SharedState) == methods(agentlease.AsyncSharedState)
    assert methods(agentlease.LockSet) == methods(agentlease.AsyncLockSet)
    assert methods(agentlease.CounterHold) == methods(agentlease.AsyncCounterHold)
    assert methods(agentlease.Scheduler) == methods(agentlease.AsyncScheduler)


def test_every_error_descends_from_one_root() -> None:
    import agentlease.errors as errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, agentlease.AgentLeaseError)
        assert cls.__doc__, f"{name} needs a one-line docstring"


def test_every_public_name_is_documented() -> None:
    for name in PUBLIC - {"JSON", "TaskState", "KeyState", "CancelOutcome", "__version__"}:
        assert getattr(agentlease, name).__doc__, name
