"""The SQLite backend's shared-state guards: versioned records, bounded counters and their
holds, lock sets; retry budgets and circuit breakers.

Tables (schema version 3, ``sql/sqlite.sql``): ``agentlease_records`` (version, fence,
updated_at per key) with ``agentlease_record_fields`` (one JSON value per field),
``agentlease_counters``, and ``agentlease_locks`` (owner, expiry, fence; rows are never deleted,
so a lock's fence only rises) with a partial index on ``expires_at`` for the sweep. Schema
version 5 adds ``agentlease_counter_holds`` (counter, token, units, expiry), indexed by counter
then expiry: every write of a counter first deletes its expired holds and takes their units out.
Schema version 6 adds ``agentlease_budgets`` and ``agentlease_breakers``, one row per key with an
``expires_at``; an expired row counts as absent and is overwritten at the key's next write.
Schema version 9 indexes both by ``expires_at``: ``purge_state`` deletes the expired rows of
both, oldest first, in one ``BEGIN IMMEDIATE`` transaction. Records, counters and lock rows are
never deleted (see ``Backend.purge_state``); expired counter holds are deleted by every step on
their counter, and ``sweep_locks`` frees expired leases, so neither accumulates.

Plans (schema version 11): every counter has a ``version`` that ``counter_set`` (the one
statement that changes a value) raises. ``act_plan`` is one ``BEGIN IMMEDIATE`` transaction: the
receipt, the deadline, every read (a pin is a ``SELECT`` of the version column of the user's own
table in this file, its identifiers checked by :mod:`agentlease._pins`), then every write as its
own step would make it; a refusal rolls the whole transaction back. Receipts
(``agentlease_plan_receipts``) are deleted past ``purge_at`` by ``purge_state``, in its batch;
the plan secret is one row of ``agentlease_plan_secret``, ``INSERT OR IGNORE`` then ``SELECT`` in
one transaction, so racing first callers agree.

Atomicity: ``write_record``, ``add_counter``, ``hold_counter``, ``release_hold``,
``commit_hold`` and ``acquire_locks`` are one ``BEGIN IMMEDIATE`` transaction each, which holds
the write lock from the read that decides to the write, so they decide in Python between the two
(``write_record`` with :func:`~agentlease._policy.writes.check_write`, then plain statements for
what that read found: no upsert where the row is there, no delete of fields the record does not
have); a set of one lock is taken by one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` free
(its holder is read after it only when it was not). ``extend_hold``, ``extend_locks``,
``release_locks`` (one statement by name for a set of one) and ``sweep_locks`` are one statement
each; the reads are one statement each (one snapshot; ``get_counter`` leaves out the units of
expired holds).

``retry_budget``, ``breaker_admit`` and ``breaker_record`` decide with the steps of
``_budgets.py``: a step that may write reads and writes in one ``BEGIN IMMEDIATE`` transaction;
the healthy paths (admitting to a closed breaker, a success with no failures to reset) and a
budget step that records nothing are one read and write nothing. An admit or a record first reads
outside any transaction, and only when that read says a write is due takes the write lock, reads
again and decides on what it holds (so of many admits that find a cool-down over, one takes the
trial and the others find it taken).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import orjson

from agentlease._policy.writes import applied, check_write
from agentlease._records import (
    BreakerState,
    BudgetState,
    LockBusy,
    PlanRead,
    PlanReceipt,
    PlanWrite,
    RecordWrite,
    StaleRead,
    StateRecord,
)
from agentlease.backends._budgets import (
    BreakerRow,
    BudgetRow,
    admit_step,
    budget_step,
    live,
    record_step,
)
from agentlease.backends._sqlfile import queries
from agentlease.errors import LimitReached, PlanExpired, PlanRefused

__all__ = ["SQLiteState"]

Q = queries("agentlease.backends.sql", "sqlite.sql")


def _record(key: str, rows: list[Any]) -> StateRecord | None:
    """A record from the rows of ``record_get``; ``None`` if it was never written."""
    if not rows:
        return None
    version, fence, updated_at = rows[0][:3]
    fields = {field: bytes(value) for *_, field, value in rows if field is not None}
    return StateRecord(key, version, fields, fence, updated_at)


def _swept(db: sqlite3.Connection, name: str, now: float) -> int:
    """The counter's value after deleting its expired holds and taking their units out (inside
    the caller's ``BEGIN IMMEDIATE`` transaction)."""
    row = db.execute(Q["counter_read"], {"name": name}).fetchone()
    value: int = 0 if row is None else row[0]
    expired = sum(units for (units,) in db.execute(Q["counter_sweep"], {"name": name, "now": now}))
    if expired:
        value -= expired
        db.execute(Q["counter_set"], {"name": name, "value": value})
    return value


def _write_record(db: sqlite3.Connection, key: str, write: RecordWrite, now: float) -> StateRecord:
    """Write a record inside the caller's ``BEGIN IMMEDIATE`` transaction: read, check, write."""
    current = _record(key, db.execute(Q["record_get"], {"key": key}).fetchall())
    check_write(key, current, write)  # a refusal rolls back, and nothing was written
    record = applied(key, current, write, now)
    params = {"key": key, "version": record.version, "fence": record.fence, "now": now}
    # The record was read under the write lock: what exists, and which fields, is known,
    # so each statement is the plain one (an UPDATE where the row is there).
    db.execute(Q["record_put" if current is None else "record_bump"], params)
    had = {} if current is None else current.fields
    if write.replace and had:
        dropped = [f for f in had if f not in write.fields]
        if dropped:
            db.execute(Q["record_drop_fields"], {"key": key, "fields": _names(dropped)})
    for f, v in write.fields.items():
        name = "record_update_field" if f in had else "record_set_field"
        db.execute(Q[name], {"key": key, "field": f, "value": v})
    return record


def _counter_version(db: sqlite3.Connection, name: str) -> int:
    row = db.execute(Q["counter_version"], {"name": name}).fetchone()
    return 0 if row is None else int(row[0])


def _pinned(db: sqlite3.Connection, key: str, plan_id: str) -> int:
    """The version column of a pinned row of the user's table (0: no such row)."""
    from agentlease._pins import parse_pin  # plans only: a worker never loads it

    names, where, column = parse_pin(key)
    table = ".".join(f'"{n}"' for n in names)
    match = " AND ".join(f'"{c}" = ?' for c, _ in where)
    sql = f'SELECT "{column}" FROM {table} WHERE {match}'  # identifiers checked by parse_pin
    try:
        rows = db.execute(sql, [v for _, v in where]).fetchmany(2)
    except sqlite3.OperationalError as exc:
        raise PlanRefused(f"pin {key}: {exc}", plan_id=plan_id) from None
    if not rows:
        return 0
    if len(rows) > 1:
        raise PlanRefused(f"pin {key}: its where matches more than one row", plan_id=plan_id)
    value = rows[0][0]
    if type(value) is not int:
        raise PlanRefused(f"pin {key}: its version column is not an integer", plan_id=plan_id)
    return value


def _budget(db: sqlite3.Connection, key: str, now: float) -> BudgetRow | None:
    row = db.execute(Q["budget_get"], {"key": key}).fetchone()
    return None if row is None else live(BudgetRow(*row), now)


def _breaker(db: sqlite3.Connection, key: str, now: float) -> BreakerRow | None:
    row = db.execute(Q["breaker_get"], {"key": key}).fetchone()
    return None if row is None else live(BreakerRow(*row), now)


def _put_breaker(db: sqlite3.Connection, key: str, row: BreakerRow) -> None:
    params = {
        "key": key,
        "state": row.state,
        "failures": row.failures,
        "fence": row.fence,
        "until": row.until,
        "expires_at": row.expires_at,
    }
    db.execute(Q["breaker_put"], params)


def _names(names: Sequence[str]) -> bytes:
    return orjson.dumps(list(names))


def _missing(names: Sequence[str], rows: list[Any]) -> list[str]:
    """The names of the set that the statement did not touch (it returned the others)."""
    touched = {name for (name,) in rows}
    return [name for name in names if name not in touched]


class SQLiteState:
    """The ``*_record``, ``*_counter``, ``*_hold``, ``*_locks``, ``retry_budget`` and
    ``breaker_*`` primitives of the SQLite backend (a base of the backend class)."""

    if TYPE_CHECKING:

        def _step(self, *, write: bool) -> AbstractContextManager[sqlite3.Connection]: ...

    # -- versioned records ----------------------------------------------------------------------

    def get_record(self, key: str) -> StateRecord | None:
        with self._step(write=False) as db:
            rows = db.execute(Q["record_get"], {"key": key}).fetchall()
        return _record(key, rows)

    def write_record(self, key: str, write: RecordWrite) -> StateRecord:
        with self._step(write=True) as db:  # the write lock is held from the read to the write
            return _write_record(db, key, write, time.time())

    # -- bounded counters -----------------------------------------------------------------------

    def add_counter(self, name: str, delta: int, low: int | None, high: int | None) -> int:
        with self._step(write=True) as db:  # the write lock is held from the read to the write
            value = _swept(db, name, time.time())
            new = value + delta
            if (low is not None and new < low) or (high is not None and new > high):
                raise LimitReached(name, value, delta, low, high)
            db.execute(Q["counter_set"], {"name": name, "value": new})
        return new

    def get_counter(self, name: str) -> int:
        with self._step(write=False) as db:  # one statement: counts only live holds
            row = db.execute(Q["counter_get"], {"name": name, "now": time.time()}).fetchone()
        return 0 if row is None else int(row[0])

    # -- counter holds --------------------------------------------------------------------------

    def hold_counter(self, name: str, token: str, units: int, high: int, ttl: float) -> int:
        with self._step(write=True) as db:
            now = time.time()
            value = _swept(db, name, now)
            params: dict[str, Any] = {"name": name, "token": token}
            if db.execute(Q["hold_units"], params).fetchone() is not None:
                return value  # a resend of a hold that was made
            new = value + units
            if new > high:
                raise LimitReached(name, value, units, None, high)
            db.execute(Q["counter_set"], {"name": name, "value": new})
            db.execute(Q["hold_insert"], {**params, "units": units, "expires_at": now + ttl})
        return new

    def extend_hold(self, name: str, token: str, ttl: float) -> bool:
        with self._step(write=False) as db:  # one statement
            now = time.time()
            params = {"name": name, "token": token, "now": now, "expires_at": now + ttl}
            return db.execute(Q["hold_extend"], params).rowcount == 1

    def release_hold(self, name: str, token: str) -> bool:
        return self._end_hold(name, token, 0)

    def commit_hold(self, name: str, token: str, units: int | None = None) -> bool:
        return self._end_hold(name, token, units)

    def _end_hold(self, name: str, token: str, kept: int | None) -> bool:
        """End the hold, keeping ``kept`` units taken for good (``None``: those it held; a
        release keeps 0)."""
        with self._step(write=True) as db:
            value = _swept(db, name, time.time())  # an expired hold is gone after this
            row = db.execute(Q["hold_end"], {"name": name, "token": token}).fetchone()
            if row is None:
                return False
            held = int(row[0])
            if kept is not None and kept != held:
                db.execute(Q["counter_set"], {"name": name, "value": value - held + kept})
        return True

    # -- lock sets ------------------------------------------------------------------------------

    def acquire_locks(self, names: Sequence[str], owner: str, ttl: float) -> list[int] | LockBusy:
        if not names:
            return []
        if len(names) == 1:
            return self._acquire_one(names[0], owner, ttl)
        params: dict[str, Any] = {"names": _names(names), "owner": owner}
        with self._step(write=True) as db:  # all or nothing: decide and take under one lock
            now = time.time()
            params.update(now=now, expires_at=now + ttl)
            busy = db.execute(Q["locks_busy"], params).fetchall()
            if busy:
                order = {name: i for i, name in enumerate(names)}
                name, holder, expires_at = min(busy, key=lambda row: order[row[0]])
                return LockBusy(name, holder, expires_at - now)
            fences = dict(db.execute(Q["locks_take"], params).fetchall())
        return [int(fences[name]) for name in names]

    def _acquire_one(self, name: str, owner: str, ttl: float) -> list[int] | LockBusy:
        """A set of one lock: one statement decides and takes it (no set to check first)."""
        with self._step(write=True) as db:  # the holder is read under the same lock
            now = time.time()
            params = {"name": name, "owner": owner, "now": now, "expires_at": now + ttl}
            taken = db.execute(Q["lock_take"], params).fetchall()  # all: it must finish
            if taken:
                return [int(taken[0][0])]
            holder, expires_at = db.execute(Q["lock_holder"], {"name": name}).fetchone()
        return LockBusy(name, holder, expires_at - now)

    def extend_locks(self, names: Sequence[str], owner: str, ttl: float) -> list[str]:
        with self._step(write=False) as db:  # one statement
            now = time.time()
            params = {"names": _names(names), "owner": owner, "now": now, "expires_at": now + ttl}
            rows = db.execute(Q["locks_extend"], params).fetchall()  # all: it must finish
        return _missing(names, rows)

    def release_locks(self, names: Sequence[str], owner: str) -> list[str]:
        if len(names) == 1:
            with self._step(write=False) as db:  # one statement
                params = {"name": names[0], "owner": owner, "now": time.time()}
                rows = db.execute(Q["lock_release"], params).fetchall()  # all: it must finish
            return [] if rows else list(names)
        with self._step(write=False) as db:  # one statement
            params = {"names": _names(names), "owner": owner, "now": time.time()}
            rows = db.execute(Q["locks_release"], params).fetchall()  # all: it must finish
        return _missing(names, rows)

    def lock_holders(self, names: Sequence[str]) -> list[tuple[str, float] | None]:
        with self._step(write=False) as db:
            params = {"names": _names(names), "now": time.time()}
            rows = db.execute(Q["locks_holders"], params).fetchall()
        held = {name: (owner, expires_at) for name, owner, expires_at in rows}
        return [held.get(name) for name in names]

    def sweep_locks(self, limit: int) -> int:
        with self._step(write=False) as db:  # one statement
            return db.execute(Q["locks_sweep"], {"now": time.time(), "limit": limit}).rowcount

    # -- retry budgets and circuit breakers -----------------------------------------------------

    def purge_state(self, limit: int) -> int:
        with self._step(write=True) as db:
            params = {"now": time.time(), "limit": limit}
            return int(
                db.execute(Q["budget_purge"], params).rowcount
                + db.execute(Q["breaker_purge"], params).rowcount
                + db.execute(Q["plan_receipt_purge"], params).rowcount
            )

    def retry_budget(
        self, key: str, calls: int, retry: bool, ratio: float, minimum: int, ttl: float
    ) -> BudgetState:
        with self._step(write=calls > 0 or retry) as db:  # a step that may write: one lock
            now = time.time()
            row, state = budget_step(_budget(db, key, now), now, calls, retry, ratio, minimum, ttl)
            if row is not None:
                params = {"key": key, "calls": row.calls, "retries": row.retries}
                db.execute(Q["budget_put"], {**params, "expires_at": row.expires_at})
        return state

    def breaker_admit(self, key: str, trial_for: float, ttl: float) -> BreakerState:
        with self._step(write=False) as db:  # the healthy path: one read
            now = time.time()
            row, state = admit_step(_breaker(db, key, now), now, trial_for, ttl)
        if row is None:
            return state
        with self._step(write=True) as db:  # a trial looks due: decide again under the lock
            now = time.time()
            row, state = admit_step(_breaker(db, key, now), now, trial_for, ttl)
            if row is not None:
                _put_breaker(db, key, row)
        return state

    def breaker_record(
        self, key: str, fence: int, ok: bool, threshold: int, cooldown: float, ttl: float
    ) -> BreakerState:
        with self._step(write=False) as db:  # a success with no failures to reset: one read
            now = time.time()
            current = _breaker(db, key, now)
            row, state = record_step(current, now, fence, ok, threshold, cooldown, ttl)
        if row is None:
            return state
        with self._step(write=True) as db:
            now = time.time()
            current = _breaker(db, key, now)
            row, state = record_step(current, now, fence, ok, threshold, cooldown, ttl)
            if row is not None:
                _put_breaker(db, key, row)
        return state

    # -- plans (approval gates): see backends/base.py ---------------------------------------------

    plan_pins = True

    def get_counter_version(self, name: str) -> tuple[int, int]:
        # Expired holds are given back first (which moves the version), as any step would.
        with self._step(write=True) as db:
            return _swept(db, name, time.time()), _counter_version(db, name)

    def plan_secret(self) -> bytes:
        with self._step(write=True) as db:  # first writer wins; every caller reads the one row
            db.execute(Q["plan_secret_make"], {"secret": os.urandom(32)})
            (secret,) = db.execute(Q["plan_secret_get"]).fetchone()
        return bytes(secret)

    def act_plan(
        self,
        plan_id: str,
        reads: Sequence[PlanRead],
        writes: Sequence[PlanWrite],
        approved_by: str,
        keep_for: float,
        not_after: float | None,
    ) -> PlanReceipt | list[StaleRead]:
        with self._step(write=True) as db:  # one transaction: any refusal rolls it all back
            now = time.time()
            kept = db.execute(Q["plan_receipt_get"], {"id": plan_id, "now": now}).fetchone()
            if kept is not None:
                versions = tuple(int(v) for v in orjson.loads(kept[2]))
                return PlanReceipt(plan_id, False, kept[0], float(kept[1]), versions)
            if not_after is not None and not_after <= now:
                raise PlanExpired(plan_id, not_after, now)
            stale: list[StaleRead] = []
            for read in reads:
                if read.kind == "record":
                    row = db.execute(Q["record_version"], {"key": read.key}).fetchone()
                    current = 0 if row is None else int(row[0])
                elif read.kind == "counter":
                    _swept(db, read.key, now)
                    current = _counter_version(db, read.key)
                else:
                    current = _pinned(db, read.key, plan_id)
                if current != read.version:
                    stale.append(StaleRead(read.kind, read.key, read.version, current))
            if stale:
                return stale
            made: list[int] = []
            for write in writes:
                if write.kind == "record":
                    assert write.record is not None
                    made.append(_write_record(db, write.key, write.record, now).version)
                    continue
                value = _swept(db, write.key, now)
                new = value + write.delta
                if (write.low is not None and new < write.low) or (
                    write.high is not None and new > write.high
                ):
                    raise LimitReached(write.key, value, write.delta, write.low, write.high)
                db.execute(Q["counter_set"], {"name": write.key, "value": new})
                made.append(_counter_version(db, write.key))
            params = {
                "id": plan_id,
                "approved_by": approved_by,
                "approved_at": now,
                "versions": orjson.dumps(made).decode(),
                "purge_at": now + keep_for,
            }
            db.execute(Q["plan_receipt_put"], params)
        return PlanReceipt(plan_id, True, approved_by, now, tuple(made))
