"""The PostgreSQL backend's shared-state guards: versioned records, bounded counters and their
holds, lock sets.

Written once for asyncio; ``backends/_sync/postgres_state.py`` is generated from it.

Tables and functions are in ``sql/postgres_migrations/0003_state.sql`` (counter holds:
``0005_holds.sql``). Every primitive is one round trip, atomic under READ COMMITTED:

* ``write_record`` calls ``agentlease_write_record()``, which locks the record's row (or inserts
  it, ``ON CONFLICT DO NOTHING``), checks fence, version and transition guard on what it holds
  and writes the fields, all in one transaction; a refusal comes back with the current record,
  and the typed error is raised here by
  :func:`~agentlease._policy.writes.check_write`, so every backend raises the same.
* ``add_counter``, ``hold_counter``, ``release_hold`` and ``commit_hold`` call one function each
  (``0005_holds.sql``), which locks the counter's row, reads the clock, gives back the units of
  the counter's holds that ran out, and decides on that value; ``extend_hold`` is one
  ``UPDATE`` of the hold's row, and ``get_counter`` one read that leaves expired holds out.
* ``acquire_locks``, ``extend_locks`` and ``release_locks`` call one function each, which locks
  the rows in one canonical order (so overlapping sets never deadlock) and reads the clock after
  any wait; ``acquire_locks`` inserts missing lock rows first, checks them all, then takes them
  all or none.
* ``lock_holders``, ``get_record`` and ``sweep_locks`` are one statement each.

Field values are ``bytea``, sent as memoryviews (the pool's connections send ``bytes`` as json).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, LiteralString

from agentlease._policy.writes import check_write
from agentlease._records import LockBusy, RecordWrite, StateRecord
from agentlease.backends._postgres_driver import Q
from agentlease.errors import BackendError, LimitReached

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


def _missing(names: Sequence[str], rows: list[Row]) -> list[str]:
    """The names of the set that the call did not touch (it returned the others)."""
    touched = {name for (name,) in rows}
    return [name for name in names if name not in touched]


class PostgresState:
    """The ``*_record``, ``*_counter``, ``*_hold`` and ``*_locks`` primitives of the PostgreSQL
    backend (a base of the backend class)."""

    if TYPE_CHECKING:

        async def _fetch(
            self, query: LiteralString, params: Mapping[str, Any] | None = None
        ) -> list[Row]: ...

        async def _write(self, query: LiteralString, params: Mapping[str, Any]) -> int: ...

    # -- versioned records ----------------------------------------------------------------------

    async def get_record(self, key: str) -> StateRecord | None:
        rows = await self._fetch(Q["record_get"], {"key": key})
        return _record(key, *rows[0]) if rows else None

    async def write_record(self, key: str, write: RecordWrite) -> StateRecord:
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
        ((outcome, version, *rest),) = await self._fetch(Q["record_write"], params)
        record = None if version is None else _record(key, version, *rest)
        if outcome == "ok" and record is not None:
            return record
        check_write(key, record, write)  # raises the refusal, typed as every backend does
        raise BackendError(f"PostgreSQL refused a write of record {key!r} ({outcome}) unexplained")

    # -- bounded counters -----------------------------------------------------------------------

    async def add_counter(self, name: str, delta: int, low: int | None, high: int | None) -> int:
        params = {"name": name, "delta": delta, "low": low, "high": high}
        ((added, value),) = await self._fetch(Q["counter_add"], params)
        if not added:
            raise LimitReached(name, value, delta, low, high)
        return int(value)

    async def get_counter(self, name: str) -> int:
        rows = await self._fetch(Q["counter_get"], {"name": name})
        return int(rows[0][0]) if rows else 0

    # -- counter holds --------------------------------------------------------------------------

    async def hold_counter(self, name: str, token: str, units: int, high: int, ttl: float) -> int:
        params = {"name": name, "token": token, "units": units, "high": high, "ttl": float(ttl)}
        ((added, value),) = await self._fetch(Q["hold_counter"], params)
        if not added:
            raise LimitReached(name, value, units, None, high)
        return int(value)

    async def extend_hold(self, name: str, token: str, ttl: float) -> bool:
        params = {"name": name, "token": token, "ttl": float(ttl)}
        return await self._write(Q["hold_extend"], params) == 1

    async def release_hold(self, name: str, token: str) -> bool:
        params = {"name": name, "token": token, "commit": False}
        return bool((await self._fetch(Q["hold_end"], params))[0][0])

    async def commit_hold(self, name: str, token: str) -> bool:
        params = {"name": name, "token": token, "commit": True}
        return bool((await self._fetch(Q["hold_end"], params))[0][0])

    # -- lock sets ------------------------------------------------------------------------------

    async def acquire_locks(self, names: Sequence[str], owner: str, ttl: float) -> Acquired:
        if not names:
            return []
        params = {"names": list(names), "owner": owner, "ttl": float(ttl)}
        rows = await self._fetch(Q["locks_acquire"], params)
        if len(rows) == 1 and rows[0][1] is None:
            name, _, holder, retry_after = rows[0]
            return LockBusy(name, holder, retry_after)
        fences = {name: fence for name, fence, _, _ in rows}
        return [int(fences[name]) for name in names]

    async def extend_locks(self, names: Sequence[str], owner: str, ttl: float) -> list[str]:
        params = {"names": list(names), "owner": owner, "ttl": float(ttl)}
        return _missing(names, await self._fetch(Q["locks_extend"], params))

    async def release_locks(self, names: Sequence[str], owner: str) -> list[str]:
        params = {"names": list(names), "owner": owner}
        return _missing(names, await self._fetch(Q["locks_release"], params))

    async def lock_holders(self, names: Sequence[str]) -> list[tuple[str, float] | None]:
        rows = await self._fetch(Q["locks_holders"], {"names": list(names)})
        held = {name: (owner, expires_at) for name, owner, expires_at in rows}
        return [held.get(name) for name in names]

    async def sweep_locks(self, limit: int) -> int:
        return await self._write(Q["locks_sweep"], {"limit": limit})
