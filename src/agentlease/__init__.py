"""agentlease: leases, fencing and heartbeats for many agents sharing work.

Claim atomically, stamp each claim with a token and a fencing number, renew the lease while
working, requeue expired leases to the front, and reject every write from a zombie whose lease was
reaped. The public API is this module's ``__all__``; everything else is private.
"""

from agentlease._async.idempotency import AsyncAction, AsyncIdempotency
from agentlease._async.queue import AsyncQueue
from agentlease._codec import JSON
from agentlease._context import AsyncJobContext, JobContext
from agentlease._events import Event
from agentlease._idempotent import AsyncIdempotentFunction, IdempotentFunction, idempotent
from agentlease._outcomes import NotApplied, Outcome
from agentlease._policy.retry import RetryPolicy, full_jitter
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
)
from agentlease._scope import current_fence, current_key, idempotency_scope
from agentlease._settings import IdempotencySettings, QueueSettings
from agentlease._sync.idempotency import Action, Idempotency
from agentlease._sync.queue import Queue
from agentlease._worker import AsyncWorker, Worker, WorkerSettings
from agentlease.backends import AsyncBackend, Backend, connect, connect_async
from agentlease.backends.memory import MemoryBackend
from agentlease.errors import (
    AgentLeaseError,
    BackendError,
    BackendUnavailable,
    Cancelled,
    DuplicateInFlight,
    IdempotencyConflict,
    IdempotencyError,
    InvalidDuration,
    InvalidInput,
    InvalidName,
    InvalidURL,
    LeaseLost,
    MissingDriver,
    MissingIdentity,
    NotFound,
    NotJSON,
    PayloadError,
    PayloadTooLarge,
    ReplayedFailure,
    ReservationLost,
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
    "AsyncIdempotency",
    "AsyncIdempotentFunction",
    "AsyncJobContext",
    "AsyncQueue",
    "AsyncWorker",
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "Cancelled",
    "DuplicateInFlight",
    "Enqueued",
    "Event",
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
    "MemoryBackend",
    "MissingDriver",
    "MissingIdentity",
    "NotApplied",
    "NotFound",
    "NotJSON",
    "Outcome",
    "PayloadError",
    "PayloadTooLarge",
    "Queue",
    "QueueSettings",
    "QueueStats",
    "Reaped",
    "ReplayedFailure",
    "ReservationLost",
    "RetryPolicy",
    "Task",
    "TaskSpec",
    "TaskState",
    "UnknownQueue",
    "UnknownTask",
    "Worker",
    "WorkerError",
    "WorkerSettings",
    "__version__",
    "connect",
    "connect_async",
    "current_fence",
    "current_key",
    "full_jitter",
    "idempotency_scope",
    "idempotent",
]
