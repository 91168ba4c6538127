"""agentlease: leases, fencing and heartbeats for many agents sharing work.

Claim atomically, stamp each claim with a token and a fencing number, renew the lease while
working, requeue expired leases to the front, and reject every write from a zombie whose lease was
reaped. The public API is this module's ``__all__``; everything else is private.
"""

from agentlease._async.holds import AsyncCounterHold
from agentlease._async.idempotency import AsyncAction, AsyncIdempotency
from agentlease._async.queue import AsyncQueue
from agentlease._async.state import AsyncLockSet, AsyncSharedState
from agentlease._codec import JSON
from agentlease._context import AsyncJobContext, JobContext
from agentlease._events import Event
from agentlease._guards import ModelCall, held_locks, model_call
from agentlease._idempotent import AsyncIdempotentFunction, IdempotentFunction, idempotent
from agentlease._outcomes import NotApplied, Outcome
from agentlease._policy.retry import RetryPolicy, full_jitter
from agentlease._policy.transitions import StateMachine
from agentlease._records import (
    Enqueued,
    Job,
    KeyRecord,
    KeyState,
    Lease,
    LeaseInfo,
    QueueStats,
    Reaped,
    Task,
    TaskSpec,
    TaskState,
    Versioned,
)
from agentlease._scope import current_fence, current_key, idempotency_scope
from agentlease._settings import IdempotencySettings, QueueSettings
from agentlease._sync.holds import CounterHold
from agentlease._sync.idempotency import Action, Idempotency
from agentlease._sync.queue import Queue
from agentlease._sync.state import LockSet, SharedState
from agentlease._versioned_sql import versioned_update
from agentlease._worker import AsyncWorker, Worker, WorkerSettings
from agentlease.backends import AsyncBackend, Backend, connect, connect_async
from agentlease.backends.memory import MemoryBackend
from agentlease.errors import (
    AgentLeaseError,
    AuthenticationFailed,
    BackendError,
    BackendRefused,
    BackendUnavailable,
    Cancelled,
    ConflictError,
    DuplicateInFlight,
    FencedOff,
    GuardError,
    HoldLost,
    IdempotencyConflict,
    IdempotencyError,
    InvalidDuration,
    InvalidInput,
    InvalidName,
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
    ReplayedFailure,
    ReservationLost,
    SchemaNotMigrated,
    SchemaTooNew,
    TransitionRefused,
    UnknownQueue,
    UnknownTask,
    WorkerError,
)

__version__ = "0.1.0"

__all__ = [
    "JSON",
    "Action",
    "AgentLeaseError",
    "AsyncAction",
    "AsyncBackend",
    "AsyncCounterHold",
    "AsyncIdempotency",
    "AsyncIdempotentFunction",
    "AsyncJobContext",
    "AsyncLockSet",
    "AsyncQueue",
    "AsyncSharedState",
    "AsyncWorker",
    "AuthenticationFailed",
    "Backend",
    "BackendError",
    "BackendRefused",
    "BackendUnavailable",
    "Cancelled",
    "ConflictError",
    "CounterHold",
    "DuplicateInFlight",
    "Enqueued",
    "Event",
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
    "InvalidURL",
    "Job",
    "JobContext",
    "KeyRecord",
    "KeyState",
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
    "NotApplied",
    "NotFound",
    "NotJSON",
    "NotLockOwner",
    "Outcome",
    "PayloadError",
    "PayloadTooLarge",
    "PermissionDenied",
    "Queue",
    "QueueSettings",
    "QueueStats",
    "Reaped",
    "ReplayedFailure",
    "ReservationLost",
    "RetryPolicy",
    "SchemaNotMigrated",
    "SchemaTooNew",
    "SharedState",
    "StateMachine",
    "Task",
    "TaskSpec",
    "TaskState",
    "TransitionRefused",
    "UnknownQueue",
    "UnknownTask",
    "Versioned",
    "Worker",
    "WorkerError",
    "WorkerSettings",
    "__version__",
    "connect",
    "connect_async",
    "current_fence",
    "current_key",
    "full_jitter",
    "held_locks",
    "idempotency_scope",
    "idempotent",
    "model_call",
    "versioned_update",
]
