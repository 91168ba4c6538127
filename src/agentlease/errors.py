"""The whole exception tree of agentlease.

Every refusal is one of these classes, so callers can catch exactly what they mean to handle::

    AgentLeaseError
    ├── InvalidInput (also ValueError)          bad arguments; nothing was written
    │   ├── InvalidName                         empty, too long or odd queue name / task id
    │   ├── InvalidDuration                     zero, negative or non-finite duration
    │   ├── InvalidURL                          malformed or unsupported backend URL
    │   └── PayloadError                        payload, result or checkpoint refused
    │       ├── NotJSON                         not JSON-serialisable (never pickled)
    │       └── PayloadTooLarge                 over the configured size limit
    ├── NotFound (also LookupError)
    │   ├── UnknownTask                         no task with that id
    │   └── UnknownQueue                        nothing was ever enqueued to that queue
    ├── LeaseLost                               a holder write with a stale or expired lease
    ├── BackendError                            the store failed; the driver error is __cause__
    │   ├── BackendUnavailable                  cannot reach or open the store
    │   └── MissingDriver                       the backend's optional extra is not installed
    ├── Cancelled                               the worker stopped the job (shutdown past grace)
    └── WorkerError                             the worker cannot run as configured

Fault injection raises these same classes, so code that handles real faults handles injected ones.
"""

from __future__ import annotations

__all__ = [
    "AgentLeaseError",
    "BackendError",
    "BackendUnavailable",
    "Cancelled",
    "InvalidDuration",
    "InvalidInput",
    "InvalidName",
    "InvalidURL",
    "LeaseLost",
    "MissingDriver",
    "NotFound",
    "NotJSON",
    "PayloadError",
    "PayloadTooLarge",
    "UnknownQueue",
    "UnknownTask",
    "WorkerError",
]


class AgentLeaseError(Exception):
    """Root of every error agentlease raises on purpose."""


class InvalidInput(AgentLeaseError, ValueError):
    """An argument was refused before anything was written."""


class InvalidName(InvalidInput):
    """A queue name or task id is empty, too long or has characters outside the allowed set."""


class InvalidDuration(InvalidInput):
    """A duration (lease length, delay, timeout) is zero, negative or not finite."""


class InvalidURL(InvalidInput):
    """A backend URL is malformed or names an unsupported scheme."""


class PayloadError(InvalidInput):
    """A payload, result, progress value or checkpoint was refused."""


class NotJSON(PayloadError):
    """The value is not JSON-serialisable; agentlease stores JSON only and never pickles."""


class PayloadTooLarge(PayloadError):
    """The encoded value is larger than the configured limit."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"{what} is {size} bytes encoded, over the limit of {limit} bytes")
        self.what = what
        self.size = size
        self.limit = limit


class NotFound(AgentLeaseError, LookupError):
    """The named thing does not exist in the store."""


class UnknownTask(NotFound):
    """No task with this id exists."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"no task with id {task_id!r}")
        self.task_id = task_id


class UnknownQueue(NotFound):
    """Nothing was ever enqueued to this queue."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"no queue named {queue!r}")
        self.queue = queue


class LeaseLost(AgentLeaseError):
    """A holder write was fenced off: the lease expired, was reaped, or was replaced.

    The write changed nothing. ``attempt`` is the caller's fencing number; ``current_attempt`` is
    the task's fencing number in the store now (``None`` if unknown), and ``state`` its state.
    """

    def __init__(
        self,
        task_id: str,
        attempt: int,
        current_attempt: int | None,
        state: str | None,
        *,
        reason: str = "lease no longer held",
    ) -> None:
        super().__init__(
            f"lease on task {task_id!r} lost ({reason}): caller holds attempt {attempt}, "
            f"store has attempt {current_attempt} in state {state}"
        )
        self.task_id = task_id
        self.attempt = attempt
        self.current_attempt = current_attempt
        self.state = state
        self.reason = reason


class BackendError(AgentLeaseError):
    """The store failed an operation; the driver's exception is kept as ``__cause__``."""


class BackendUnavailable(BackendError):
    """The store cannot be reached or opened."""


class MissingDriver(BackendError):
    """The backend's driver is not installed; the message names the extra to install."""

    def __init__(self, scheme: str, extra: str) -> None:
        super().__init__(
            f"the {scheme!r} backend needs its driver: pip install 'agentlease[{extra}]'"
        )
        self.scheme = scheme
        self.extra = extra


class Cancelled(AgentLeaseError):
    """The worker cancelled this job: shutdown went past its grace period."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"job for task {task_id!r} was cancelled by the worker's shutdown")
        self.task_id = task_id


class WorkerError(AgentLeaseError):
    """The worker cannot run as configured (for example, the handler cannot be imported)."""
