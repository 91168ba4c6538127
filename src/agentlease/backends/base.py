"""The storage seam: the atomic primitives every backend implements, in a sync and an async face.

Policy (retry decisions, validation, JSON, events) lives above this seam and is written once. A
backend only moves records, and each primitive is **one atomic step** on its store: one
``BEGIN IMMEDIATE`` transaction in SQLite, one critical section in memory, one Lua script in Redis,
one statement or transaction in PostgreSQL. Times are absolute seconds on **the store's clock**;
callers pass durations.

Every holder write (``extend``, ``complete``, ``fail``, ``release``, ``progress``) is fenced: it
compares the lease's token and requires the lease to be live (``now < expires_at``) inside the
same step, and a stale one raises :class:`~agentlease.errors.LeaseLost` and changes nothing.

Partitions (single-writer routing). A task may carry a ``partition`` (the resource it writes
to). A partition is *busy* while one of its tasks is scheduled, queued, leased or failed
(``BUSY``); a task enqueued (or requeued from the dead letters) into a busy partition, or after
an earlier task of the same partition in the same enqueue call, is stored ``parked`` instead.
Whenever a task of a partition becomes done or dead (complete, complete_many, fail, or a reap
past max_reclaims inside claim or reap), the same atomic step unparks the partition's oldest
parked task (lowest sequence) if the partition is no longer busy: it becomes queued, or
scheduled if its ``run_at`` is still ahead. ``stats`` counts parked tasks and names up to five
partitions with the most of them (``hot_partitions``).

Cancellation. ``cancel`` decides in one atomic step: a task that waits (queued, scheduled,
failed, parked), or whose lease has run out, becomes ``cancelled`` at once (``finished_at`` set,
its error the cancel error with the reason, its partition freed exactly as a completion frees
it). A live lease is flagged instead: the reason and the cancel error are stored, the task stays
``leased``, and every holder write on it (complete, fail, release, progress; extend renews
nothing) is refused with :class:`~agentlease.errors.TaskCancelled` and changes nothing. The
holder's next ``extend`` of that lease (its heartbeat) ends the task ``cancelled``, as does the
reaper when the lease runs out (never a requeue). A task that has ended (done, dead, cancelled)
is left as it is. ``delete_queue`` deletes one bounded batch of a queue's tasks per atomic step,
and the queue itself with its last batch.

Task context. A task may carry ``context_json`` (:class:`~agentlease._records.NewTask`): a JSON
object ``{"root": <task id>, "deadline": <seconds on the store's clock>, "timeout": <seconds>,
"traceparent": ..., "tracestate": ...}`` (every key optional) naming the root task it belongs
to, the deadline of that tree of work, its own time limit per attempt and the W3C trace context
it was enqueued in. The store
keeps it verbatim with the task, writes it only at enqueue, and returns it unchanged in every
:class:`~agentlease._records.Job` that ``claim`` (and ``complete_and_claim``) hands out and every
:class:`~agentlease._records.Task` that ``get``, ``dead`` and ``fail`` return; it belongs to the
task, so it survives retries, reclaims and ``requeue_dead``. A task without one has
``context_json=None`` (so do tasks stored before the store knew contexts). The store never
reads it: what a deadline means is decided above the seam (the worker's claim compares it with
the lease's ``leased_at``).

Attempt history. Every primitive that starts or ends a lease records it in the task's history
in the same atomic step: a claim adds the attempt (its number, the claim's
``LeaseTerms.holder``, the store's time), and ``complete``, ``fail``, ``release`` and a reap
(inside ``claim`` or ``reap``) end it with its outcome (``done``, ``failed`` with the error's
type, ``released``, ``expired``). The store keeps the last
:data:`~agentlease._records.ATTEMPTS_KEPT` attempts of a task; ``get`` returns them
(:attr:`~agentlease._records.Task.attempts`) and ``inspect`` each lease's holder.

Live workers (``register_worker``, ``workers``, ``unregister_worker``): one entry per worker id,
store-wide, with a TTL on the store's clock; a worker registers again on a timer (its
heartbeat) and removes itself when it stops cleanly. An entry whose TTL has passed is not
listed, and ``register_worker`` deletes such entries (a bounded number per call) in its step.

Idempotency keys (``*_key`` primitives) live beside the tasks, one record per key, unique in the
store. A key moves ``absent -> in_flight -> done | failed`` (or back to absent-like on release),
each transition one atomic step. The holder of an in-flight reservation proves it with the
token of its :class:`~agentlease._records.KeyHold`; a write with another token raises
:class:`~agentlease.errors.ReservationLost` and changes nothing. A key whose ``purge_at`` has
passed counts as absent, whether or not the store has deleted it yet.

Shared-state guards (``*_record``, ``*_counter``, ``*_locks`` primitives) are each one atomic
step too: a versioned record's write checks its fence, version and state transition and writes
in the same step; a bounded counter refuses to leave its range; a lock set is acquired all or
nothing, with lock leases on the store's clock and a fencing token per lock that only increases.
A counter hold (``*_hold`` primitives) is a reservation with a lease: its units count in the
counter while it lives, and every step that touches the counter first gives back the units of
its holds that ran out, so no reaper is needed for capacity to come back.
Lock names share one namespace per store (on Redis Cluster: one hash tag, so one shard).
``commit_hold`` may settle a hold: keep another number of units than it held, the counter moving
by the difference in the same step (a spend reserved with an estimate, settled with the actual).

Retry budgets and circuit breakers (``retry_budget``, ``breaker_*``) are one small record per
key, each primitive one atomic step on it (one Lua script, one PostgreSQL function call, one
``BEGIN IMMEDIATE`` transaction, one critical section), with times from the store's clock. A
record expires ``ttl`` seconds after its last write; an expired record counts as absent (Redis
deletes it itself; the SQL stores overwrite the row at its next write). The healthy paths write
nothing: admitting a call to a closed breaker is a read, and so is recording a success that has
no failure count to reset. A half-open breaker admits exactly one trial per window, numbered by a
fence that only rises; an outcome reported with any other fence (a trial that lost its turn, a
slow call admitted before the circuit opened) changes nothing. The decisions are written out in
``_budgets.py``, which the memory and SQLite backends run as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from agentlease._cursor import Key
from agentlease._records import (
    BreakerState,
    BudgetState,
    Cancellation,
    Enqueued,
    FinishedState,
    Job,
    KeyHold,
    KeyRecord,
    Lease,
    LeaseInfo,
    LeaseTerms,
    ListedState,
    LockBusy,
    NewTask,
    PlanRead,
    PlanReceipt,
    PlanWrite,
    QueueStats,
    Reaped,
    RecordWrite,
    StaleRead,
    StateRecord,
    Task,
    WorkerInfo,
)
from agentlease.errors import LeaseLost, UnknownTask

__all__ = ["AsyncBackend", "Backend"]


class Backend(Protocol):
    """The synchronous face of the seam."""

    url: str

    def now(self) -> float:
        """The store's clock, in seconds since the epoch."""
        ...

    def enqueue(self, tasks: Sequence[NewTask]) -> list[Enqueued]:
        """Insert tasks in one atomic step, all or nothing.

        A task whose id exists, or whose dedup key exists in its queue, is not inserted and is
        reported with ``created=False`` and the existing id. ``delay > 0`` makes it ``scheduled``.
        Each task's ``context_json`` is stored as given (see the module docstring).
        """
        ...

    def claim(self, queue: str, n: int, terms: LeaseTerms) -> tuple[list[Job], list[Reaped]]:
        """Lease up to ``n`` ready tasks in one atomic step.

        In that one step: promote due scheduled/failed tasks, reap expired leases of the queue
        (to the front if ``terms.reap_front``; dead-lettered past ``max_reclaims``), pick by
        priority (higher first) then sequence, mark leased with a fresh random token per task,
        ``attempt += 1``, expiry from the store's clock. Returns the jobs in pick order (each with
        its task's ``context_json`` and ``run_at``, the time it became due, for the queue
        latency) and the leases it reaped.
        """
        ...

    def extend(self, leases: Sequence[Lease], lease_for: float) -> list[Lease | None]:
        """Extend many leases in one atomic step; ``None`` for each lease no longer held.

        The new expiry is ``now + lease_for`` capped by the lease's total deadline and progress
        deadline.
        """
        ...

    def complete(self, lease: Lease, result_json: bytes | None) -> None:
        """Mark the task done with its result, fenced, in one atomic step."""
        ...

    def complete_many(
        self, items: Sequence[tuple[Lease, bytes | None]]
    ) -> list[LeaseLost | UnknownTask | None]:
        """Complete many leases in one round trip.

        Each item is fenced and applied as its own atomic step (the batch is not all or
        nothing). Returns, per item in order, ``None`` if it was accepted, else the refusal it
        would have raised.
        """
        ...

    def complete_and_claim(
        self, items: Sequence[tuple[Lease, bytes | None]], queue: str, n: int, terms: LeaseTerms
    ) -> tuple[list[LeaseLost | UnknownTask | None], list[Job], list[Reaped]]:
        """:meth:`complete_many` then :meth:`claim`, in as few round trips as the store allows
        (SQLite and PostgreSQL: one transaction). The completions are applied, each fenced on
        its own, before the claim; the returns are those of the two primitives.
        """
        ...

    def fail(self, lease: Lease, error_json: bytes, retry_in: float | None) -> Task:
        """Record a raised error, fenced: retry after ``retry_in`` seconds, or dead-letter."""
        ...

    def release(self, lease: Lease, front: bool) -> None:
        """Give the task back unrun (not a failure, not a reclaim), fenced."""
        ...

    def progress(
        self, lease: Lease, progress_json: bytes | None, checkpoint_json: bytes | None
    ) -> None:
        """Record progress (and a checkpoint if given) and reset the progress deadline, fenced."""
        ...

    def reap(self, queue: str, front: bool) -> list[Reaped]:
        """Requeue (or dead-letter) every expired lease of the queue, in one atomic step."""
        ...

    def get(self, task_id: str) -> Task:
        """Read one task; raises :class:`~agentlease.errors.UnknownTask`."""
        ...

    def stats(self, queue: str) -> QueueStats:
        """Counts by state and the oldest queued age; raises UnknownQueue."""
        ...

    def queues(self) -> list[str]:
        """Every queue that was ever enqueued to, sorted."""
        ...

    def inspect(self, queue: str, limit: int) -> list[LeaseInfo]:
        """Live leases of the queue, soonest expiry first, each with the holder its claim named;
        raises UnknownQueue."""
        ...

    def dead(self, queue: str, limit: int) -> list[Task]:
        """Dead-lettered tasks of the queue, most recent first; raises UnknownQueue."""
        ...

    def requeue_dead(self, queue: str, task_ids: Sequence[str] | None, front: bool) -> int:
        """Requeue dead tasks (all of the queue's if ``task_ids`` is None) with fresh budgets.

        Returns how many were requeued. The attempt counter is kept, so fencing stays monotonic.
        """
        ...

    def purge_tasks(self, queue: str, state: FinishedState, older_than: float, limit: int) -> int:
        """Delete up to ``limit`` tasks of ``queue`` in ``state`` (``done`` or ``dead``) that
        finished at least ``older_than`` seconds ago (store clock), oldest first, in one atomic
        step, through an index by finished time (never a scan of live tasks); returns how many.

        A purged task is gone with everything it held (payload, result, error, progress,
        checkpoint, context), and its id and its dedup key are free again. An unknown queue
        purges nothing. Callers bound ``limit`` (at most 10,000) and loop while a call purges a
        full batch.
        """
        ...

    def list_tasks(
        self, queue: str, state: ListedState, limit: int, after: Key | None
    ) -> tuple[list[Task], Key | None]:
        """Up to ``limit`` tasks of ``queue`` in ``state``, in the order of that state's index,
        starting after the position ``after`` (a key this method returned), read through the
        index (never a scan of the queue), in one read; and the key of the last task returned
        if more may follow (else ``None``).

        Orders: ``queued`` in claim order (the store's own), ``leased`` by lease expiry,
        ``done`` and ``dead`` most recently finished first; ties by task id. A key is the
        store's index values of the task then its id (see :mod:`agentlease._cursor`); one that
        does not fit raises InvalidInput. Pages are consistent per page, not across pages: a
        task that moves while a listing goes on may be missed or seen twice.
        """
        ...

    # -- live workers ----------------------------------------------------------------------------

    def register_worker(self, worker_id: str, info_json: bytes, ttl: float) -> float:
        """Write (or refresh) the worker's entry, live for ``ttl`` seconds on the store's clock,
        and delete lapsed entries of other workers (at most a bounded number), in one atomic
        step. Returns the entry's expiry."""
        ...

    def workers(self) -> list[WorkerInfo]:
        """The live worker entries (TTL not passed), sorted by id."""
        ...

    def unregister_worker(self, worker_id: str) -> bool:
        """Delete the worker's entry; whether it was there (live or not)."""
        ...

    # -- cancellation ------------------------------------------------------------------------------

    def cancel(self, task_id: str, reason: str, error_json: bytes) -> Cancellation:
        """Cancel a task in one atomic step (see the module docstring); ``error_json`` is the
        error the cancelled task keeps. A reason asked for earlier is kept. Raises
        :class:`~agentlease.errors.UnknownTask`."""
        ...

    def delete_queue(self, queue: str, limit: int, force: bool) -> tuple[int, bool]:
        """Delete up to ``limit`` tasks of ``queue`` (any state) in one atomic step and, when
        none is left, the queue itself (it leaves ``queues()``); returns how many tasks were
        deleted and whether the queue is gone. Unless ``force``, a step that finds a live lease
        in the queue raises :class:`~agentlease.errors.QueueInUse` and deletes nothing. A
        holder of a deleted task has its writes refused (the task is unknown)."""
        ...

    # -- idempotency keys ------------------------------------------------------------------------

    def reserve_key(
        self, key: str, fingerprint: str, holder: str, hold_for: float, window: float
    ) -> KeyHold | KeyRecord:
        """Reserve ``key`` for one attempt, or report why not, in one atomic step.

        Reserves (returns a :class:`KeyHold` with a fresh random token) when the key is absent
        or past its ``purge_at`` (fence 1, or the old fence + 1 if the row is still there), or
        when it is ``in_flight`` with ``expires_at <= now`` and either the same ``fingerprint``
        or no holder (released): a takeover, fence + 1, ``taken_over=True``. A reservation
        stores ``fingerprint`` and ``holder``, ``expires_at = now + hold_for`` and
        ``purge_at = expires_at + window``.

        Otherwise returns the key's :class:`KeyRecord` unchanged: ``done`` or ``failed`` (a
        replay), ``in_flight`` and live (a duplicate), or a different fingerprint (a conflict;
        an expired reservation is never taken over with other arguments).
        """
        ...

    def extend_key(self, hold: KeyHold, hold_for: float) -> KeyHold:
        """Extend an in-flight reservation to ``now + hold_for`` (and ``purge_at`` with it),
        fenced by its token; raises ReservationLost if it is not held.

        A holder whose in-flight lease ran out still holds the key until another attempt takes
        it over: the token, not the clock, decides.
        """
        ...

    def complete_key(self, hold: KeyHold, result_json: bytes | None, window: float) -> None:
        """Store the action's result: ``done``, ``finished_at = now``,
        ``purge_at = now + window``, no holder; fenced by the token (ReservationLost)."""
        ...

    def fail_key(self, hold: KeyHold, error_json: bytes, window: float) -> None:
        """Store the action's permanent failure: ``failed``, as :meth:`complete_key` otherwise."""
        ...

    def release_key(self, hold: KeyHold) -> None:
        """Give the reservation up (the action is known not to have applied): the key stays
        ``in_flight`` with no holder and ``expires_at = now``, so the next reserve takes it
        over at once with the next fence, whatever its arguments; fenced by the token."""
        ...

    def get_key(self, key: str) -> KeyRecord | None:
        """Read one key; ``None`` if it is absent or past its ``purge_at``."""
        ...

    def purge_keys(self, limit: int) -> int:
        """Delete up to ``limit`` keys whose ``purge_at`` has passed, oldest first, through an
        index on ``purge_at`` (never a scan of live keys); returns how many were deleted. A
        store that expires keys itself (Redis TTLs) returns 0."""
        ...

    # -- shared-state guards ---------------------------------------------------------------------

    def get_record(self, key: str) -> StateRecord | None:
        """Read a versioned record; ``None`` if it was never written."""
        ...

    def write_record(self, key: str, write: RecordWrite) -> StateRecord:
        """Apply one guarded write (see :class:`~agentlease._records.RecordWrite`) in one atomic
        step and return the record as written; raises FencedOff, ConflictError (with the
        current version and decoded value) or TransitionRefused (with the current and target
        states, decoded) and changes nothing."""
        ...

    def add_counter(self, name: str, delta: int, low: int | None, high: int | None) -> int:
        """Add ``delta`` to a counter (absent: 0) and return its new value, in one atomic step;
        raises LimitReached and changes nothing if the result would be below ``low`` or above
        ``high``."""
        ...

    def get_counter(self, name: str) -> int:
        """A counter's value (0 if it was never written)."""
        ...

    def hold_counter(self, name: str, token: str, units: int, high: int, ttl: float) -> int:
        """Hold ``units`` of a bounded counter for ``token`` until ``now + ttl``, in one atomic
        step; returns the counter's new value.

        A hold adds its units to the counter, as ``add_counter(name, units, None, high)``
        would, and keeps ``(token, units, expires_at)`` beside it; it raises LimitReached and
        changes nothing if the sum would pass ``high``. Every primitive that reads or changes a
        counter's value (``add_counter``, ``get_counter``, ``hold_counter``, ``release_hold``,
        ``commit_hold``) first gives back the units of that counter's holds whose
        ``expires_at`` has passed (store clock), in the same step (a read may instead leave
        them out of the value it returns), so a holder that dies gives its units back ``ttl``
        after its last renewal with no reaper running. ``token`` is fresh and random per hold;
        a hold whose token is already live (a resend) changes nothing and returns the value.
        """
        ...

    def get_counter_version(self, name: str) -> tuple[int, int]:
        """A counter's value and version, read in one step: ``(0, 0)`` if it was never
        written. A counter's version rises by one with every step that changes its stored value
        (``add_counter``, ``hold_counter``, ``release_hold``, ``commit_hold`` when it gives
        units back, and giving back the units of expired holds), so two reads at one version
        saw one value, whatever happened between them (no ABA)."""
        ...

    def extend_hold(self, name: str, token: str, ttl: float) -> bool:
        """Renew a live hold to ``now + ttl``, in one atomic step; ``False`` (and nothing
        changed) if ``token`` holds nothing of the counter: it ran out, or was released or
        committed."""
        ...

    def release_hold(self, name: str, token: str) -> bool:
        """End a live hold and give its units back to the counter, in one atomic step;
        ``False`` (and nothing changed) if ``token`` holds nothing of the counter."""
        ...

    def commit_hold(self, name: str, token: str, units: int | None = None) -> bool:
        """End a live hold and keep its units taken for good (as ``add_counter`` would have),
        in one atomic step; ``False`` (and nothing changed) if ``token`` holds nothing of the
        counter.

        With ``units`` (>= 0), settle instead: keep ``units`` taken rather than the units held,
        so the counter's value moves by ``units - held`` in the same step, with no bound
        checked (the hold reserved the room; the actual amount is what it is).

        Redis keeps a committed hold's token as a tombstone until the hold's expiry, so that a
        command resent after a lost reply recognises its own work: a second commit of the same
        token answers ``True`` there and changes nothing (the other stores answer ``False``).
        """
        ...

    def acquire_locks(self, names: Sequence[str], owner: str, ttl: float) -> list[int] | LockBusy:
        """Acquire every lock of ``names`` for ``owner``, or none, in one atomic step.

        A lock is free when nobody holds it or its lease (``expires_at``) has passed; a lock
        ``owner`` already holds counts as free (re-acquiring renews it and draws a new token).
        On success each lock gets ``expires_at = now + ttl`` and a fencing token one above its
        previous one (tokens of a name only ever increase, across releases and sweeps), and the
        tokens are returned in the order of ``names``. Otherwise the first busy lock is
        reported and nothing changes. ``names`` arrive sorted and without duplicates.
        """
        ...

    def extend_locks(self, names: Sequence[str], owner: str, ttl: float) -> list[str]:
        """Renew every lock of ``names`` that ``owner`` holds with a live lease to
        ``now + ttl``, in one atomic step; returns the names it does not hold (unchanged)."""
        ...

    def release_locks(self, names: Sequence[str], owner: str) -> list[str]:
        """Release every lock of ``names`` that ``owner`` holds with a live lease, in one atomic
        step; returns the names it does not hold, which are left unchanged (a release by a
        non-owner is refused, whoever holds the lock)."""
        ...

    def lock_holders(self, names: Sequence[str]) -> list[tuple[str, float] | None]:
        """For each name, its live holder and lease expiry (store clock), or ``None`` if free."""
        ...

    def sweep_locks(self, limit: int) -> int:
        """Free up to ``limit`` locks whose lease has passed, through an index on expiry;
        returns how many. (Acquisition treats them as free anyway; this keeps reads tidy.)"""
        ...

    def purge_state(self, limit: int) -> int:
        """Delete up to ``limit`` retry budgets and up to ``limit`` circuit breakers whose
        expiry has passed (each counts as absent already), in one atomic step; returns how many.
        A store that expires them itself (Redis TTLs) returns 0.

        What is not collected, on any store, and why: a versioned record, deleted or not, keeps
        its version (a deleted record is emptied and its version goes on rising, so that a
        stale compare-and-set can never succeed on a record created again); a lock keeps its
        fencing token, which must only rise, once its lease is freed (``sweep_locks``); a
        counter keeps its value, 0 included (it is the user's state). Each of those is one row
        or key per name, so they grow with the number of names an application uses, never with
        how often it uses them. A counter's holds are deleted by the steps on the counter once
        they run out; idempotency keys by ``purge_keys``.
        """
        ...

    # -- plans (approval gates) ------------------------------------------------------------------

    @property
    def plan_pins(self) -> bool:
        """Whether ``act_plan`` can check a ``pin`` (a row of the user's own table in the
        store's own database: SQLite and PostgreSQL); elsewhere a pin is refused above the
        seam."""
        ...

    def plan_secret(self) -> bytes:
        """The store's key for the MACs of plans: 32 random bytes, made by the first caller
        (first writer wins, in one atomic step) and the same for every client after it."""
        ...

    def act_plan(
        self,
        plan_id: str,
        reads: Sequence[PlanRead],
        writes: Sequence[PlanWrite],
        approved_by: str,
        keep_for: float,
        not_after: float | None,
    ) -> PlanReceipt | list[StaleRead]:
        """Act on a plan, all or nothing, in one atomic step, in this order:

        1. a plan already acted on (a receipt kept under ``plan_id``): return that receipt with
           ``first=False``; nothing else is checked or written (approving twice acts once);
        2. ``not_after`` (seconds since the epoch) at or before the store's clock: raise
           :class:`~agentlease.errors.PlanExpired`; nothing written;
        3. every read compared with its current version (a record's version, a counter's
           version as ``get_counter_version``, a pinned row's version column; absent: 0): if
           any differs, return every one that differs, in order, and write nothing;
        4. the writes, in order, each with its own guards (a record write as ``write_record``:
           fence, expected version, transition; a counter step as ``add_counter``: ``low`` and
           ``high``): the first refusal raises its error (FencedOff, ConflictError,
           TransitionRefused, LimitReached) and nothing of the plan is written;
        5. keep the receipt (``approved_by``, the store's time, each write's resulting version)
           under ``plan_id`` for ``keep_for`` seconds, and return it with ``first=True``.

        ``purge_state`` deletes receipts past ``keep_for`` (a store with TTLs lets them
        expire). A pin names a table, ``where`` columns and a version column, all checked
        identifiers; a store without pins (``plan_pins`` false) raises PlanRefused on one.
        """
        ...

    # -- retry budgets and circuit breakers ------------------------------------------------------

    def retry_budget(
        self, key: str, calls: int, retry: bool, ratio: float, minimum: int, ttl: float
    ) -> BudgetState:
        """Record calls, and ask for a retry, against the budget ``key``, in one atomic step.

        Adds ``calls`` (>= 0) to the budget's call count (an absent or expired budget: 0 calls,
        0 retries); then, if ``retry``, grants one retry iff ``retries < max(minimum, calls *
        ratio)`` (the calls counted after the addition), adding it to ``retries``. A step that
        changed a count sets the record's expiry to ``now + ttl`` (store clock); one that
        changed nothing writes nothing.
        """
        ...

    def breaker_admit(self, key: str, trial_for: float, ttl: float) -> BreakerState:
        """Whether a call to the dependency behind breaker ``key`` may go ahead, in one atomic
        step.

        Absent or expired: closed with no failures, and nothing is written. Closed: its state,
        nothing written (the healthy path is a read). Open with ``now < open_until``: open with
        ``retry_after``, nothing written. Open past ``open_until``, or half-open whose trial's
        turn ran out (``trial_until <= now``: the trial never reported): becomes half-open,
        ``fence + 1``, ``trial_until = now + trial_for``, expiry ``now + ttl``, and returns
        ``trial=True`` with the new fence. Half-open with a live trial: ``trial=False`` and
        ``retry_after = trial_until - now``. Exactly one caller, across every process, gets
        ``trial=True`` per half-open window.
        """
        ...

    def breaker_record(
        self, key: str, fence: int, ok: bool, threshold: int, cooldown: float, ttl: float
    ) -> BreakerState:
        """Report a call's outcome to breaker ``key``, in one atomic step; returns the state
        after it (``trial=False``).

        ``fence == 0`` (a call admitted while closed): while closed, a success resets the
        failures (written only if there were any), a failure adds one and, at ``threshold``,
        opens the breaker until ``now + cooldown``; while open or half-open it changes nothing
        (a slow call admitted before the circuit opened can neither close nor reopen it).
        ``fence > 0`` (a half-open trial): only the current trial of a half-open breaker counts:
        success closes it with no failures, failure reopens it until ``now + cooldown``; any
        other fence changes nothing. Every write sets the expiry to ``now + ttl``.
        """
        ...

    def close(self) -> None:
        """Release connections."""
        ...

    def open_async(self) -> AsyncBackend:
        """An asyncio backend on the same store (shared state or a connection of its own)."""
        ...


class AsyncBackend(Protocol):
    """The asyncio face of the seam: the same primitives, awaited."""

    url: str

    async def now(self) -> float: ...
    async def enqueue(self, tasks: Sequence[NewTask]) -> list[Enqueued]: ...
    async def claim(
        self, queue: str, n: int, terms: LeaseTerms
    ) -> tuple[list[Job], list[Reaped]]: ...
    async def extend(self, leases: Sequence[Lease], lease_for: float) -> list[Lease | None]: ...
    async def complete(self, lease: Lease, result_json: bytes | None) -> None: ...
    async def complete_many(
        self, items: Sequence[tuple[Lease, bytes | None]]
    ) -> list[LeaseLost | UnknownTask | None]: ...
    async def complete_and_claim(
        self, items: Sequence[tuple[Lease, bytes | None]], queue: str, n: int, terms: LeaseTerms
    ) -> tuple[list[LeaseLost | UnknownTask | None], list[Job], list[Reaped]]: ...
    async def fail(self, lease: Lease, error_json: bytes, retry_in: float | None) -> Task: ...
    async def release(self, lease: Lease, front: bool) -> None: ...
    async def progress(
        self, lease: Lease, progress_json: bytes | None, checkpoint_json: bytes | None
    ) -> None: ...
    async def reap(self, queue: str, front: bool) -> list[Reaped]: ...
    async def get(self, task_id: str) -> Task: ...
    async def stats(self, queue: str) -> QueueStats: ...
    async def queues(self) -> list[str]: ...
    async def inspect(self, queue: str, limit: int) -> list[LeaseInfo]: ...
    async def dead(self, queue: str, limit: int) -> list[Task]: ...
    async def requeue_dead(
        self, queue: str, task_ids: Sequence[str] | None, front: bool
    ) -> int: ...
    async def purge_tasks(
        self, queue: str, state: FinishedState, older_than: float, limit: int
    ) -> int: ...
    async def list_tasks(
        self, queue: str, state: ListedState, limit: int, after: Key | None
    ) -> tuple[list[Task], Key | None]: ...
    async def register_worker(self, worker_id: str, info_json: bytes, ttl: float) -> float: ...
    async def workers(self) -> list[WorkerInfo]: ...
    async def unregister_worker(self, worker_id: str) -> bool: ...
    async def cancel(self, task_id: str, reason: str, error_json: bytes) -> Cancellation: ...
    async def delete_queue(self, queue: str, limit: int, force: bool) -> tuple[int, bool]: ...
    async def reserve_key(
        self, key: str, fingerprint: str, holder: str, hold_for: float, window: float
    ) -> KeyHold | KeyRecord: ...
    async def extend_key(self, hold: KeyHold, hold_for: float) -> KeyHold: ...
    async def complete_key(
        self, hold: KeyHold, result_json: bytes | None, window: float
    ) -> None: ...
    async def fail_key(self, hold: KeyHold, error_json: bytes, window: float) -> None: ...
    async def release_key(self, hold: KeyHold) -> None: ...
    async def get_key(self, key: str) -> KeyRecord | None: ...
    async def purge_keys(self, limit: int) -> int: ...
    async def get_record(self, key: str) -> StateRecord | None: ...
    async def write_record(self, key: str, write: RecordWrite) -> StateRecord: ...
    async def add_counter(
        self, name: str, delta: int, low: int | None, high: int | None
    ) -> int: ...
    async def get_counter(self, name: str) -> int: ...
    async def get_counter_version(self, name: str) -> tuple[int, int]: ...
    async def hold_counter(
        self, name: str, token: str, units: int, high: int, ttl: float
    ) -> int: ...
    async def extend_hold(self, name: str, token: str, ttl: float) -> bool: ...
    async def release_hold(self, name: str, token: str) -> bool: ...
    async def commit_hold(self, name: str, token: str, units: int | None = None) -> bool: ...
    async def acquire_locks(
        self, names: Sequence[str], owner: str, ttl: float
    ) -> list[int] | LockBusy: ...
    async def extend_locks(self, names: Sequence[str], owner: str, ttl: float) -> list[str]: ...
    async def release_locks(self, names: Sequence[str], owner: str) -> list[str]: ...
    async def lock_holders(self, names: Sequence[str]) -> list[tuple[str, float] | None]: ...
    async def sweep_locks(self, limit: int) -> int: ...
    async def purge_state(self, limit: int) -> int: ...

    @property
    def plan_pins(self) -> bool: ...
    async def plan_secret(self) -> bytes: ...
    async def act_plan(
        self,
        plan_id: str,
        reads: Sequence[PlanRead],
        writes: Sequence[PlanWrite],
        approved_by: str,
        keep_for: float,
        not_after: float | None,
    ) -> PlanReceipt | list[StaleRead]: ...
    async def retry_budget(
        self, key: str, calls: int, retry: bool, ratio: float, minimum: int, ttl: float
    ) -> BudgetState: ...
    async def breaker_admit(self, key: str, trial_for: float, ttl: float) -> BreakerState: ...
    async def breaker_record(
        self, key: str, fence: int, ok: bool, threshold: int, cooldown: float, ttl: float
    ) -> BreakerState: ...
    async def close(self) -> None: ...

    async def wait_for_work(self, queue: str, timeout: float) -> None:
        """Return when work may have arrived in ``queue`` or after ``timeout`` seconds.

        A hint for idle workers, never a guarantee: a backend with notifications (PostgreSQL
        LISTEN/NOTIFY) returns early on one; others simply wait out the timeout.
        """
        ...

    def open_sync(self, *, call_timeout: float | None = None) -> Backend:
        """A synchronous backend on the same store, for a heartbeat thread that no event loop
        can starve. It may share state (memory) or hold its own connection (SQLite).

        Args:
            call_timeout: if given, the longest one call may take on the new backend's
                connections, where the store allows a bound (Redis: socket timeouts;
                PostgreSQL: ``statement_timeout`` and TCP keepalives; SQLite: the busy
                timeout), so that a hung call fails in time instead of outliving a lease.
        """
        ...
