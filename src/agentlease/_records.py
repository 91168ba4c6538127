"""The records that cross the storage seam and reach users: tasks, leases, jobs, stats; the
reservations and outcomes of idempotency keys; versioned records and lock grants; the states of
retry budgets and circuit breakers.

Values are kept as the JSON bytes the store holds and decoded on access, so a backend never
encodes or decodes and every backend returns byte-identical values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from agentlease._codec import JSON, decode

__all__ = [
    "ATTEMPTS_KEPT",
    "Attempt",
    "AttemptOutcome",
    "BreakerState",
    "BreakerStatus",
    "BudgetState",
    "CancelOutcome",
    "Cancellation",
    "Enqueued",
    "FinishedState",
    "Job",
    "KeyHold",
    "KeyRecord",
    "KeyState",
    "Lease",
    "LeaseInfo",
    "LeaseTerms",
    "ListedState",
    "LockBusy",
    "NewTask",
    "PlanRead",
    "PlanReceipt",
    "PlanWrite",
    "QueueStats",
    "Reaped",
    "RecordWrite",
    "StaleRead",
    "StateRecord",
    "Task",
    "TaskSpec",
    "TaskState",
    "Versioned",
    "WorkerInfo",
    "attempts_from_json",
    "close_attempt",
    "encode_context",
    "error_type",
    "open_attempt",
    "with_last_attempt",
]

TaskState = Literal[
    "parked", "scheduled", "queued", "leased", "failed", "done", "dead", "cancelled"
]
"""``parked``: waiting behind an unfinished task of the same partition; ``scheduled``: waiting
for ``run_at``; ``queued``: ready; ``leased``: held by a worker; ``failed``: raised and waiting
for its retry time; ``done``: completed; ``dead``: dead-lettered; ``cancelled``: cancelled by
:meth:`~agentlease.Queue.cancel` (its reason in ``cancel_reason``)."""

STATES: tuple[TaskState, ...] = (
    "parked",
    "scheduled",
    "queued",
    "leased",
    "failed",
    "done",
    "dead",
    "cancelled",
)
FinishedState = Literal["done", "dead", "cancelled"]
"""The states a task ends in, and is purged from after its retention."""

FINISHED: tuple[FinishedState, ...] = ("done", "dead", "cancelled")
"""The terminal states: nothing moves a task out of them but ``requeue_dead`` (dead only)."""

ListedState = Literal["queued", "leased", "done", "dead", "cancelled"]
"""The states whose tasks can be listed page by page, each through an index of its own."""

LISTED: tuple[ListedState, ...] = ("queued", "leased", "done", "dead", "cancelled")

BUSY: tuple[TaskState, ...] = ("scheduled", "queued", "leased", "failed")
"""The states that keep a task's partition busy: its later tasks stay parked meanwhile."""


@dataclass(frozen=True, slots=True)
class Lease:
    """One claim of one task: the proof a holder shows on every write.

    Attributes:
        task_id: the claimed task.
        queue: its queue.
        token: random and never reused; the store compares it on every holder write.
        attempt: the fencing number, +1 at every claim of this task. Pass it to external systems
            so they can refuse writes from an older attempt.
        leased_at: when the claim happened, on the store's clock (seconds since the epoch).
        expires_at: when the lease runs out unless extended, on the store's clock.
    """

    task_id: str
    queue: str
    token: str
    attempt: int
    leased_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class Job:
    """A claimed task as a worker sees it: the lease plus what the handler needs.

    ``context_json`` is the task's context as enqueued (see :func:`encode_context`): the root task
    and the deadline it inherited, its own time limit and the trace it was enqueued in, or
    ``None``. ``run_at`` is when the task became due on the store's clock (its enqueue, delay or
    retry time), where the store reports it: ``lease.leased_at - run_at`` is how long it waited.
    """

    lease: Lease
    payload_json: bytes
    checkpoint_json: bytes | None = None
    priority: int = 0
    failures: int = 0
    reclaims: int = 0
    context_json: bytes | None = None
    run_at: float | None = None

    @property
    def task_id(self) -> str:
        """The claimed task's id."""
        return self.lease.task_id

    @property
    def attempt(self) -> int:
        """The lease's fencing number."""
        return self.lease.attempt

    @property
    def payload(self) -> JSON:
        """The task's payload, decoded."""
        return decode(self.payload_json)

    @property
    def checkpoint(self) -> JSON:
        """The last checkpoint an earlier attempt saved, or ``None``."""
        return decode(self.checkpoint_json)

    @property
    def root_id(self) -> str:
        """The root task this task belongs to (its own id if it is a root)."""
        return _context_root(self.context_json) or self.lease.task_id

    @property
    def deadline(self) -> float | None:
        """The deadline of the task's tree, in seconds on the store's clock, or ``None``."""
        return _context_deadline(self.context_json)

    @property
    def timeout(self) -> float | None:
        """The task's own time limit per attempt in seconds, or ``None`` (the worker's)."""
        return _context_timeout(self.context_json)

    @property
    def trace_context(self) -> dict[str, str]:
        """The W3C trace context the task was enqueued in (``traceparent`` and, if any,
        ``tracestate``); empty when it was enqueued without tracing."""
        return _context_trace(self.context_json)


@dataclass(frozen=True, slots=True)
class Task:
    """Everything the store knows about one task (read-only snapshot)."""

    id: str
    queue: str
    state: TaskState
    priority: int
    payload_json: bytes
    attempt: int
    reclaims: int
    failures: int
    max_reclaims: int
    created_at: float
    run_at: float
    dedup_key: str | None = None
    leased_at: float | None = None
    expires_at: float | None = None
    finished_at: float | None = None
    progress_json: bytes | None = None
    checkpoint_json: bytes | None = None
    result_json: bytes | None = None
    error_json: bytes | None = None
    partition: str | None = None
    context_json: bytes | None = None
    cancel_reason: str | None = None
    """Why the task was cancelled, once a cancel was asked for: ``cancelled`` tasks, and
    ``leased`` ones whose holder has not been told yet (its next heartbeat ends them)."""
    attempts: tuple[Attempt, ...] = field(default=(), compare=False)
    """The task's last attempts (at most :data:`ATTEMPTS_KEPT`), oldest first, as ``get``
    reads them; empty where a primitive returns a task without them (``fail``, ``dead``), so
    they take no part in comparing two snapshots of a task."""

    @property
    def payload(self) -> JSON:
        """The payload, decoded."""
        return decode(self.payload_json)

    @property
    def cancel_requested(self) -> bool:
        """Whether a cancel was asked for while the task was leased, and not yet carried out."""
        return self.state == "leased" and self.cancel_reason is not None

    @property
    def root_id(self) -> str:
        """The root task this task belongs to (its own id if it is a root)."""
        return _context_root(self.context_json) or self.id

    @property
    def deadline(self) -> float | None:
        """The deadline of the task's tree, in seconds on the store's clock, or ``None``."""
        return _context_deadline(self.context_json)

    @property
    def timeout(self) -> float | None:
        """The task's own time limit per attempt in seconds, or ``None`` (the worker's)."""
        return _context_timeout(self.context_json)

    @property
    def trace_context(self) -> dict[str, str]:
        """The W3C trace context the task was enqueued in (``traceparent`` and, if any,
        ``tracestate``); empty when it was enqueued without tracing."""
        return _context_trace(self.context_json)

    @property
    def result(self) -> JSON:
        """The accepted result, decoded (``None`` until done)."""
        return decode(self.result_json)

    @property
    def error(self) -> JSON:
        """The last recorded error, decoded: ``{"type", "message"}`` or a reap reason."""
        return decode(self.error_json)

    @property
    def progress(self) -> JSON:
        """The last progress value, decoded."""
        return decode(self.progress_json)

    @property
    def checkpoint(self) -> JSON:
        """The last checkpoint, decoded."""
        return decode(self.checkpoint_json)


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSpec:
    """One task for :meth:`Queue.enqueue_many`.

    Attributes:
        payload: the task's JSON payload.
        id: a caller-given id (enqueueing an existing id creates nothing); generated if ``None``.
        priority: higher runs first; ties run in enqueue order.
        delay: seconds before the task may run.
        dedup_key: a key unique within the queue; a second task with it creates nothing.
        partition: the resource the task writes to (an account, a document): tasks of one
            partition run one at a time, in enqueue order; different partitions in parallel.
        deadline: seconds from now by which the task's whole tree of work must end (the
            earlier of this and the deadline in force where it is enqueued wins).
        timeout: the time limit of each attempt in seconds (default: the worker's
            ``task_timeout``): past it the attempt fails with ``TaskTimeout`` and is retried.
    """

    payload: JSON = None
    id: str | None = None
    priority: int = 0
    delay: float = 0.0
    dedup_key: str | None = None
    partition: str | None = None
    deadline: float | None = None
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class NewTask:
    """A task to enqueue, already validated and encoded (the seam's input)."""

    id: str
    queue: str
    payload_json: bytes
    priority: int = 0
    delay: float = 0.0
    dedup_key: str | None = None
    max_reclaims: int = 5
    partition: str | None = None
    context_json: bytes | None = None


def encode_context(
    root: str | None,
    deadline: float | None,
    timeout: float | None = None,
    trace: dict[str, str] | None = None,
) -> bytes | None:
    """A task's context as the store keeps it (verbatim, beside the task): the JSON object
    ``{"root": <root task id>, "deadline": <seconds on the store's clock>, "timeout": <seconds
    an attempt may run>, "traceparent": ..., "tracestate": ...}``, each key only when known;
    ``None`` when none is (the task is its own root, with no deadline, no time limit of its own
    and no trace).

    The trace context (W3C ``traceparent`` and ``tracestate``, from ``trace``) is part of the
    task's context, not of its payload: like the root and the deadline it describes where the
    task comes from, is written once at enqueue by the code that enqueues it, kept by every
    store in the task's own context field (a column in SQLite and PostgreSQL, a field of the
    task's hash in Redis) through retries, reclaims and requeues, handed to whoever claims the
    task, and never seen by the handler's payload. A handler's spans join the enqueuer's trace
    through it, across processes and machines.
    """
    trace = {k: v for k, v in (trace or {}).items() if k in _TRACE_KEYS and v}
    if root is None and deadline is None and timeout is None and not trace:
        return None
    context: dict[str, str | float] = {}
    if root is not None:
        context["root"] = root
    if deadline is not None:
        context["deadline"] = float(deadline)
    if timeout is not None:
        context["timeout"] = float(timeout)
    context.update(trace)
    return orjson.dumps(context)


_TRACE_KEYS = ("traceparent", "tracestate")


def _context_trace(data: bytes | None) -> dict[str, str]:
    context = _context(data)
    return {k: v for k in _TRACE_KEYS if isinstance(v := context.get(k), str) and v}


def _context(data: bytes | None) -> dict[str, Any]:
    if data is None:
        return {}
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _context_root(data: bytes | None) -> str | None:
    root = _context(data).get("root")
    return root if isinstance(root, str) and root else None


def _context_number(data: bytes | None, name: str) -> float | None:
    value = _context(data).get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _context_deadline(data: bytes | None) -> float | None:
    return _context_number(data, "deadline")


def _context_timeout(data: bytes | None) -> float | None:
    return _context_number(data, "timeout")


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The outcome of enqueueing one task.

    ``created`` is false when a task with the same id, or the same dedup key in the same queue,
    already existed; ``task_id`` then names that existing task.
    """

    task_id: str
    created: bool


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """How a claim leases its tasks (validated above the seam).

    Attributes:
        lease_for: seconds until the lease expires unless extended.
        max_total: the longest a lease may be held in total, however often it is extended.
        progress_timeout: if set, a lease not followed by progress within this many seconds is
            not extended past that point, so an alive-but-stuck holder is reaped.
        reap_front: whether tasks reaped by this claim go to the front of their priority.
        holder: who claims (a worker's id, see :class:`WorkerInfo`): the store records it with
            each lease it grants (``inspect`` shows it) and in the task's attempt history.
    """

    lease_for: float
    max_total: float
    progress_timeout: float | None = None
    reap_front: bool = True
    holder: str | None = None


@dataclass(frozen=True, slots=True)
class Reaped:
    """A lease that expired and what the reaper did with its task."""

    task_id: str
    queue: str
    attempt: int
    outcome: Literal["requeued", "dead", "cancelled"]


CancelOutcome = Literal["cancelled", "requested", "finished"]
"""``cancelled``: the task was waiting (queued, scheduled, failed, parked) or its lease had run
out, and is now ``cancelled``; ``requested``: it is leased, and its holder is told at its next
heartbeat (the task then ends ``cancelled``); ``finished``: it had already ended (done, dead or
cancelled) and nothing changed."""


@dataclass(frozen=True, slots=True)
class Cancellation:
    """What :meth:`~agentlease.Queue.cancel` did, decided in one atomic step on the store.

    Attributes:
        task_id: the task.
        outcome: see :data:`CancelOutcome`.
        state: the task's state after the call.
        reason: the reason in force: the one given, or for a task already cancelled (or with a
            cancel already requested), the first one.
    """

    task_id: str
    outcome: CancelOutcome
    state: TaskState
    reason: str | None


def cancel_error(reason: str) -> bytes:
    """The error a cancelled task keeps (written when the cancel is asked for): ``{"type":
    "TaskCancelled", "message": ..., "reason": <the reason>}``."""
    error = {"type": "TaskCancelled", "message": f"cancelled: {reason}", "reason": reason}
    return orjson.dumps(error)


def reason_of(error_json: bytes | None) -> str | None:
    """The cancel reason in a stored cancel error (see :func:`cancel_error`), else ``None``."""
    error = _context(error_json)
    reason = error.get("reason")
    if error.get("type") != "TaskCancelled" or not isinstance(reason, str):
        return None
    return reason


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts and ages for one queue, read in one consistent snapshot."""

    queue: str
    counts: dict[str, int] = field(default_factory=dict)
    oldest_queued_age: float | None = None
    now: float = 0.0
    hot_partitions: tuple[tuple[str, int], ...] = ()
    """Up to five partitions with the most parked tasks, most first: the resources whose
    tasks wait on each other."""

    @property
    def depth(self) -> int:
        """Tasks waiting to run now (queued) or later (scheduled, failed, parked)."""
        return sum(self.counts.get(s, 0) for s in ("queued", "scheduled", "failed", "parked"))


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """A live lease as ``inspect`` shows it."""

    task_id: str
    attempt: int
    leased_for: float
    expires_in: float
    reclaims: int
    failures: int
    holder: str | None = None
    """The worker that claimed the lease (its id: ``host:pid:...``), ``None`` if the claim
    named none."""


AttemptOutcome = Literal["done", "failed", "timed_out", "released", "expired"]
"""How an attempt ended: ``done`` (completed), ``failed`` (raised; ``error`` names the type),
``timed_out`` (failed with ``TaskTimeout``: it ran past its time limit), ``released`` (given
back unrun, e.g. at shutdown), ``expired`` (its lease ran out and a reaper took the task back;
the worker died or stalled). Other stores' or newer versions' outcomes pass through as
stored."""

ATTEMPTS_KEPT = 20
"""How many attempts of a task the store keeps (the oldest are dropped first)."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt (one claim) of a task, as the store recorded it.

    Attributes:
        attempt: the lease's fencing number.
        worker: the id of the worker that claimed it (``None`` if the claim named none).
        started: when it was claimed, on the store's clock.
        ended: when it ended (``None`` while it runs).
        outcome: how it ended (see :data:`AttemptOutcome`), ``None`` while it runs.
        error: the error type of a failed attempt, else ``None``.
    """

    attempt: int
    worker: str | None
    started: float
    ended: float | None = None
    outcome: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, JSON]:
        """The attempt as a JSON object."""
        return {
            "attempt": self.attempt,
            "worker": self.worker,
            "started": self.started,
            "ended": self.ended,
            "outcome": self.outcome,
            "error": self.error,
        }


def _num(value: Any) -> float | None:
    if value is None or value is False or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def attempts_from_json(data: bytes | str | None) -> tuple[Attempt, ...]:
    """A task's attempts from the JSON array a store keeps (objects with ``attempt``, ``worker``,
    ``started``, ``ended``, ``outcome``, ``error``; times as numbers or decimal strings), sorted
    by attempt. A failure whose error type is ``TaskTimeout`` reads as ``timed_out``."""
    if not data:
        return ()
    try:
        items = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ()
    if isinstance(items, dict):  # an empty Lua table encodes as {}
        items = list(items.values())
    out: list[Attempt] = []
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        number = _num(item.get("attempt"))
        started = _num(item.get("started"))
        if number is None or started is None:
            continue
        outcome = _text(item.get("outcome"))
        error = _text(item.get("error"))
        if outcome == "failed" and error == "TaskTimeout":
            outcome = "timed_out"
        out.append(
            Attempt(
                int(number),
                _text(item.get("worker")),
                started,
                _num(item.get("ended")),
                outcome,
                error if outcome in ("failed", "timed_out") else None,
            )
        )
    out.sort(key=lambda a: a.attempt)
    return tuple(out[-ATTEMPTS_KEPT:])


def with_last_attempt(
    ended: tuple[Attempt, ...],
    *,
    state: str,
    attempt: int,
    holder: str | None,
    leased_at: float | None,
    finished_at: float | None,
) -> tuple[Attempt, ...]:
    """A task's whole history from the attempts a store recorded and the task's own fields.

    The SQL and Redis stores record an attempt only when it ends otherwise than done (failed,
    timed out, released, expired, cancelled): a claim and a completion, the path nearly every
    task takes, write nothing more than the task itself. The running attempt (state ``leased``)
    and the last one of a ``done`` task are read from the task: its attempt number, its holder
    (the worker of its last claim), its ``leased_at`` and ``finished_at``."""
    if attempt <= 0 or leased_at is None or any(a.attempt == attempt for a in ended):
        return ended
    if state == "leased":
        last = Attempt(attempt, holder, leased_at)
    elif state == "done":
        last = Attempt(attempt, holder, leased_at, finished_at, "done")
    else:
        return ended
    return (*ended, last)[-ATTEMPTS_KEPT:]


def error_type(error_json: bytes | None) -> str | None:
    """The ``type`` of a recorded error (``{"type": ..., "message": ...}``), else ``None``."""
    value = _context(error_json)
    kind = value.get("type")
    return kind if isinstance(kind, str) and kind else None


def open_attempt(
    attempts: tuple[Attempt, ...], attempt: int, worker: str | None, now: float
) -> tuple[Attempt, ...]:
    """The history with a new running attempt, the oldest dropped past :data:`ATTEMPTS_KEPT`."""
    return (*attempts, Attempt(attempt, worker, now))[-ATTEMPTS_KEPT:]


def close_attempt(
    attempts: tuple[Attempt, ...],
    attempt: int,
    now: float,
    outcome: str,
    error: str | None = None,
) -> tuple[Attempt, ...]:
    """The history with the running attempt numbered ``attempt`` ended (unchanged if none); a
    failure whose error type is ``TaskTimeout`` ends it ``timed_out``."""
    if outcome == "failed" and error == "TaskTimeout":
        outcome = "timed_out"
    out = list(attempts)
    for i in range(len(out) - 1, -1, -1):
        a = out[i]
        if a.attempt == attempt and a.ended is None:
            out[i] = Attempt(a.attempt, a.worker, a.started, now, outcome, error)
            break
    return tuple(out)


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A live worker as the store lists it: what it registered, and when its entry lapses.

    Attributes:
        id: the worker's id (unique: ``host:pid:<random>``).
        info_json: what it registered (JSON object: ``host``, ``pid``, ``queues``,
            ``concurrency``, ``started``, ``tasks``), kept as the bytes it sent.
        beat_at: its last registration (heartbeat), on the store's clock.
        expires_at: when its entry lapses unless it registers again, on the store's clock.
    """

    id: str
    info_json: bytes
    beat_at: float
    expires_at: float

    @property
    def info(self) -> dict[str, Any]:
        """What the worker registered, decoded (``{}`` if it was not a JSON object)."""
        return _context(self.info_json)

    @property
    def host(self) -> str:
        """The worker's host name."""
        return str(self.info.get("host", ""))

    @property
    def pid(self) -> int:
        """The worker's process id (0 if unknown)."""
        pid = self.info.get("pid")
        return pid if isinstance(pid, int) else 0

    @property
    def queues(self) -> list[str]:
        """The queues it serves."""
        queues = self.info.get("queues")
        return [q for q in queues if isinstance(q, str)] if isinstance(queues, list) else []

    @property
    def concurrency(self) -> int:
        """How many tasks it runs at once."""
        value = self.info.get("concurrency")
        return value if isinstance(value, int) else 0

    @property
    def started(self) -> float | None:
        """When it started (its own clock, seconds since the epoch)."""
        return _num(self.info.get("started"))

    @property
    def tasks(self) -> list[str]:
        """The ids of the tasks in its hands at its last registration."""
        tasks = self.info.get("tasks")
        return [t for t in tasks if isinstance(t, str)] if isinstance(tasks, list) else []


def task_from_row(row: Sequence[Any]) -> Task:
    """A :class:`Task` from a SQL row of its columns in the order the backends select them:
    id, queue, state, priority, payload, attempt, reclaims, failures, max_reclaims, created_at,
    run_at, dedup_key, leased_at, expires_at, finished_at, progress, checkpoint, result, error,
    and optionally partition, context, cancel reason, the ended attempts (a JSON array, see
    :func:`attempts_from_json`) and the holder of the last claim (see
    :func:`with_last_attempt`)."""
    attempts = attempts_from_json(row[22]) if len(row) > 22 else ()
    if len(row) > 23:
        attempts = with_last_attempt(
            attempts,
            state=row[2],
            attempt=row[5],
            holder=row[23],
            leased_at=row[12],
            finished_at=row[14],
        )
    return Task(
        id=row[0],
        queue=row[1],
        state=row[2],
        priority=row[3],
        payload_json=row[4],
        attempt=row[5],
        reclaims=row[6],
        failures=row[7],
        max_reclaims=row[8],
        created_at=row[9],
        run_at=row[10],
        dedup_key=row[11],
        leased_at=row[12],
        expires_at=row[13],
        finished_at=row[14],
        progress_json=row[15],
        checkpoint_json=row[16],
        result_json=row[17],
        error_json=row[18],
        partition=row[19] if len(row) > 19 else None,
        context_json=None if len(row) <= 20 or row[20] is None else bytes(row[20]),
        cancel_reason=row[21] if len(row) > 21 else None,
        attempts=attempts,
    )


def renewed_leases(leases: Sequence[Lease], rows: Sequence[Sequence[Any]]) -> list[Lease | None]:
    """Each lease renewed with its new expiry from ``(task_id, token, expires_at)`` rows, or
    ``None`` where no row renewed it (matched on the token, so a stale lease of a task whose live
    lease was renewed in the same call stays ``None``)."""
    renewed = {(task_id, token): expires for task_id, token, expires in rows}
    out: list[Lease | None] = []
    for lease in leases:
        expires = renewed.get((lease.task_id, lease.token))
        out.append(
            None
            if expires is None
            else Lease(
                lease.task_id, lease.queue, lease.token, lease.attempt, lease.leased_at, expires
            )
        )
    return out


KeyState = Literal["in_flight", "done", "failed"]
"""``in_flight``: reserved by an attempt that has not recorded an outcome (or was released);
``done``: the action's result is stored; ``failed``: its permanent failure is stored."""


@dataclass(frozen=True, slots=True)
class KeyHold:
    """A reservation of an idempotency key: the proof its holder shows on every write.

    Attributes:
        key: the idempotency key.
        token: random and never reused; the store compares it on every holder write.
        fence: +1 at every reservation of the key (first or takeover): a fencing number to pass
            downstream.
        expires_at: when the in-flight lease runs out unless extended, on the store's clock.
        taken_over: the reservation was taken over from an earlier holder whose in-flight lease
            ran out (or who released it): that holder may or may not have acted.
    """

    key: str
    token: str
    fence: int
    expires_at: float
    taken_over: bool = False


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """An idempotency key as the store holds it, read in one atomic step.

    ``now`` is the store's clock at the read, so ``expires_at - now`` is the holder's time left.
    """

    key: str
    state: KeyState
    fingerprint: str
    fence: int
    holder: str
    expires_at: float | None
    result_json: bytes | None
    error_json: bytes | None
    created_at: float
    finished_at: float | None
    purge_at: float
    now: float

    @property
    def result(self) -> JSON:
        """The stored result, decoded (``None`` unless ``state == "done"``)."""
        return decode(self.result_json)

    @property
    def error(self) -> JSON:
        """The stored permanent failure, decoded (``None`` unless ``state == "failed"``)."""
        return decode(self.error_json)


def key_record_from_row(row: Sequence[Any], now: float) -> KeyRecord:
    """A :class:`KeyRecord` from a SQL row of its 11 columns in the order the backends select
    them: key, state, fingerprint, fence, holder, expires_at, result, error, created_at,
    finished_at, purge_at."""
    return KeyRecord(
        key=row[0],
        state=row[1],
        fingerprint=row[2],
        fence=row[3],
        holder=row[4],
        expires_at=row[5],
        result_json=None if row[6] is None else bytes(row[6]),
        error_json=None if row[7] is None else bytes(row[7]),
        created_at=row[8],
        finished_at=row[9],
        purge_at=row[10],
        now=now,
    )


@dataclass(frozen=True, slots=True)
class RecordWrite:
    """One guarded write of a versioned record, applied in one atomic step.

    Checked in this order against the record as stored (an absent record has version 0, no
    fields and fence 0); the first that fails refuses the write and nothing changes:

    1. ``fence``: refused (:class:`~agentlease.errors.FencedOff`) if lower than the highest
       fencing token the record has seen; else the record keeps the higher of the two.
    2. ``expected_version``: refused (:class:`~agentlease.errors.ConflictError`) unless equal to
       the stored version (0: the record must not exist). ``None`` checks nothing (a blind
       field write).
    3. ``guard_field``: refused (:class:`~agentlease.errors.TransitionRefused`) unless the
       stored JSON of that field is one of ``allowed_from`` (``None`` in it: the field may be
       absent).

    Then ``fields`` (field name -> JSON bytes) are set (``replace``: and every other field is
    dropped), and the version goes up by one.
    """

    fields: dict[str, bytes]
    replace: bool = False
    expected_version: int | None = None
    guard_field: str | None = None
    allowed_from: tuple[bytes | None, ...] = ()
    fence: int | None = None


@dataclass(frozen=True, slots=True)
class StateRecord:
    """A versioned record as stored: its fields (JSON bytes each), version and fence."""

    key: str
    version: int
    fields: dict[str, bytes]
    fence: int
    updated_at: float

    @property
    def value(self) -> dict[str, JSON]:
        """The record's fields, decoded."""
        return {name: decode(data) for name, data in self.fields.items()}


@dataclass(frozen=True, slots=True)
class PlanRead:
    """What a plan read, to be checked when it is acted on: a record's or a counter's version
    (0: it did not exist), or the version column of a row of the user's own table (``pin``).

    ``key`` is the record key or counter name as the store keeps it (a state space's names are
    qualified: ``"<space>|<name>"``); for a pin, the canonical JSON of ``{"table": ...,
    "where": {column: value, ...}, "column": ...}`` (identifiers checked above the seam).
    """

    kind: Literal["record", "counter", "pin"]
    key: str
    version: int


@dataclass(frozen=True, slots=True)
class PlanWrite:
    """One write a plan declared: a guarded record write (``record``, applied as
    ``write_record`` applies it) or a bounded counter step (``delta`` within ``low`` and
    ``high``, as ``add_counter``)."""

    kind: Literal["record", "counter"]
    key: str
    record: RecordWrite | None = None
    delta: int = 0
    low: int | None = None
    high: int | None = None


@dataclass(frozen=True, slots=True)
class StaleRead:
    """A read of a plan that no longer holds: the version the plan read and the version now."""

    kind: Literal["record", "counter", "pin"]
    key: str
    read_version: int
    current_version: int


@dataclass(frozen=True, slots=True)
class PlanReceipt:
    """The outcome of acting on a plan, kept by the store under the plan's id.

    ``first`` is true for the call that acted and false for every later one (the stored
    receipt, replayed: approving a plan twice acts once). ``versions`` holds, for each of the
    plan's writes in order, the record's version after it (a counter: its version after it).
    ``approved_at`` is on the store's clock.
    """

    plan_id: str
    first: bool
    approved_by: str
    approved_at: float
    versions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LockBusy:
    """Why a lock set was not acquired: the first lock (in canonical order) held by another
    owner, its holder, and the seconds until its lease runs out."""

    name: str
    holder: str
    retry_after: float


@dataclass(frozen=True, slots=True)
class Versioned:
    """A record's value and the version it was read at (0 and ``{}``: it does not exist)."""

    value: dict[str, JSON]
    version: int


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A retry budget after one ``retry_budget`` step.

    Attributes:
        calls: the calls recorded so far in this budget.
        retries: the retries granted so far.
        granted: whether this step granted the retry it asked for (``False`` when it asked for
            none).
    """

    calls: int
    retries: int
    granted: bool


BreakerStatus = Literal["closed", "open", "half_open"]
"""``closed``: calls go ahead; ``open``: refused until the cool-down ends; ``half_open``: one
trial call decides whether it closes again."""


@dataclass(frozen=True, slots=True)
class BreakerState:
    """A circuit breaker as one ``breaker_admit`` or ``breaker_record`` step left it.

    Attributes:
        state: closed, open or half_open.
        failures: consecutive failures recorded while closed.
        fence: the number of the latest half-open trial (only rises; 0 before any).
        retry_after: seconds until a trial may be admitted: while open, until the cool-down
            ends; while half-open with a live trial, until that trial's turn runs out; else 0.
        trial: this ``breaker_admit`` granted the caller the half-open trial numbered ``fence``
            (always ``False`` from ``breaker_record``).
    """

    state: BreakerStatus
    failures: int
    fence: int
    retry_after: float
    trial: bool
