# Generated from agentlease/_async/state.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""Shared-state guards: versioned records, field writes, transition guards, bounded counters and
lock sets, from the cheapest rung up.

Written once for asyncio; the synchronous face is generated from this file by scripts/unasync.py.

* **Versioned records** (optimistic concurrency): :meth:`SharedState.get` returns a value
  and its version; :meth:`~SharedState.compare_and_set` writes only over that version
  (else :class:`~agentlease.errors.ConflictError` with the current value);
  :meth:`~SharedState.update` re-reads and re-applies a pure function, with bounded
  full-jitter retries.
* **Field writes**: :meth:`~SharedState.set_field` changes one field in one atomic step, so
  two branches writing different fields both survive.
* **Transition guards**: a :class:`~agentlease.StateMachine` given with a write is checked in the
  store with the version; a backwards or sideways move raises
  :class:`~agentlease.errors.TransitionRefused`.
* **Bounded counters** (materialised constraints): :meth:`~SharedState.reserve` refuses
  past a maximum, :meth:`~SharedState.take` below a minimum, so write skew across a fan-out
  becomes a refusal on one contended row. Counters, their amounts and limits are integers
  within +-(2**53 - 1), which every store compares exactly; a step that would leave that range
  is refused with :class:`~agentlease.errors.LimitReached`, an amount or limit outside it with
  :class:`~agentlease.errors.InvalidInput`.
* **Counter holds**: :meth:`~SharedState.hold` takes units of the same bounded counter
  under a lease renewed while held, so a holder that dies gives them back (see
  :mod:`agentlease._sync.holds`).
* **Lock sets**: :meth:`~SharedState.locks` acquires several locks at once, in canonical
  order, all or nothing, within a mandatory timeout, with a TTL renewed while held and a fencing
  token per lock; a lost renewal is raised, not swallowed, and so is a TTL that ran out on the
  holder's own monotonic clock while renewals failed (a store outage): past that local deadline
  the holder has lost the locks, whatever the store says later.
* **State spaces**: ``SharedState(backend, space="billing")`` stores every record key and
  counter name of that state object as ``"billing|<name>"`` (``|`` is never allowed in a name,
  so a space's names never collide with plain ones, nor with another space's). Locks are not in
  spaces. On a Redis Cluster the records and counters of one space share a hash tag (one slot),
  which is what lets a plan touch several of them in one script.
* **Plans** (approval gates that refuse a stale plan): :meth:`SharedState.plan` records
  what a step read and declares what it will write; :meth:`SharedState.act` acts on the
  sealed plan only if nothing it read has moved (see :mod:`agentlease._sync.plans`).
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Callable, Iterable
from types import TracebackType

from agentlease import _clock, _deadline, _guards
from agentlease import _validate as check
from agentlease._codec import DEFAULT_MAX_BYTES, JSON, encode
from agentlease._policy.transitions import StateMachine
from agentlease._records import LockBusy, PlanReceipt, RecordWrite, StateRecord, Versioned
from agentlease._renewal import Renewals, Renewing, sync_sleep
from agentlease.backends import Backend, connect
from agentlease.errors import (
    BackendError,
    ConflictError,
    HoldLost,
    InvalidInput,
    LockLost,
    LockTimeout,
    NotLockOwner,
)

from .holds import CounterHold
from .plans import DEFAULT_KEEP_FOR, Plan, act_sealed, current_plan

__all__ = ["CounterHold", "LockSet", "Plan", "SharedState"]

_HOST = socket.gethostname()


class _Owners:
    """The owners of this process's lock sets: host, pid and 8 random hex digits drawn at start
    (so that a pid the system reuses later never names the same owner), then a number that no
    other lock set of the process takes (``itertools.count`` is atomic under the GIL). A forked
    child starts afresh."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._prefix = f"{_HOST}:{os.getpid()}:{os.urandom(4).hex()}"
        self._numbers = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}:{next(self._numbers)}"


_OWNERS = _Owners()
os.register_at_fork(after_in_child=_OWNERS.reset)


def _lapsed(held: LockSet | CounterHold) -> LockLost | HoldLost:
    if isinstance(held, CounterHold):
        return HoldLost(held.name, held.units, "its TTL passed here without a renewal")
    return LockLost(
        held.names, f"no renewal was confirmed within their TTL ({held._ttl} s): store unreachable?"
    )


# Every counter stays within +-EXACT_INT, and so do amounts and limits: a step that would leave
# the range is refused by the store like one that passes a limit. Within it, every store (Redis's
# Lua, with doubles, too) compares exactly.
_FLOOR, _CEILING = -check.EXACT_INT, check.EXACT_INT


def _amount(value: object, what: str, *, low: int = _FLOOR) -> int:
    return check.integer(value, what, low=low, high=_CEILING)


def _lock_names(names: object) -> list[str]:
    """The lock names of ``names``, an iterable of names (a lone str would be its letters)."""
    if isinstance(names, str | bytes) or not isinstance(names, Iterable):
        raise InvalidInput(
            f"lock names must be an iterable of names (a list), not {type(names).__name__}"
        )
    return [_guards.lock_name(n) for n in names]


def _versioned(record: StateRecord | None) -> Versioned:
    return Versioned({}, 0) if record is None else Versioned(record.value, record.version)


class LockSet:
    """Locks held together; use as ``with state.locks([...], timeout=...) as held``.

    Attributes:
        names: the locks, in canonical (sorted) order.
        tokens: each lock's fencing token: pass it with every write to a fenced resource, which
            refuses a token lower than one it has seen.
    """

    def __init__(
        self, state: SharedState, names: tuple[str, ...], timeout: float, ttl: float
    ) -> None:
        self.names = names
        self._timeout = timeout
        self.tokens: dict[str, int] = {}
        self._state = state
        self._ttl = ttl
        self._owner = _OWNERS.next()
        self._renewal: Renewing | None = None
        self._scope_token: object = None

    @property
    def owner(self) -> str:
        """Who holds the locks, as the store records it."""
        return self._owner

    def _acquire(self) -> float:
        """Acquire the set; the ``time.monotonic`` at which the successful request was sent."""
        backend, timeout = self._state.backend, self._timeout
        give_up = _deadline.cap(_clock.monotonic() + timeout)
        pause = 0.01
        while True:
            _deadline.check_deadline(f"the lock set {list(self.names)!r}")
            sent = _clock.monotonic()
            got = backend.acquire_locks(self.names, self._owner, self._ttl)
            if not isinstance(got, LockBusy):
                self.tokens = dict(zip(self.names, got, strict=True))
                return sent
            left = give_up - _clock.monotonic()
            if left <= 0:
                _deadline.check_deadline(f"the lock set {list(self.names)!r}")
                raise LockTimeout(self.names, timeout, got.name, got.holder)
            sync_sleep(min(left, got.retry_after, self._state._rand.uniform(0, pause)))
            pause = min(pause * 2, 1.0)

    def check(self) -> None:
        """Raise :class:`~agentlease.errors.LockLost` if a renewal found a lock gone, or if no
        renewal was confirmed within the TTL (the store was unreachable): stop writing to what
        the locks protected. Once raised, it is raised for good."""
        if self._renewal is not None:
            self._state._renewals.check(self._renewal)

    def __enter__(self) -> LockSet:
        sent = self._acquire()
        self._renewal = self._state._renewals.open(self, self._ttl, sent=sent)
        self._scope_token = _guards.hold_locks(self.names)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _guards.drop_locks(self._scope_token)
        renewal, self._renewal = self._renewal, None
        assert renewal is not None
        lost: Exception | None = None
        try:
            self._state._renewals.close(renewal)
        except LockLost as error:
            lost = error
        try:
            missing = self._state.backend.release_locks(self.names, self._owner)
        except BackendError:
            if lost is None:
                raise
            missing = []  # lost already: their TTL frees them; the loss says more
        if exc is not None:
            return  # the body's own error says more than a lost lock would
        if lost is not None:
            raise lost
        if missing:
            raise LockLost(tuple(missing), "they ran out before release (renewals failed?)")


class SharedState:
    """Guarded shared state on one store: records, counters and locks.

    Args:
        backend: the store (see :func:`agentlease.connect`).
        space: a named state space (the rules of a name): every record key and counter name of
            this object is stored as ``"<space>|<name>"``. ``None``: names as given.
        max_value_bytes: the largest encoded field value.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        space: str | None = None,
        max_value_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.backend = backend
        self.space = None if space is None else _guards.record_key(space)
        self._limit = check.integer(max_value_bytes, "max_value_bytes", low=16, high=2**29)
        self._rand = random.Random()
        self._plan_secret: bytes | None = None  # read on first use (see _sync/plans.py)
        self._renewals = Renewals(self._renew, _lapsed)

    def _renew(self, entry: Renewing) -> None:
        if isinstance(entry.lease, CounterHold):
            return entry.lease._renew()
        held: LockSet = entry.lease
        missing = self.backend.extend_locks(held.names, held.owner, held._ttl)
        if missing:
            raise LockLost(tuple(missing), "a renewal found them taken or expired")

    @classmethod
    def connect(
        cls, url: str, *, space: str | None = None, max_value_bytes: int = DEFAULT_MAX_BYTES
    ) -> SharedState:
        """Shared state on the store at ``url`` (in ``space``, if given)."""
        return cls(connect(url), space=space, max_value_bytes=max_value_bytes)

    def _key(self, name: object) -> str:
        """A record key or counter name as the store keeps it (qualified by the space)."""
        name = _guards.record_key(name)
        return name if self.space is None else f"{self.space}|{name}"

    def close(self) -> None:
        """Stop renewing and release the store's connections."""
        self._renewals.stop()
        self.backend.close()

    def __enter__(self) -> SharedState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- versioned records ----------------------------------------------------------------------

    def _fields(self, key: str, value: object) -> dict[str, bytes]:
        if not isinstance(value, dict):
            raise InvalidInput(
                f"record {key!r} must be a JSON object (a dict of fields), not"
                f" {type(value).__name__}"
            )
        return {
            _guards.field_name(name): encode(
                v, what=f"field {name!r} of {key!r}", limit=self._limit
            )
            for name, v in value.items()
        }

    def _write(
        self,
        key: str,
        fields: dict[str, bytes],
        *,
        replace: bool,
        expected_version: int | None,
        machine: StateMachine | None,
        fence: int | None,
    ) -> RecordWrite:
        guard_field: str | None = None
        allowed: tuple[bytes | None, ...] = ()
        if machine is not None:
            if machine.field in fields:
                guard_field = machine.field
                allowed = machine.sources(_guards.decoded(fields[machine.field]))
            elif replace:
                raise InvalidInput(
                    f"record {key!r}: a whole-record write under a state machine must set"
                    f" {machine.field!r}"
                )
        if expected_version is not None:
            check.integer(expected_version, "expected_version", low=0, high=check.EXACT_INT)
        if fence is not None:
            check.integer(fence, "fence", low=0, high=check.EXACT_INT)
        return RecordWrite(fields, replace, expected_version, guard_field, allowed, fence)

    def get(self, key: str) -> Versioned:
        """A record's value and version (``Versioned({}, 0)`` if it does not exist); inside a
        :meth:`plan` block, the plan records the version read."""
        got = _versioned(self.backend.get_record(self._key(key)))
        plan = current_plan(self)
        if plan is not None:
            plan._saw("record", _guards.record_key(key), got.version)
        return got

    def compare_and_set(
        self,
        key: str,
        expected_version: int,
        value: dict[str, JSON],
        *,
        machine: StateMachine | None = None,
        fence: int | None = None,
    ) -> int:
        """Replace the whole record if it is still at ``expected_version`` (0: create it), in
        one atomic step; returns the new version.

        Raises:
            ConflictError: the version moved; carries the current value and version.
            TransitionRefused: ``machine`` forbids the move of its state field.
            FencedOff: ``fence`` is older than one the record has seen.
        """
        key = self._key(key)
        write = self._write(
            key,
            self._fields(key, value),
            replace=True,
            expected_version=expected_version,
            machine=machine,
            fence=fence,
        )
        return (self.backend.write_record(key, write)).version

    def set_field(
        self,
        key: str,
        field: str,
        value: JSON,
        *,
        expected_version: int | None = None,
        machine: StateMachine | None = None,
        fence: int | None = None,
    ) -> int:
        """Set one field, leaving the others as they are (creating the record if needed), in
        one atomic step; returns the new version. Raises as :meth:`compare_and_set`."""
        key = self._key(key)
        write = self._write(
            key,
            self._fields(key, {_guards.field_name(field): value}),
            replace=False,
            expected_version=expected_version,
            machine=machine,
            fence=fence,
        )
        return (self.backend.write_record(key, write)).version

    def update(
        self,
        key: str,
        mutate: Callable[[dict[str, JSON]], dict[str, JSON]],
        *,
        attempts: int = 10,
        machine: StateMachine | None = None,
        fence: int | None = None,
    ) -> Versioned:
        """Read, apply ``mutate`` (a pure function of the value), and compare-and-set; on a
        conflict, re-read and re-apply, with full-jitter backoff, at most ``attempts`` times.

        Returns the value written and its version.

        Raises:
            ConflictError: contention outlasted ``attempts`` (the last conflict).
            TransitionRefused, FencedOff: as :meth:`compare_and_set` (never retried).
        """
        check.integer(attempts, "attempts", low=1, high=1000)
        last: ConflictError | None = None
        for attempt in range(attempts):
            current = self.get(key)
            value = mutate(dict(current.value))
            try:
                version = self.compare_and_set(
                    key, current.version, value, machine=machine, fence=fence
                )
            except ConflictError as exc:
                last = exc
                sync_sleep(self._rand.uniform(0, min(1.0, 0.005 * 2**attempt)))
                continue
            return Versioned(value, version)
        assert last is not None
        raise last

    def delete(self, key: str, expected_version: int, *, fence: int | None = None) -> int:
        """Empty a record at ``expected_version``; its version keeps rising (so a stale
        compare-and-set can never succeed on a re-created record). Returns the new version."""
        key = self._key(key)
        write = self._write(
            key, {}, replace=True, expected_version=expected_version, machine=None, fence=fence
        )
        return (self.backend.write_record(key, write)).version

    # -- bounded counters -----------------------------------------------------------------------

    def counter(self, name: str) -> int:
        """A counter's value (0 if never used); inside a :meth:`plan` block, the plan records
        the counter's version."""
        if current_plan(self) is None:
            return self.backend.get_counter(self._key(name))
        return (self.counter_version(name))[0]

    def counter_version(self, name: str) -> tuple[int, int]:
        """A counter's value and version, read together (``(0, 0)`` if never used). The
        version rises with every change of the value, so an equal version means no change in
        between, even if the value went away and came back; inside a :meth:`plan` block, the
        plan records it."""
        value, version = self.backend.get_counter_version(self._key(name))
        plan = current_plan(self)
        if plan is not None:
            plan._saw("counter", _guards.record_key(name), version)
        return value, version

    def reserve(self, name: str, n: int = 1, *, limit: int) -> int:
        """Take ``n`` units of a capacity that may not pass ``limit``; returns the new count.

        ``n`` and ``limit`` are ints within +-(2**53 - 1), and so is every counter's value.

        Raises:
            LimitReached: fewer than ``n`` units are left; nothing was taken.
            InvalidInput: ``n`` or ``limit`` is not an int in that range.
        """
        n = _amount(n, "n", low=1)
        high = _amount(limit, "limit")
        return self.backend.add_counter(self._key(name), n, _FLOOR, high)

    def release(self, name: str, n: int = 1) -> int:
        """Give back ``n`` units taken with :meth:`reserve` (never below 0)."""
        n = _amount(n, "n", low=1)
        return self.backend.add_counter(self._key(name), -n, 0, _CEILING)

    def take(self, name: str, n: int = 1, *, minimum: int) -> int:
        """Remove ``n`` from a count that must stay at least ``minimum`` ("at least one
        engineer stays on call"); returns the new count.

        Raises:
            LimitReached: the count would drop below ``minimum``; nothing changed.
        """
        n = _amount(n, "n", low=1)
        low = _amount(minimum, "minimum")
        return self.backend.add_counter(self._key(name), -n, low, _CEILING)

    def add(self, name: str, n: int = 1) -> int:
        """Add ``n`` (may be negative) with no bound but the counters' range; returns the new
        count.

        Raises:
            LimitReached: the count would leave the range every counter keeps to (see
                :meth:`reserve`); nothing changed.
        """
        n = _amount(n, "n")
        return self.backend.add_counter(self._key(name), n, _FLOOR, _CEILING)

    def hold(self, name: str, n: int = 1, *, limit: int, ttl: float = 30.0) -> CounterHold:
        """Hold ``n`` units of a capacity that may not pass ``limit`` (the same counter and
        limit as :meth:`reserve`), under a lease; use as a context manager::

            with state.hold("seats", 2, limit=10, ttl=30) as held:
                book(seats=2)
                held.commit()  # the seats stay taken; without this they go back

        The held units count in the counter's value at once. The hold's TTL (on the store's
        clock) is renewed every third of ``ttl`` while held; a holder that dies or freezes gives
        the units back ``ttl`` after its last renewal, at the next step that touches the
        counter, with no reaper running. Leaving the block without
        :meth:`~CounterHold.commit` releases them; :meth:`CounterHold.check` raises
        if the hold was lost.

        Raises:
            LimitReached: (on entering) fewer than ``n`` units are left; nothing was taken.
            HoldLost: (on exit) the hold ran out before it was released (renewals failed?).
        """
        n = _amount(n, "n", low=1)
        limit = _amount(limit, "limit")
        return CounterHold(self, self._key(name), n, limit, check.duration(ttl, "ttl"))

    # -- plans (approval gates) -----------------------------------------------------------------

    def plan(
        self, step: str, *, expires_in: float | None = None, keep_for: float = DEFAULT_KEEP_FOR
    ) -> Plan:
        """A plan for ``step``: use as ``with state.plan(step="refund-42") as plan:``.

        Inside the block, every read through this object (in this task) is recorded, and the
        writes declared on ``plan`` are kept for the approval; :meth:`Plan.seal` gives
        the plan as JSON, :meth:`Plan.act` or :meth:`act` (anywhere, later) acts on it.

        Args:
            step: what the plan is for (1 to 200 characters), kept in the plan.
            expires_in: seconds after which it can no longer be approved (on the store's
                clock); ``None``: never.
            keep_for: how long the store keeps its receipt (approving twice acts once within
                it); 30 days by default.
        """
        if not isinstance(step, str) or not 0 < len(step) <= 200:
            raise InvalidInput("step must be a str of 1 to 200 characters")
        if expires_in is not None:
            expires_in = check.duration(expires_in, "expires_in")
        return Plan(self, step, expires_in, check.duration(keep_for, "keep_for"))

    def act(self, plan_json: str, *, approved_by: str) -> PlanReceipt:
        """Approve a sealed plan (:meth:`Plan.seal`, maybe from another process, hours
        ago): in one atomic step on the store, compare every version it read with the current
        one and, if none moved, apply every write it declared. Approving twice acts once.

        Returns:
            The receipt: who approved and when (the store's clock), each write's version;
            ``first`` is false when the plan had been acted on already (the kept receipt).

        Raises:
            StalePlan: something it read has moved; nothing was written. ``stale`` names each
                key with the version read and the version now.
            PlanExpired: past its ``expires_in``; nothing was written.
            PlanRefused: not a plan sealed by this store (edited, truncated, or another
                store's), or ``approved_by`` is empty; nothing was read or written.
            ConflictError, TransitionRefused, FencedOff, LimitReached: a declared write's own
                guard refused it; nothing of the plan was written.
        """
        return act_sealed(self, plan_json, approved_by)

    # -- lock sets ------------------------------------------------------------------------------

    def locks(self, names: Iterable[str], *, timeout: float, ttl: float = 30.0) -> LockSet:
        """Acquire every lock of ``names`` or none, sorted canonically whatever order they are
        given in, waiting at most ``timeout`` seconds; hold them as a context manager::

            with state.locks(["invoice:7", "account:3"], timeout=5) as held:
                state.set_field("account:3", "balance", 90, fence=held.tokens["account:3"])

        The locks' TTL is renewed every third of ``ttl`` while held; a failed renewal is raised
        by :meth:`LockSet.check` and on exit, and so is a ``ttl`` that passed on the
        holder's monotonic clock (from the sending of the last confirmed acquisition or
        renewal, less a 2 % margin) while the store did not answer. A holder that dies loses
        them ``ttl`` after its last renewal. Fencing tokens count per lock, and a record keeps
        the highest token it has seen: fence each record with the token of one lock.

        Raises:
            LockTimeout: (on entering) not acquired within ``timeout``; none is held.
        """
        wanted = tuple(sorted(set(_lock_names(names))))
        if not wanted:
            raise InvalidInput("a lock set needs at least one lock name")
        timeout = check.duration(timeout, "timeout")
        return LockSet(self, wanted, timeout, check.duration(ttl, "ttl"))

    def lock_holders(self, names: Iterable[str]) -> dict[str, str | None]:
        """Each lock's current holder (``None`` if free)."""
        wanted = _lock_names(names)
        holders = self.backend.lock_holders(wanted)
        return {n: None if h is None else h[0] for n, h in zip(wanted, holders, strict=True)}

    def release_locks(self, names: Iterable[str], owner: str) -> None:
        """Release locks held by ``owner`` (a lock set releases its own on exit).

        Raises:
            NotLockOwner: a lock is not held by ``owner``; it was left as it was.
        """
        wanted = sorted(set(_lock_names(names)))
        missing = self.backend.release_locks(wanted, owner)
        if missing:
            holders = self.backend.lock_holders(missing[:1])
            raise NotLockOwner(missing[0], None if holders[0] is None else holders[0][0])

    def sweep_locks(self, limit: int = 1000) -> int:
        """Free locks whose TTL has passed (at most ``limit``, 1 to 1,000,000); how many."""
        return self.backend.sweep_locks(check.integer(limit, "limit", low=1, high=1_000_000))
