# Generated from agentlease/backends/_async/postgres_state.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""The PostgreSQL backend's shared-state guards: versioned records, bounded counters and their
holds, lock sets; retry budgets and circuit breakers.

Written once for asyncio; ``backends/_sync/postgres_state.py`` is generated from it.

Tables and functions are in ``sql/postgres_migrations/0003_state.sql`` (counter holds:
``0005_holds.sql``; the record write as it is now: ``0006_leaner_calls.sql``). Every primitive is
one round trip (but a busy set of one lock: two), each atomic under READ COMMITTED:

* ``write_record`` calls ``agentlease_write_record()``, which checks fence, version and
  transition guard on the record as it is under its row lock and writes the fields, all in one
  transaction: a write with no guard and a record expected to exist is one ``UPDATE`` that checks
  version and fence in its ``WHERE``; any other (or one that ``UPDATE`` did not apply) locks the
  row first (or inserts it, ``ON CONFLICT DO NOTHING``) and decides on what it holds. A refusal
  comes back with the current record, and the typed error is raised here by
  :func:`~agentlease._policy.writes.check_write`, so every backend raises the
  same. A replacing write's reply carries no fields after a write: they are those written.
* ``add_counter``, ``hold_counter``, ``release_hold`` and ``commit_hold`` call one function each
  (``0005_holds.sql``), which locks the counter's row, reads the clock, gives back the units of
  the counter's holds that ran out, and decides on that value; ``extend_hold`` is one
  ``UPDATE`` of the hold's row, and ``get_counter`` one read that leaves expired holds out.
* ``acquire_locks``, ``extend_locks`` and ``release_locks`` call one function each, which locks
  the rows in one canonical order (so overlapping sets never deadlock) and reads the clock after
  any wait; ``acquire_locks`` inserts missing lock rows first, checks them all, then takes them
  all or none. A set of one lock is taken (``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` free)
  and released by one statement of its own: one row, so no order to keep; an acquisition that
  finds the lock busy then calls the function, which says who holds it (or takes it, if it
  came free meanwhile).
* ``lock_holders``, ``get_record`` and ``sweep_locks`` are one statement each, and so is
  ``purge_state``, which deletes expired budgets and breakers (records, counters and lock rows
  are never deleted: see ``Backend.purge_state``; a counter's expired holds are deleted by every
  step on the counter).
* ``retry_budget``, ``breaker_admit`` and ``breaker_record`` call one function each
  (``0007_budgets.sql``), and so does ``commit_hold`` with ``units`` (``agentlease_settle_hold``).
  Their healthy paths are one plain read; a step that may write locks the row and decides again
  on what it holds.

* plans (``0012_plans.sql``): ``act_plan`` is one call of ``agentlease_act_plan()``, which
  takes the plan's advisory lock (approvals of one plan queue; the receipt answers all but the
  first), checks the deadline on the store's clock, locks every record (an absent one by a
  stand-in row at version 0, deleted before commit) and then every counter the plan touches, in
  code point order, compares each read (a pin: the user's row ``FOR SHARE``), applies the writes
  through ``agentlease_write_record`` and ``agentlease_add_counter``, and keeps the receipt; a
  refusal rolls all of it back and comes back as one row, raised here as the typed error. A
  pin's identifiers are checked here before any I/O and quoted by the function (``%I``), its
  values passed as literals (``%L``) that the column's type reads; a table named without its
  schema is looked up by the connection's search_path, the store's schema alone.
  ``get_counter_version`` is one read (the holds that ran out count as given back);
  ``plan_secret`` one call of ``agentlease_secret()`` with 32 random bytes drawn here, which
  the first caller stores.

Field values are ``bytea``, sent as memoryviews (the pool's connections send ``bytes`` as json).
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, LiteralString

from agentlease._policy.writes import check_write
from agentlease._records import (
    BreakerState,
    BreakerStatus,
    BudgetState,
    LockBusy,
    PlanRead,
    PlanReceipt,
    PlanWrite,
    RecordWrite,
    StaleRead,
    StateRecord,
)
from agentlease.backends._postgres_driver import Q
from agentlease.errors import BackendError, InvalidName, LimitReached, PlanExpired, PlanRefused

__all__ = ["PostgresState"]

Row = tuple[Any, ...]
# What acquire_locks returns; named so that both faces' signatures fit one formatted line.
Acquired = list[int] | LockBusy


def _record(
    key: str,
    version: int,
    fence: int,
    updated_at: float,
    names: list[str] | None,
    values: list[bytes] | None,
) -> StateRecord:
    fields = dict(zip(names or [], values or [], strict=True))
    return StateRecord(key, version, fields, fence, updated_at)


_BREAKER_STATES: dict[str, BreakerStatus] = {
    "closed": "closed",
    "open": "open",
    "half_open": "half_open",
}


def _breaker(rows: list[Row]) -> BreakerState:
    ((state, failures, fence, retry_after, trial),) = rows
    return BreakerState(_BREAKER_STATES[state], failures, fence, retry_after, trial)


def _missing(names: Sequence[str], rows: list[Row]) -> list[str]:
    """The names of the set that the call did not touch (it returned the others)."""
    touched = {name for (name,) in rows}
    return [name for name in names if name not in touched]


_KINDS: dict[str, Literal["record", "counter", "pin"]] = {
    "record": "record",
    "counter": "counter",
    "pin": "pin",
}


def _stale(kind: str, key: str, read: int, now: int) -> StaleRead:
    return StaleRead(_KINDS[kind], key, int(read), int(now))


def _pin_value(value: object, key: str) -> str | None:
    """A pin's ``where`` value as the text of an SQL literal (the column's type reads it)."""
    from agentlease._versioned_sql import _bindable  # plans only: a worker never loads it

    _bindable(value)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    raise PlanRefused(f"pin {key}: {value!r} is not a value a where can match")


def _pin(key: str) -> dict[str, Any]:
    """A pin's key (canonical JSON of table, where and column) as ``agentlease_act_plan`` takes
    it, every identifier checked as ``versioned_update`` checks them: nothing reaches the store
    otherwise. ``table`` may name its schema (``schema.table``); without one, the table is
    looked up by the connection's search_path, which is the store's schema alone."""
    from agentlease._versioned_sql import _ident  # plans only: a worker never loads it

    try:
        pin = json.loads(key)
    except ValueError:
        raise PlanRefused(f"pin {key!r} is not JSON") from None
    if not isinstance(pin, dict) or set(pin) != {"table", "where", "column"}:
        raise PlanRefused(f"pin {key!r} is not {{table, where, column}}")
    table, where = pin["table"], pin["where"]
    if not isinstance(table, str) or not isinstance(where, dict) or not where:
        raise PlanRefused(f"pin {key!r}: a table and a non-empty where are needed")
    parts = table.split(".")
    if not 1 <= len(parts) <= 2:
        raise InvalidName(f"table {table!r} is not [schema.]table")
    names = [_ident(part, "table") for part in parts]
    return {
        "schema": names[0] if len(names) == 2 else None,
        "table": names[-1],
        "column": _ident(pin["column"], "column"),
        "where": [[_ident(c, "column"), _pin_value(v, key)] for c, v in where.items()],
    }


def _plan_params(
    plan_id: str,
    reads: Sequence[PlanRead],
    writes: Sequence[PlanWrite],
    approved_by: str,
    keep_for: float,
    not_after: float | None,
) -> dict[str, Any]:
    """The parameters of ``plan_act``: reads and writes as aligned arrays (see
    ``agentlease_act_plan`` in ``0012_plans.sql``). A malformed read or write is refused here,
    before any I/O."""
    for read in reads:
        if read.kind not in _KINDS:
            raise PlanRefused(f"a read of kind {read.kind!r}", plan_id=plan_id)
    pins = [_pin(r.key) if r.kind == "pin" else None for r in reads]
    params: dict[str, Any] = {
        "id": plan_id,
        "approved_by": approved_by,
        "keep_for": float(keep_for),
        "not_after": None if not_after is None else float(not_after),
        "read_kinds": [r.kind for r in reads],
        "read_keys": [r.key for r in reads],
        "read_versions": [r.version for r in reads],
        "pins": json.dumps(pins),
        "write_kinds": [w.kind for w in writes],
        "write_keys": [w.key for w in writes],
    }
    columns: dict[str, list[Any]] = {
        name: []
        for name in (
            "replace", "expected", "guard", "allow_absent", "fence", "field_of", "field_names",
            "field_values", "allowed_of", "allowed_values", "delta", "low", "high",
        )
    }  # fmt: skip
    for index, write in enumerate(writes, 1):
        record = write.record
        if write.kind == "record" and record is not None:
            columns["replace"].append(record.replace)
            columns["expected"].append(record.expected_version)
            columns["guard"].append(record.guard_field)
            columns["allow_absent"].append(None in record.allowed_from)
            columns["fence"].append(record.fence)
            for field, value in record.fields.items():
                columns["field_of"].append(index)
                columns["field_names"].append(field)
                columns["field_values"].append(memoryview(value))
            for allowed in record.allowed_from:
                if allowed is not None:
                    columns["allowed_of"].append(index)
                    columns["allowed_values"].append(memoryview(allowed))
        elif write.kind == "counter":
            for name in ("replace", "allow_absent"):
                columns[name].append(False)
            for name in ("expected", "guard", "fence"):
                columns[name].append(None)
        else:
            raise PlanRefused(f"a {write.kind!r} write of {write.key!r}", plan_id=plan_id)
        columns["delta"].append(write.delta)
        columns["low"].append(write.low)
        columns["high"].append(write.high)
    return params | columns


class PostgresState:
    """The ``*_record``, ``*_counter``, ``*_hold``, ``*_locks``, ``retry_budget`` and
    ``breaker_*`` primitives of the PostgreSQL backend (a base of the backend class)."""

    if TYPE_CHECKING:

        def _fetch(
            self, query: LiteralString, params: Mapping[str, Any] | None = None
        ) -> list[Row]: ...

        def _write(self, query: LiteralString, params: Mapping[str, Any]) -> int: ...

    # -- versioned records ----------------------------------------------------------------------

    def get_record(self, key: str) -> StateRecord | None:
        rows = self._fetch(Q["record_get"], {"key": key})
        return _record(key, *rows[0]) if rows else None

    def write_record(self, key: str, write: RecordWrite) -> StateRecord:
        params = {
            "key": key,
            "fields": list(write.fields),
            "values": [memoryview(v) for v in write.fields.values()],
            "replace": write.replace,
            "expected": write.expected_version,
            "guard": write.guard_field,
            "allowed": [memoryview(v) for v in write.allowed_from if v is not None],
            "allow_absent": None in write.allowed_from,
            "fence": write.fence,
        }
        # A replacing write's reply carries the fields only with a refusal: after it they are
        # exactly the fields written.
        query = Q["record_replace" if write.replace else "record_write"]
        ((outcome, version, fence, updated_at, names, values),) = self._fetch(query, params)
        if outcome == "ok" and write.replace:
            return StateRecord(key, version, dict(write.fields), fence, updated_at)
        record = (
            None if version is None else _record(key, version, fence, updated_at, names, values)
        )
        if outcome == "ok" and record is not None:
            return record
        check_write(key, record, write)  # raises the refusal, typed as every backend does
        raise BackendError(f"PostgreSQL refused a write of record {key!r} ({outcome}) unexplained")

    # -- bounded counters -----------------------------------------------------------------------

    def add_counter(self, name: str, delta: int, low: int | None, high: int | None) -> int:
        params = {"name": name, "delta": delta, "low": low, "high": high}
        ((added, value),) = self._fetch(Q["counter_add"], params)
        if not added:
            raise LimitReached(name, value, delta, low, high)
        return int(value)

    def get_counter(self, name: str) -> int:
        rows = self._fetch(Q["counter_get"], {"name": name})
        return int(rows[0][0]) if rows else 0

    # -- counter holds --------------------------------------------------------------------------

    def hold_counter(self, name: str, token: str, units: int, high: int, ttl: float) -> int:
        params = {"name": name, "token": token, "units": units, "high": high, "ttl": float(ttl)}
        ((added, value),) = self._fetch(Q["hold_counter"], params)
        if not added:
            raise LimitReached(name, value, units, None, high)
        return int(value)

    def extend_hold(self, name: str, token: str, ttl: float) -> bool:
        params = {"name": name, "token": token, "ttl": float(ttl)}
        return self._write(Q["hold_extend"], params) == 1

    def release_hold(self, name: str, token: str) -> bool:
        params = {"name": name, "token": token, "commit": False}
        return bool((self._fetch(Q["hold_end"], params))[0][0])

    def commit_hold(self, name: str, token: str, units: int | None = None) -> bool:
        if units is not None:
            settle = {"name": name, "token": token, "units": units}
            return bool((self._fetch(Q["hold_settle"], settle))[0][0])
        params = {"name": name, "token": token, "commit": True}
        return bool((self._fetch(Q["hold_end"], params))[0][0])

    # -- lock sets ------------------------------------------------------------------------------

    def acquire_locks(self, names: Sequence[str], owner: str, ttl: float) -> Acquired:
        if not names:
            return []
        if len(names) == 1:  # one statement takes a free lock; a busy one is reported below
            one = {"name": names[0], "owner": owner, "ttl": float(ttl)}
            taken = self._fetch(Q["lock_take"], one)
            if taken:
                return [int(taken[0][0])]
        params = {"names": list(names), "owner": owner, "ttl": float(ttl)}
        rows = self._fetch(Q["locks_acquire"], params)
        if len(rows) == 1 and rows[0][1] is None:
            name, _, holder, retry_after = rows[0]
            return LockBusy(name, holder, retry_after)
        fences = {name: fence for name, fence, _, _ in rows}
        return [int(fences[name]) for name in names]

    def extend_locks(self, names: Sequence[str], owner: str, ttl: float) -> list[str]:
        params = {"names": list(names), "owner": owner, "ttl": float(ttl)}
        return _missing(names, self._fetch(Q["locks_extend"], params))

    def release_locks(self, names: Sequence[str], owner: str) -> list[str]:
        if len(names) == 1:
            one = {"name": names[0], "owner": owner}
            return [] if self._fetch(Q["lock_release"], one) else list(names)
        params = {"names": list(names), "owner": owner}
        return _missing(names, self._fetch(Q["locks_release"], params))

    def lock_holders(self, names: Sequence[str]) -> list[tuple[str, float] | None]:
        rows = self._fetch(Q["locks_holders"], {"names": list(names)})
        held = {name: (owner, expires_at) for name, owner, expires_at in rows}
        return [held.get(name) for name in names]

    def sweep_locks(self, limit: int) -> int:
        return self._write(Q["locks_sweep"], {"limit": limit})

    def purge_state(self, limit: int) -> int:
        ((count,),) = self._fetch(Q["state_purge"], {"limit": limit})
        return int(count)

    # -- retry budgets and circuit breakers -----------------------------------------------------

    def retry_budget(
        self, key: str, calls: int, retry: bool, ratio: float, minimum: int, ttl: float
    ) -> BudgetState:
        params = {
            "key": key,
            "calls": calls,
            "retry": retry,
            "ratio": float(ratio),
            "minimum": minimum,
            "ttl": float(ttl),
        }
        ((total, retries, granted),) = self._fetch(Q["retry_budget"], params)
        return BudgetState(int(total), int(retries), bool(granted))

    def breaker_admit(self, key: str, trial_for: float, ttl: float) -> BreakerState:
        params = {"key": key, "trial_for": float(trial_for), "ttl": float(ttl)}
        return _breaker(self._fetch(Q["breaker_admit"], params))

    def breaker_record(
        self, key: str, fence: int, ok: bool, threshold: int, cooldown: float, ttl: float
    ) -> BreakerState:
        params = {
            "key": key,
            "fence": fence,
            "ok": ok,
            "threshold": threshold,
            "cooldown": float(cooldown),
            "ttl": float(ttl),
        }
        return _breaker(self._fetch(Q["breaker_record"], params))

    # -- plans (approval gates): see backends/base.py ---------------------------------------------

    plan_pins = True

    def get_counter_version(self, name: str) -> tuple[int, int]:
        rows = self._fetch(Q["counter_version"], {"name": name})
        return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

    def plan_secret(self) -> bytes:
        params = {"name": "plan", "candidate": memoryview(secrets.token_bytes(32))}
        ((secret,),) = self._fetch(Q["secret"], params)
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
        params = _plan_params(plan_id, reads, writes, approved_by, keep_for, not_after)
        ((outcome, by, at, versions, kinds, keys, read, now, index, *refused),) = self._fetch(
            Q["plan_act"], params
        )
        if outcome in ("acted", "replay"):
            return PlanReceipt(plan_id, outcome == "acted", by, float(at), tuple(versions))
        if outcome == "stale":
            return [_stale(*moved) for moved in zip(kinds, keys, read, now, strict=True)]
        if outcome == "expired":
            raise PlanExpired(plan_id, float(not_after or 0.0), float(at))
        version, fence, updated_at, names, values, value, detail = refused
        if outcome == "pin":
            raise PlanRefused(str(detail), plan_id=plan_id)
        write = writes[index - 1]
        if outcome == "limit":
            raise LimitReached(write.key, value, write.delta, write.low, write.high)
        record = None
        if version:  # a record at version 0 is the call's own stand-in for an absent one
            record = _record(write.key, version, fence, updated_at, names, values)
        if write.record is not None:
            check_write(write.key, record, write.record)  # raises the refusal, typed
        raise BackendError(f"PostgreSQL refused plan {plan_id!r} ({outcome}) unexplained")
