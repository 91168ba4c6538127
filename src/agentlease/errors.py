"""The whole exception tree of agentlease.

Every refusal is one of these classes, so callers can catch exactly what they mean to handle::

    AgentLeaseError
    ├── InvalidInput (also ValueError)          bad arguments; nothing was written
    │   ├── InvalidName                         empty, too long or odd queue name / task id
    │   ├── InvalidDuration                     zero, negative or non-finite duration
    │   │   └── RetentionTooShort               a retention below the floor (60 s, the lease)
    │   ├── InvalidURL                          malformed or unsupported backend URL
    │   ├── InvalidSchedule                     bad cron expression, misfire policy or time zone
    │   ├── MissingIdentity                     an idempotent action without a task or step id
    │   ├── PlanRefused                         a plan edited in transit, or not possible here
    │   └── PayloadError                        payload, result or checkpoint refused
    │       ├── NotJSON                         not JSON-serialisable (never pickled)
    │       └── PayloadTooLarge                 over the configured size limit
    ├── NotFound (also LookupError)
    │   ├── UnknownTask                         no task with that id
    │   └── UnknownQueue                        nothing was ever enqueued to that queue
    ├── LeaseLost                               a holder write with a stale or expired lease
    │   └── TaskCancelled                       the task was cancelled (reason attached)
    ├── QueueInUse                              delete-queue refused: tasks are leased (force)
    ├── IdempotencyError                        an idempotent action was refused
    │   ├── DuplicateInFlight                   another attempt holds the key now (retry_after)
    │   ├── IdempotencyConflict                 the key was used with other arguments
    │   ├── ReservationLost                     a holder write with a stale reservation token
    │   └── ReplayedFailure                     a stored failure whose type is not known here
    ├── GuardError                              a shared-state guard refused; nothing changed
    │   ├── ConflictError                       the record's version moved (current state attached)
    │   ├── TransitionRefused                   the declared state machine forbids that move
    │   ├── FencedOff                           a write carrying an older fencing token
    │   ├── LimitReached                        a bounded counter would leave its range
    │   ├── LockTimeout                         a lock set was not acquired within its timeout
    │   ├── LockLost                            a held lock ran out or was taken (renewal failed)
    │   ├── NotLockOwner                        a release by someone who does not hold the lock
    │   ├── HoldLost                            a counter hold ran out or already ended
    │   ├── LockHeldAcrossModelCall             a model call entered while the task holds a lock
    │   ├── ReconciliationConflict              two branches found different values for a field
    │   ├── StalePlan                           what an approved plan read has moved (each key)
    │   └── PlanExpired                         a plan acted on past its deadline
    ├── BackendError                            the store failed; the driver error is __cause__
    │   ├── BackendUnavailable                  cannot reach or open the store now (transient)
    │   ├── BackendRefused                      refuses this client as configured (permanent)
    │   │   ├── AuthenticationFailed            wrong user or password, or no such user
    │   │   ├── PermissionDenied                the user may not run what agentlease needs
    │   │   ├── TLSRefused                      TLS failed: certificate, host name, client cert
    │   │   ├── SchemaNotMigrated               no agentlease tables (or old ones), migrate=false
    │   │   └── SchemaTooNew                    written by a newer agentlease (both versions)
    │   └── MissingDriver                       the backend's optional extra is not installed
    ├── ToolUnavailable                         do not call (or retry) this now; data for a planner
    │   ├── CircuitOpen                         the dependency's circuit breaker is open
    │   ├── RetryBudgetExhausted                the root task's shared retry budget is spent
    │   ├── DeadlineExceeded                    the deadline of the work has passed
    │   └── BudgetExceeded                      a spend reservation would cross its limit
    ├── PlanDiverged                            a replay asked for a model response the trace lacks
    ├── Cancelled                               the worker stopped the job (shutdown past grace)
    ├── TaskTimeout (also TimeoutError)         an attempt ran past the task's time limit (retried)
    └── WorkerError                             the worker cannot run as configured

Fault injection raises these same classes, so code that handles real faults handles injected ones.

Of the store's failures, :class:`BackendUnavailable` is the one worth retrying (a restart, a
failover, a network cut); :class:`BackendRefused` will fail the same way until someone changes
the URL, the store's users or the installed agentlease, so a worker stops on it at once.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentLeaseError",
    "AuthenticationFailed",
    "BackendError",
    "BackendRefused",
    "BackendUnavailable",
    "BudgetExceeded",
    "Cancelled",
    "CircuitOpen",
    "ConflictError",
    "DeadlineExceeded",
    "DuplicateInFlight",
    "FencedOff",
    "GuardError",
    "HoldLost",
    "IdempotencyConflict",
    "IdempotencyError",
    "InvalidDuration",
    "InvalidInput",
    "InvalidName",
    "InvalidSchedule",
    "InvalidURL",
    "LeaseLost",
    "LimitReached",
    "LockHeldAcrossModelCall",
    "LockLost",
    "LockTimeout",
    "MissingDriver",
    "MissingIdentity",
    "NotFound",
    "NotJSON",
    "NotLockOwner",
    "PayloadError",
    "PayloadTooLarge",
    "PermissionDenied",
    "PlanDiverged",
    "PlanExpired",
    "PlanRefused",
    "QueueInUse",
    "ReconciliationConflict",
    "ReplayedFailure",
    "ReservationLost",
    "RetentionTooShort",
    "RetryBudgetExhausted",
    "SchemaNotMigrated",
    "SchemaTooNew",
    "StalePlan",
    "TLSRefused",
    "TaskCancelled",
    "TaskTimeout",
    "ToolUnavailable",
    "TransitionRefused",
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


class RetentionTooShort(InvalidDuration):
    """A retention of finished tasks is shorter than its floor: the longer of 60 seconds and the
    lease, so that a worker whose final write's reply was lost still finds the record it wrote.

    Attributes:
        what: the setting refused.
        given: the seconds asked for.
        floor: the shortest retention allowed.
    """

    def __init__(self, what: str, given: float, floor: float) -> None:
        super().__init__(
            f"{what}={given:g}s is shorter than the retention floor of {floor:g}s (the longer "
            "of 60 s and lease_for): a worker checks a final write whose reply was lost by "
            "reading the task back, which must still be there"
        )
        self.what = what
        self.given = given
        self.floor = floor


class InvalidURL(InvalidInput):
    """A backend URL is malformed or names an unsupported scheme."""


class InvalidSchedule(InvalidInput):
    """A schedule was refused: bad cron expression, misfire policy, time zone or window."""


class MissingIdentity(InvalidInput):
    """An idempotent action has no task id or step id: its key cannot be derived safely."""


class PlanRefused(InvalidInput):
    """A plan cannot be acted on as given, and nothing was written: its MAC does not match its
    content (edited in transit, or sealed by another store), it is not a plan at all, or it
    asks for what this store cannot do in one atomic step (a ``pin`` outside SQLite and
    PostgreSQL; on a Redis Cluster, names that do not share one state space). ``reason`` says
    which."""

    def __init__(self, reason: str, *, plan_id: str | None = None) -> None:
        which = f"plan {plan_id!r}" if plan_id else "the plan"
        super().__init__(f"{which} was refused: {reason}")
        self.reason = reason
        self.plan_id = plan_id


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


class TaskCancelled(LeaseLost):
    """The task was cancelled (:meth:`~agentlease.Queue.cancel`): the write of the attempt that
    held it is refused and changes nothing; ``reason`` is the reason given to the cancel.

    A :class:`LeaseLost`, so code that stops on a lost lease stops on a cancellation too.
    """

    def __init__(
        self,
        task_id: str,
        reason: str,
        *,
        attempt: int | None = None,
        current_attempt: int | None = None,
    ) -> None:
        AgentLeaseError.__init__(self, f"task {task_id!r} was cancelled: {reason}")
        self.task_id = task_id
        self.attempt = attempt if attempt is not None else 0
        self.current_attempt = current_attempt
        self.state = "cancelled"
        self.reason = reason


class QueueInUse(AgentLeaseError):
    """A queue was not deleted because some of its tasks are leased now (``leased`` of them);
    nothing was deleted by the step that found them. Stop its workers, or delete with
    ``force=True`` (the holders' later writes are then refused)."""

    def __init__(self, queue: str, leased: int) -> None:
        super().__init__(
            f"queue {queue!r} has {leased} leased task(s): stop its workers or delete with force"
        )
        self.queue = queue
        self.leased = leased


class IdempotencyError(AgentLeaseError):
    """An idempotent action was refused, or its outcome could not be recorded."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class DuplicateInFlight(IdempotencyError):
    """Another attempt holds this key's reservation now; retry after ``retry_after`` seconds.

    ``retry_after`` is when the holder's in-flight lease runs out (store clock), so a retry then
    either replays its outcome or takes the reservation over.
    """

    def __init__(self, key: str, retry_after: float, holder: str) -> None:
        super().__init__(
            f"idempotency key {key[:16]}... is in flight (held by {holder or 'another attempt'});"
            f" retry after {retry_after:.3f} s",
            key,
        )
        self.retry_after = retry_after
        self.holder = holder


class IdempotencyConflict(IdempotencyError):
    """The key was first used by another action: other arguments (a re-planned step), or another
    tool or step (an upstream key reused); neither runs again.

    ``stored_fingerprint`` and ``given_fingerprint`` are the two actions' fingerprints,
    ``stored_tool`` and ``given_tool`` their tools (``stored_tool`` is ``None`` when the stored
    fingerprint does not name one: it was recorded before fingerprints covered the tool).
    """

    def __init__(
        self,
        key: str,
        stored_fingerprint: str,
        given_fingerprint: str,
        *,
        stored_tool: str | None = None,
        given_tool: str | None = None,
    ) -> None:
        def action(tool: str | None, fp: str) -> str:
            digest = fp.split(":")[1] if fp.count(":") >= 2 else fp
            named = "an unnamed tool" if tool is None else f"tool {tool!r}"
            return f"{named} with fingerprint {digest[:16]}..."

        super().__init__(
            f"idempotency key {key[:16]}... was used by"
            f" {action(stored_tool, stored_fingerprint)} and is now given to"
            f" {action(given_tool, given_fingerprint)}",
            key,
        )
        self.stored_fingerprint = stored_fingerprint
        self.given_fingerprint = given_fingerprint
        self.stored_tool = stored_tool
        self.given_tool = given_tool


class ReservationLost(IdempotencyError):
    """A write with a stale reservation: the key was taken over, finished or purged.

    Nothing was written. ``fence`` is the caller's fencing number and ``current_fence`` the key's
    fencing number in the store now (``None`` if the key is gone or was not read), ``state`` its
    state. Also raised, with ``current_fence`` and ``state`` ``None``, when the holder's local
    deadline passed (no renewal confirmed within ``hold_for``, a store outage): the holder must
    act as if the key were taken over, whatever the store says later.
    """

    def __init__(
        self,
        key: str,
        fence: int,
        current_fence: int | None,
        state: str | None,
        detail: str = "",
    ) -> None:
        why = detail or f"store has fence {current_fence} in state {state}"
        super().__init__(
            f"reservation of idempotency key {key[:16]}... lost: caller holds fence {fence}, {why}",
            key,
        )
        self.fence = fence
        self.current_fence = current_fence
        self.state = state


class ReplayedFailure(IdempotencyError):
    """The key's stored permanent failure, replayed, when its type is not one this call names.

    Attributes ``error_type`` (module-qualified name) and ``error_message`` are the original's.
    """

    def __init__(self, key: str, error_type: str, error_message: str) -> None:
        super().__init__(f"{error_type}: {error_message} (replayed failure)", key)
        self.error_type = error_type
        self.error_message = error_message


class GuardError(AgentLeaseError):
    """A shared-state guard refused a write or an acquisition; nothing changed."""


class ConflictError(GuardError):
    """The record's version moved since it was read: re-read and re-apply.

    ``current_version`` is the record's version now (0 if it does not exist) and
    ``current_value`` its value (``None`` if it does not exist).
    """

    def __init__(
        self, key: str, expected_version: int, current_version: int, current_value: object
    ) -> None:
        super().__init__(f"record {key!r} is at version {current_version}, not {expected_version}")
        self.key = key
        self.expected_version = expected_version
        self.current_version = current_version
        self.current_value = current_value


class TransitionRefused(GuardError):
    """The write would move a record's state where its state machine does not allow."""

    def __init__(self, key: str, field: str, current: object, target: object) -> None:
        super().__init__(f"record {key!r}: {field} may not move from {current!r} to {target!r}")
        self.key = key
        self.field = field
        self.current = current
        self.target = target


class FencedOff(GuardError):
    """A write carried an older fencing token than one the resource has already seen."""

    def __init__(self, key: str, fence: int, current_fence: int) -> None:
        super().__init__(
            f"record {key!r} refuses fencing token {fence}: it has seen {current_fence}"
        )
        self.key = key
        self.fence = fence
        self.current_fence = current_fence


class LimitReached(GuardError):
    """A bounded counter would leave its range; its value is unchanged."""

    def __init__(
        self, name: str, value: int, delta: int, low: int | None, high: int | None
    ) -> None:
        bound = (
            f"at most {high}" if high is not None and value + delta > high else f"at least {low}"
        )
        super().__init__(f"counter {name!r} is {value}; adding {delta} would break {bound}")
        self.name = name
        self.value = value
        self.delta = delta
        self.low = low
        self.high = high


class LockTimeout(GuardError):
    """A lock set was not acquired within its timeout (all or nothing: none is held)."""

    def __init__(self, names: tuple[str, ...], timeout: float, busy: str, holder: str) -> None:
        super().__init__(
            f"locks {list(names)} not acquired within {timeout} s: {busy!r} is held by {holder!r}"
        )
        self.names = names
        self.timeout = timeout
        self.busy = busy
        self.holder = holder


class LockLost(GuardError):
    """A held lock ran out or was taken by another owner: its protection is gone."""

    def __init__(self, names: tuple[str, ...], detail: str = "") -> None:
        super().__init__(f"locks {list(names)} lost" + (f": {detail}" if detail else ""))
        self.names = names


class NotLockOwner(GuardError):
    """A release of a lock by someone who does not hold it; the lock is unchanged."""

    def __init__(self, name: str, holder: str | None) -> None:
        super().__init__(f"lock {name!r} is not held by the caller (holder: {holder!r})")
        self.name = name
        self.holder = holder


class HoldLost(GuardError):
    """A counter hold ran out (its units went back to the counter) or was already released or
    committed: a renewal, release or commit with its token was refused and changed nothing."""

    def __init__(self, name: str, units: int, detail: str = "") -> None:
        super().__init__(
            f"the hold of {units} on counter {name!r} is lost" + (f": {detail}" if detail else "")
        )
        self.name = name
        self.units = units


class LockHeldAcrossModelCall(GuardError):
    """A model call was entered while the current task holds locks: every other agent would
    wait for the model."""

    def __init__(self, names: tuple[str, ...]) -> None:
        super().__init__(
            f"a model call was entered while holding locks {list(names)}: release them first"
        )
        self.names = names


class ReconciliationConflict(GuardError):
    """Two branches found different values for one field that its policy will not merge; the
    message names the field, both branches, their values and their evidence.

    Attributes:
        field: the field.
        first, second: the two facts (:class:`agentlease.Fact`) that disagree.
        why: the policy's reason (``"the branches must agree"``, ...).
    """

    def __init__(self, field: str, first: Any, second: Any, why: str) -> None:
        def told(fact: Any) -> str:
            step = f" at step {fact.step!r}" if fact.step else ""
            return f"{fact.source!r}{step} found {fact.value!r} (evidence: {fact.evidence!r})"

        super().__init__(
            f"field {field!r} cannot be reconciled ({why}): {told(first)}, but {told(second)}"
        )
        self.field = field
        self.first = first
        self.second = second
        self.why = why


class StalePlan(GuardError):
    """The world moved since the plan was made: at least one record, counter or pinned row it
    read is at another version now. Nothing was written; re-plan with the current values.

    Attributes:
        plan_id: the plan.
        stale: each read that no longer holds (:class:`~agentlease._records.StaleRead`: ``kind``,
            ``key``, ``read_version``, ``current_version``), in the plan's order.
    """

    def __init__(self, plan_id: str, stale: Any) -> None:
        moved = ", ".join(
            f"{s.kind} {s.key!r} read at version {s.read_version}, now {s.current_version}"
            for s in stale
        )
        super().__init__(f"plan {plan_id!r} is stale: {moved}")
        self.plan_id = plan_id
        self.stale = list(stale)


class PlanExpired(GuardError):
    """The plan was acted on after its deadline (``not_after``, seconds since the epoch,
    compared with the store's clock: ``now``); nothing was written."""

    def __init__(self, plan_id: str, not_after: float, now: float) -> None:
        super().__init__(
            f"plan {plan_id!r} expired {max(0.0, now - not_after):.3f} s ago: it can no longer"
            " be approved"
        )
        self.plan_id = plan_id
        self.not_after = not_after
        self.now = now


class BackendError(AgentLeaseError):
    """The store failed an operation; the driver's exception is kept as ``__cause__``."""


class BackendUnavailable(BackendError):
    """The store cannot be reached or opened now; a later try may succeed (transient)."""


class BackendRefused(BackendError):
    """The store refuses this client as configured; retrying cannot help (permanent)."""


class AuthenticationFailed(BackendRefused):
    """The store refused the login: wrong user or password, or a user it does not know."""


class PermissionDenied(BackendRefused):
    """The store's user may not run what agentlease needs (a Redis ACL, a missing privilege)."""


class TLSRefused(BackendRefused):
    """The TLS handshake failed for good: the server's certificate could not be verified or does
    not name the host, or the server requires (or refused) the client's certificate."""


class SchemaNotMigrated(BackendRefused):
    """The store lacks agentlease's tables, or some migrations, and may not migrate them here."""


class SchemaTooNew(BackendRefused):
    """The store was written by a newer agentlease: this one refuses it and changes nothing.

    ``store_version`` is the version the store is at and ``known_version`` the newest this
    agentlease knows (``what`` names the kind of version: a schema, migrations, a key layout).
    """

    def __init__(self, where: str, what: str, store_version: int, known_version: int) -> None:
        super().__init__(
            f"{where}: its {what} is at version {store_version}, newer than version "
            f"{known_version}, the newest this agentlease knows: upgrade agentlease to use it"
        )
        self.where = where
        self.what = what
        self.store_version = store_version
        self.known_version = known_version


class MissingDriver(BackendError):
    """The backend's driver is not installed; the message names the extra to install."""

    def __init__(self, scheme: str, extra: str) -> None:
        super().__init__(
            f"the {scheme!r} backend needs its driver: pip install 'agentlease[{extra}]'"
        )
        self.scheme = scheme
        self.extra = extra


class ToolUnavailable(AgentLeaseError):
    """Do not call this tool (or retry it) now: a refusal meant to reach a planner as data.

    A generic failure reads to a model as an invitation to try again; this one says why not and
    for how long. :meth:`payload` is JSON-serialisable and :meth:`as_tool_result` renders it as
    the text of a tool result.

    Attributes:
        reason: ``"circuit_open"``, ``"retry_budget"``, ``"deadline"`` or ``"spend_budget"``.
        tool: the tool (or function) that was refused, if known.
        dependency: the dependency behind it (a breaker's name, a budget's scope), if known.
        retry_after_s: seconds after which asking again may succeed, or ``None`` (never, in
            this task).
        do_not_retry: always true: the caller should re-plan, not retry.
    """

    reason = "unavailable"

    def __init__(
        self,
        message: str,
        *,
        tool: str | None = None,
        dependency: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.tool = tool
        self.dependency = dependency
        self.retry_after_s = retry_after_s
        self.do_not_retry = True

    def details(self) -> dict[str, object]:
        """The subclass's own fields for :meth:`payload` (JSON values)."""
        return {}

    def payload(self) -> dict[str, object]:
        """The refusal as a JSON-serialisable dict: ``error``, ``reason``, ``tool``,
        ``dependency``, ``retry_after_s``, ``do_not_retry``, ``message`` and the subclass's
        fields."""
        retry_after = None if self.retry_after_s is None else round(self.retry_after_s, 3)
        return {
            "error": type(self).__name__,
            "reason": self.reason,
            "tool": self.tool,
            "dependency": self.dependency,
            "retry_after_s": retry_after,
            "do_not_retry": True,
            "message": self.message,
            **self.details(),
        }

    def as_tool_result(self) -> str:
        """The refusal as the text of a tool result for a model: one plain sentence, then the
        payload as JSON."""
        import json

        what = f"The tool {self.tool!r}" if self.tool else "This tool"
        when = (
            f" Do not call it again in this task for at least {self.retry_after_s:.0f} s."
            if self.retry_after_s is not None
            else " Do not call it again in this task."
        )
        return (
            f"{what} is unavailable ({self.reason}): {self.message}.{when} Re-plan without it."
            f"\n{json.dumps(self.payload(), sort_keys=True)}"
        )


class CircuitOpen(ToolUnavailable):
    """The dependency's circuit breaker is open (or its one half-open trial is in flight)."""

    reason = "circuit_open"

    def __init__(
        self,
        dependency: str,
        state: str,
        failures: int,
        retry_after_s: float,
        *,
        tool: str | None = None,
    ) -> None:
        super().__init__(
            f"the circuit of {dependency!r} is {state.replace('_', '-')} after {failures} "
            f"consecutive failures",
            tool=tool,
            dependency=dependency,
            retry_after_s=retry_after_s,
        )
        self.state = state
        self.failures = failures

    def details(self) -> dict[str, object]:
        return {"state": self.state, "failures": self.failures}


class RetryBudgetExhausted(ToolUnavailable):
    """A retry was refused: the root task's shared retry budget is spent
    (``retries >= max(minimum, calls * ratio)``)."""

    reason = "retry_budget"

    def __init__(
        self, scope: str, calls: int, retries: int, allowance: float, *, tool: str | None = None
    ) -> None:
        super().__init__(
            f"the retry budget of {scope!r} is spent: {retries} retries for {calls} calls "
            f"(allowance {allowance:g})",
            tool=tool,
            dependency=scope,
            retry_after_s=None,
        )
        self.scope = scope
        self.calls = calls
        self.retries = retries
        self.allowance = allowance

    def details(self) -> dict[str, object]:
        return {"calls": self.calls, "retries": self.retries, "allowance": self.allowance}


class DeadlineExceeded(ToolUnavailable):
    """The deadline of the work has passed: stop, do not retry (the whole task tree ends)."""

    reason = "deadline"

    def __init__(
        self, what: str = "the work", *, overdue_s: float = 0.0, message: str | None = None
    ) -> None:
        super().__init__(
            message or f"the deadline of {what} passed {max(0.0, overdue_s):.3f} s ago",
            retry_after_s=None,
        )
        self.overdue_s = max(0.0, overdue_s)

    def details(self) -> dict[str, object]:
        return {"overdue_s": round(self.overdue_s, 3)}


class BudgetExceeded(ToolUnavailable):
    """A spend reservation would cross its limit; nothing was reserved."""

    reason = "spend_budget"

    def __init__(self, scope: str, kind: str, limit: int, spent: int, requested: int) -> None:
        super().__init__(
            f"the {kind!r} budget of {scope!r} would be crossed: {spent} of {limit} spent or "
            f"reserved, {requested} more asked",
            dependency=scope,
            retry_after_s=None,
        )
        self.scope = scope
        self.kind = kind
        self.limit = limit
        self.spent = spent
        self.requested = requested

    def details(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "limit": self.limit,
            "spent": self.spent,
            "requested": self.requested,
        }


class PlanDiverged(AgentLeaseError):
    """A replayed run asked the model for a response its trace does not hold: one call too
    many, a task or step that was not recorded, or (strict replay) another request.

    The plan is pinned by the trace, so a run that leaves it is no longer the recorded run.

    Attributes:
        task: the task whose plan diverged.
        step: the step that diverged (``m1``, ``m2``, ... for a task's model calls in order).
        held: how many model responses the trace holds for the task.
        detail: what differed, or ``""``.
    """

    def __init__(self, task: str, step: str, held: int, detail: str = "") -> None:
        super().__init__(
            f"the plan diverged at step {step} of task {task!r}: the trace holds {held}"
            f" model responses for it" + (f"; {detail}" if detail else "")
        )
        self.task = task
        self.step = step
        self.held = held
        self.detail = detail


class Cancelled(AgentLeaseError):
    """The worker cancelled this job: shutdown went past its grace period."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"job for task {task_id!r} was cancelled by the worker's shutdown")
        self.task_id = task_id


class TaskTimeout(AgentLeaseError, TimeoutError):
    """An attempt ran past the task's time limit: it was cancelled (a sync handler was asked to
    stop) and the attempt failed; the retry policy decides whether it runs again."""

    def __init__(self, task_id: str, limit_s: float) -> None:
        super().__init__(f"task {task_id!r} ran past its time limit of {limit_s:g} s")
        self.task_id = task_id
        self.limit_s = limit_s


class WorkerError(AgentLeaseError):
    """The worker cannot run as configured (for example, the handler cannot be imported)."""
