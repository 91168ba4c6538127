"""agentlease: leases, fencing and heartbeats for many agents sharing work.

Claim atomically, stamp each claim with a token and a fencing number, renew the lease while
working, requeue expired leases to the front, and reject every write from a zombie whose lease was
reaped. The public API is this module's ``__all__``; everything else is private.

Only the exception tree is imported with the package: every other public name is imported on
first use (:pep:`562`), so ``import agentlease`` (and ``agentlease worker``, which needs a few of
them) does not load idempotency, shared state or the memory store it does not use.
"""

from importlib import import_module as _import_module
from typing import TYPE_CHECKING

from agentlease.errors import (
    AgentLeaseError,
    AuthenticationFailed,
    BackendError,
    BackendRefused,
    BackendUnavailable,
    BudgetExceeded,
    Cancelled,
    CircuitOpen,
    ConflictError,
    DeadlineExceeded,
    DuplicateInFlight,
    FencedOff,
    GuardError,
    HoldLost,
    IdempotencyConflict,
    IdempotencyError,
    InvalidDuration,
    InvalidInput,
    InvalidName,
    InvalidSchedule,
    InvalidURL,
    LeaseLost,
    LimitReached,
    LockHeldAcrossModelCall,
    LockLost,
    LockTimeout,
    MissingDriver,
    MissingIdentity,
    NotFound,
    NotJSON,
    NotLockOwner,
    PayloadError,
    PayloadTooLarge,
    PermissionDenied,
    PlanDiverged,
    PlanExpired,
    PlanRefused,
    QueueInUse,
    ReconciliationConflict,
    ReplayedFailure,
    ReservationLost,
    RetentionTooShort,
    RetryBudgetExhausted,
    SchemaNotMigrated,
    SchemaTooNew,
    StalePlan,
    TaskCancelled,
    TaskTimeout,
    TLSRefused,
    ToolUnavailable,
    TransitionRefused,
    UnknownQueue,
    UnknownTask,
    WorkerError,
)

if TYPE_CHECKING:
    from agentlease._async.budgets import (
        AsyncCircuitBreaker,
        AsyncRetryBudget,
        AsyncSpendBudget,
        AsyncSpendHold,
    )
    from agentlease._async.facts import AsyncFactBoard
    from agentlease._async.holds import AsyncCounterHold
    from agentlease._async.idempotency import AsyncAction, AsyncIdempotency
    from agentlease._async.queue import AsyncQueue
    from agentlease._async.scheduler import AsyncScheduler
    from agentlease._async.state import AsyncLockSet, AsyncPlan, AsyncSharedState
    from agentlease._codec import JSON
    from agentlease._context import AsyncJobContext, JobContext
    from agentlease._deadline import call_timeout, check_deadline, deadline, remaining
    from agentlease._events import Event
    from agentlease._guards import ModelCall, held_locks, model_call
    from agentlease._idempotent import AsyncIdempotentFunction, IdempotentFunction, idempotent
    from agentlease._outcomes import NotApplied, Outcome
    from agentlease._policy.retry import RetryPolicy, full_jitter
    from agentlease._policy.transitions import StateMachine
    from agentlease._reconcile import (
        Fact,
        LatestByVersion,
        MustAgree,
        Policy,
        PreferSource,
        Union,
        reconcile,
    )
    from agentlease._records import (
        Attempt,
        Cancellation,
        CancelOutcome,
        Enqueued,
        Job,
        KeyRecord,
        KeyState,
        Lease,
        LeaseInfo,
        PlanReceipt,
        QueueStats,
        Reaped,
        StaleRead,
        Task,
        TaskSpec,
        TaskState,
        Versioned,
        WorkerInfo,
    )
    from agentlease._retry import retry
    from agentlease._schedule import Schedule, Tick
    from agentlease._scope import current_fence, current_key, idempotency_scope
    from agentlease._settings import IdempotencySettings, QueueSettings, WorkerSettings
    from agentlease._sync.budgets import CircuitBreaker, RetryBudget, SpendBudget, SpendHold
    from agentlease._sync.facts import FactBoard
    from agentlease._sync.holds import CounterHold
    from agentlease._sync.idempotency import Action, Idempotency
    from agentlease._sync.queue import Queue
    from agentlease._sync.scheduler import Scheduler
    from agentlease._sync.state import LockSet, Plan, SharedState
    from agentlease._versioned_sql import versioned_update
    from agentlease._worker import AsyncWorker, Worker
    from agentlease.backends import AsyncBackend, Backend, connect, connect_async
    from agentlease.backends.memory import MemoryBackend

__version__ = "0.1.0"

# Each public name imported on first use, and the module that defines it.
_LAZY = {
    "AsyncCircuitBreaker": "agentlease._async.budgets",
    "AsyncRetryBudget": "agentlease._async.budgets",
    "AsyncSpendBudget": "agentlease._async.budgets",
    "AsyncSpendHold": "agentlease._async.budgets",
    "AsyncFactBoard": "agentlease._async.facts",
    "FactBoard": "agentlease._sync.facts",
    "AsyncCounterHold": "agentlease._async.holds",
    "AsyncAction": "agentlease._async.idempotency",
    "AsyncIdempotency": "agentlease._async.idempotency",
    "AsyncQueue": "agentlease._async.queue",
    "AsyncScheduler": "agentlease._async.scheduler",
    "AsyncLockSet": "agentlease._async.state",
    "AsyncSharedState": "agentlease._async.state",
    "AsyncPlan": "agentlease._async.plans",
    "JSON": "agentlease._codec",
    "AsyncJobContext": "agentlease._context",
    "JobContext": "agentlease._context",
    "call_timeout": "agentlease._deadline",
    "check_deadline": "agentlease._deadline",
    "deadline": "agentlease._deadline",
    "remaining": "agentlease._deadline",
    "Event": "agentlease._events",
    "ModelCall": "agentlease._guards",
    "held_locks": "agentlease._guards",
    "model_call": "agentlease._guards",
    "AsyncIdempotentFunction": "agentlease._idempotent",
    "IdempotentFunction": "agentlease._idempotent",
    "idempotent": "agentlease._idempotent",
    "NotApplied": "agentlease._outcomes",
    "Outcome": "agentlease._outcomes",
    "RetryPolicy": "agentlease._policy.retry",
    "full_jitter": "agentlease._policy.retry",
    "StateMachine": "agentlease._policy.transitions",
    "retry": "agentlease._retry",
    "Schedule": "agentlease._schedule",
    "Tick": "agentlease._schedule",
    "Fact": "agentlease._reconcile",
    "LatestByVersion": "agentlease._reconcile",
    "MustAgree": "agentlease._reconcile",
    "Policy": "agentlease._reconcile",
    "PreferSource": "agentlease._reconcile",
    "Union": "agentlease._reconcile",
    "reconcile": "agentlease._reconcile",
    "Attempt": "agentlease._records",
    "CancelOutcome": "agentlease._records",
    "Cancellation": "agentlease._records",
    "Enqueued": "agentlease._records",
    "Job": "agentlease._records",
    "KeyRecord": "agentlease._records",
    "KeyState": "agentlease._records",
    "Lease": "agentlease._records",
    "LeaseInfo": "agentlease._records",
    "PlanReceipt": "agentlease._records",
    "QueueStats": "agentlease._records",
    "StaleRead": "agentlease._records",
    "Reaped": "agentlease._records",
    "Task": "agentlease._records",
    "TaskSpec": "agentlease._records",
    "TaskState": "agentlease._records",
    "Versioned": "agentlease._records",
    "WorkerInfo": "agentlease._records",
    "current_fence": "agentlease._scope",
    "current_key": "agentlease._scope",
    "idempotency_scope": "agentlease._scope",
    "IdempotencySettings": "agentlease._settings",
    "QueueSettings": "agentlease._settings",
    "CircuitBreaker": "agentlease._sync.budgets",
    "RetryBudget": "agentlease._sync.budgets",
    "SpendBudget": "agentlease._sync.budgets",
    "SpendHold": "agentlease._sync.budgets",
    "CounterHold": "agentlease._sync.holds",
    "Action": "agentlease._sync.idempotency",
    "Idempotency": "agentlease._sync.idempotency",
    "Queue": "agentlease._sync.queue",
    "Scheduler": "agentlease._sync.scheduler",
    "LockSet": "agentlease._sync.state",
    "SharedState": "agentlease._sync.state",
    "Plan": "agentlease._sync.plans",
    "versioned_update": "agentlease._versioned_sql",
    "AsyncWorker": "agentlease._worker",
    "Worker": "agentlease._worker",
    "WorkerSettings": "agentlease._settings",
    "AsyncBackend": "agentlease.backends",
    "Backend": "agentlease.backends",
    "connect": "agentlease.backends",
    "connect_async": "agentlease.backends",
    "MemoryBackend": "agentlease.backends.memory",
}


__all__ = [
    "JSON",
    "Action",
    "AgentLeaseError",
    "AsyncAction",
    "AsyncBackend",
    "AsyncCircuitBreaker",
    "AsyncCounterHold",
    "AsyncFactBoard",
    "AsyncIdempotency",
    "AsyncIdempotentFunction",
    "AsyncJobContext",
    "AsyncLockSet",
    "AsyncPlan",
    "AsyncQueue",
    "AsyncRetryBudget",
    "AsyncScheduler",
    "AsyncSharedState",
    "AsyncSpendBudget",
    "AsyncSpendHold",
    "AsyncWorker",
    "Attempt",
    "AuthenticationFailed",
    "Backend",
    "BackendError",
    "BackendRefused",
    "BackendUnavailable",
    "BudgetExceeded",
    "CancelOutcome",
    "Cancellation",
    "Cancelled",
    "CircuitBreaker",
    "CircuitOpen",
    "ConflictError",
    "CounterHold",
    "DeadlineExceeded",
    "DuplicateInFlight",
    "Enqueued",
    "Event",
    "Fact",
    "FactBoard",
    "FencedOff",
    "GuardError",
    "HoldLost",
    "Idempotency",
    "IdempotencyConflict",
    "IdempotencyError",
    "IdempotencySettings",
    "IdempotentFunction",
    "InvalidDuration",
    "InvalidInput",
    "InvalidName",
    "InvalidSchedule",
    "InvalidURL",
    "Job",
    "JobContext",
    "KeyRecord",
    "KeyState",
    "LatestByVersion",
    "Lease",
    "LeaseInfo",
    "LeaseLost",
    "LimitReached",
    "LockHeldAcrossModelCall",
    "LockLost",
    "LockSet",
    "LockTimeout",
    "MemoryBackend",
    "MissingDriver",
    "MissingIdentity",
    "ModelCall",
    "MustAgree",
    "NotApplied",
    "NotFound",
    "NotJSON",
    "NotLockOwner",
    "Outcome",
    "PayloadError",
    "PayloadTooLarge",
    "PermissionDenied",
    "Plan",
    "PlanDiverged",
    "PlanExpired",
    "PlanReceipt",
    "PlanRefused",
    "Policy",
    "PreferSource",
    "Queue",
    "QueueInUse",
    "QueueSettings",
    "QueueStats",
    "Reaped",
    "ReconciliationConflict",
    "ReplayedFailure",
    "ReservationLost",
    "RetentionTooShort",
    "RetryBudget",
    "RetryBudgetExhausted",
    "RetryPolicy",
    "Schedule",
    "Scheduler",
    "SchemaNotMigrated",
    "SchemaTooNew",
    "SharedState",
    "SpendBudget",
    "SpendHold",
    "StalePlan",
    "StaleRead",
    "StateMachine",
    "TLSRefused",
    "Task",
    "TaskCancelled",
    "TaskSpec",
    "TaskState",
    "TaskTimeout",
    "Tick",
    "ToolUnavailable",
    "TransitionRefused",
    "Union",
    "UnknownQueue",
    "UnknownTask",
    "Versioned",
    "Worker",
    "WorkerError",
    "WorkerInfo",
    "WorkerSettings",
    "__version__",
    "call_timeout",
    "check_deadline",
    "connect",
    "connect_async",
    "current_fence",
    "current_key",
    "deadline",
    "full_jitter",
    "held_locks",
    "idempotency_scope",
    "idempotent",
    "model_call",
    "reconcile",
    "remaining",
    "retry",
    "versioned_update",
]

if not TYPE_CHECKING:  # hidden from type checkers, which would take any misspelt name for Any

    def __getattr__(name: str) -> object:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(_import_module(module), name)
        globals()[name] = value  # the next lookup finds it without coming here
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
