"""agentlease: leases, fencing and heartbeats for many agents sharing work.

Claim atomically, stamp each claim with a token and a fencing number, renew the lease while
working, requeue expired leases to the front, and reject every write from a zombie whose lease was
reaped. The public API is this module's ``__all__``; everything else is private.
"""

from agentlease._async.queue import AsyncQueue
from agentlease._codec import JSON
from agentlease._context import AsyncJobContext, JobContext
from agentlease._events import Event
from agentlease._policy.retry import RetryPolicy, full_jitter
from agentlease._records import (
    Enqueued,
    Job,
    Lease,
    LeaseInfo,
    QueueStats,
    Reaped,
    Task,
    TaskSpec,
    TaskState,
)
from agentlease._settings import QueueSettings
from agentlease._sync.queue import Queue
from agentlease._worker import AsyncWorker, Worker, WorkerSettings
from agentlease.backends import AsyncBackend, Backend, connect, connect_async
from agentlease.backends.memory import MemoryBackend
from agentlease.errors import (
    AgentLeaseError,
    BackendError,
    BackendUnavailable,
    Cancelled,
    InvalidDuration,
    InvalidInput,
    InvalidName,
    InvalidURL,
    LeaseLost,
    MissingDriver,
    NotFound,
    NotJSON,
    PayloadError,
    PayloadTooLarge,
    UnknownQueue,
    UnknownTask,
    WorkerError,
)

__version__ = "0.1.0"

__all__ = [
    "JSON",
    "AgentLeaseError",
    "AsyncBackend",
    "AsyncJobContext",
    "AsyncQueue",
    "AsyncWorker",
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "Cancelled",
    "Enqueued",
    "Event",
    "InvalidDuration",
    "InvalidInput",
    "InvalidName",
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
    "__version__",
    "connect",
    "connect_async",
    "full_jitter",
]
