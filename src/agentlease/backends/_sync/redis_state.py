# Generated from agentlease/backends/_async/redis_state.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""The Redis backend's shared-state guards: versioned records, bounded counters and their holds,
lock sets; retry budgets and circuit breakers.

Written once for asyncio; ``backends/_sync/redis_state.py`` is generated from it.

A record is the hash ``<prefix>:rec:{<key>}`` and a counter the string ``<prefix>:ctr:{<name>}``:
each is its own hash tag, so they spread over a Redis Cluster and each script touches one record
or one counter (with its holds, which share the counter's hash tag).
A retry budget is the hash ``<prefix>:bud:{<key>}`` and a circuit breaker the hash
``<prefix>:brk:{<key>}``, each its own hash tag, one script per primitive, each write moving the
key's expiry to ``ttl`` after it (Redis deletes it then).
Every lock key shares the hash tag ``{<prefix>:locks}``, so a lock set of any names is one script
on one shard: on a cluster, all the locks of a store live on one shard. The layout is drawn in
:mod:`agentlease.backends.lua`. Times come from ``redis.call('TIME')`` inside the scripts.

What is kept how long: budgets and breakers (and idempotency keys) carry a TTL, so Redis deletes
them itself and ``purge_state`` has nothing to do; a counter's ended holds are deleted by the
next step on the counter once their expiry passes; ``sweep_locks`` frees expired lock leases
(their entries in ``:owner`` and ``:expiry``). A lock name's ``:fence`` and ``:freed`` entries
stay (its fencing token must only rise), as do records and counters (the user's state): they
grow with the number of names, never with their use.

Sending a call again after a lost reply (see ``redis_link.py``): reads, lock extensions and
sweeps repeat harmlessly; a resent acquisition finds the locks held by the same owner and takes
them again, with new (still rising) tokens; a release carries a request nonce that each lock it
freed keeps, so a resent one is answered as the first was. A hold carries its random token, so a
resent one finds itself made; a resent release or commit finds the tombstone its first sending
left. A record write and a counter addition are never resent once they may have run: a broken
connection mid-call raises BackendUnavailable (the write may or may not have been applied). A
version check would refuse a resent compare-and-set, but a blind write or an addition would be
applied twice, and a nonce kept in the record or counter would recognise a resend only if no
other writer came in between.

A budget step and a breaker outcome are not resent either (a resent failure would count twice,
a resent retry would take two). An admission is: the closed, open and half-open paths are reads,
and a resend of one that granted the trial finds that trial live and answers ``trial=False``:
nobody runs the window's trial, and the next one opens when its turn (``trial_for``) runs out.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import orjson

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
from agentlease.backends._sync.redis_link import RedisLink
from agentlease.backends.lua import (
    breaker_hash,
    breaker_state_from,
    budget_hash,
    counter_keys,
    lock_keys,
    record_hash,
    state_record_from,
)
from agentlease.errors import ConflictError, FencedOff, GuardError, LimitReached, TransitionRefused

__all__ = ["RedisState"]


def _nonce() -> str:
    """A request nonce: lets a script recognise a retry of a write it already applied."""
    return os.urandom(8).hex()


def _opt(value: int | None) -> int | str:
    return "" if value is None else value


def _fields(stored: list[bytes]) -> dict[str, bytes]:
    """A record's fields from its hash as a script's flat name, value list (HGETALL)."""
    return {
        stored[i][2:].decode(): stored[i + 1]
        for i in range(0, len(stored), 2)
        if stored[i][:2] == b"f:"
    }


def _decoded(data: bytes | None) -> object:
    return None if data is None else orjson.loads(data)


class RedisState:
    """The ``*_record``, ``*_counter``, ``*_hold``, ``*_locks``, ``retry_budget`` and
    ``breaker_*`` primitives of the Redis backend (a base of the backend class)."""

    _link: RedisLink
    _prefix: str

    # -- versioned records -----------------------------------------------------------------------

    def get_record(self, key: str) -> StateRecord | None:
        stored = self._link.command("HGETALL", record_hash(self._prefix, key))
        return state_record_from(key, stored)

    def write_record(self, key: str, write: RecordWrite) -> StateRecord:
        guard = "" if write.guard_field is None else f"f:{write.guard_field}"
        allowed = [v for v in write.allowed_from if v is not None]
        args: list[Any] = [
            "1" if write.replace else "0",
            _opt(write.expected_version),
            _opt(write.fence),
            guard,
            "1" if None in write.allowed_from else "0",
            len(allowed),
            *allowed,
        ]
        for name, value in write.fields.items():
            args += (f"f:{name}", value)
        keys = (record_hash(self._prefix, key),)
        reply = self._link.script("record_write", keys, args, retry=False)
        if reply[0] == b"ok":
            _, version, fence, updated_at, stored = reply
            # After a replace the fields are those written; after a merge, the hash's.
            fields = dict(write.fields) if write.replace else _fields(stored)
            return StateRecord(key, version, fields, fence, float(updated_at))
        raise _refusal(key, write, reply)

    # -- bounded counters ------------------------------------------------------------------------

    def add_counter(self, name: str, delta: int, low: int | None, high: int | None) -> int:
        keys = counter_keys(self._prefix, name)
        args = (delta, _opt(low), _opt(high))
        reply = self._link.script("counter_add", keys, args, retry=False)
        if reply[0] == b"limit":
            raise LimitReached(name, int(reply[1]), delta, low, high)
        return int(reply[1])

    def get_counter(self, name: str) -> int:
        keys = counter_keys(self._prefix, name)
        return int(self._link.script("counter_get", keys, (), retry=True))

    # -- counter holds ---------------------------------------------------------------------------

    def hold_counter(self, name: str, token: str, units: int, high: int, ttl: float) -> int:
        keys = counter_keys(self._prefix, name)
        args = (token, units, high, ttl)
        reply = self._link.script("hold_take", keys, args, retry=True)
        if reply[0] == b"limit":
            raise LimitReached(name, int(reply[1]), units, None, high)
        return int(reply[1])

    def extend_hold(self, name: str, token: str, ttl: float) -> bool:
        keys = counter_keys(self._prefix, name)[1:]
        return bool(self._link.script("hold_extend", keys, (token, ttl), retry=True))

    def release_hold(self, name: str, token: str) -> bool:
        keys = counter_keys(self._prefix, name)
        return bool(self._link.script("hold_release", keys, (token,), retry=True))

    def commit_hold(self, name: str, token: str, units: int | None = None) -> bool:
        keys = counter_keys(self._prefix, name)
        args = (token, "" if units is None else units)
        return bool(self._link.script("hold_commit", keys, args, retry=True))

    # -- lock sets -------------------------------------------------------------------------------

    def acquire_locks(
        self,
        names: Sequence[str],
        owner: str,
        ttl: float,
    ) -> list[int] | LockBusy:
        if not names:
            return []
        keys = lock_keys(self._prefix).acquire
        reply = self._link.script("locks_acquire", keys, (owner, ttl, *names), retry=True)
        if reply[0] == b"busy":
            return LockBusy(reply[1].decode(), reply[2].decode(), float(reply[3]))
        return [int(token) for token in reply[1]]

    def extend_locks(self, names: Sequence[str], owner: str, ttl: float) -> list[str]:
        if not names:
            return []
        keys = lock_keys(self._prefix).extend
        reply = self._link.script("locks_extend", keys, (owner, ttl, *names), retry=True)
        return [name.decode() for name in reply]

    def release_locks(self, names: Sequence[str], owner: str) -> list[str]:
        if not names:
            return []
        keys = lock_keys(self._prefix).release
        args = (owner, _nonce(), *names)
        reply = self._link.script("locks_release", keys, args, retry=True)
        return [name.decode() for name in reply]

    def lock_holders(self, names: Sequence[str]) -> list[tuple[str, float] | None]:
        if not names:
            return []
        keys = lock_keys(self._prefix).holders
        reply = self._link.script("locks_holders", keys, names, retry=True)
        return [
            None if reply[i] is None else (reply[i].decode(), float(reply[i + 1]))
            for i in range(0, len(reply), 2)
        ]

    def sweep_locks(self, limit: int) -> int:
        if limit <= 0:
            return 0
        keys = lock_keys(self._prefix).sweep
        count: int = self._link.script("locks_sweep", keys, (limit,), retry=True)
        return count

    def purge_state(self, limit: int) -> int:
        """Nothing to do: Redis expires budgets and breakers itself (their TTL)."""
        return 0

    # -- retry budgets and circuit breakers ------------------------------------------------------

    def retry_budget(
        self, key: str, calls: int, retry: bool, ratio: float, minimum: int, ttl: float
    ) -> BudgetState:
        keys = (budget_hash(self._prefix, key),)
        args = (calls, "1" if retry else "0", _ratio(ratio), minimum, float(ttl))
        total, retries, granted = self._link.script("retry_budget", keys, args, retry=False)
        return BudgetState(int(total), int(retries), granted == 1)

    def breaker_admit(self, key: str, trial_for: float, ttl: float) -> BreakerState:
        keys = (breaker_hash(self._prefix, key),)
        args = (float(trial_for), float(ttl))
        return breaker_state_from(self._link.script("breaker_admit", keys, args, retry=True))

    def breaker_record(
        self, key: str, fence: int, ok: bool, threshold: int, cooldown: float, ttl: float
    ) -> BreakerState:
        keys = (breaker_hash(self._prefix, key),)
        args = (fence, "1" if ok else "0", threshold, float(cooldown), float(ttl))
        reply = self._link.script("breaker_record", keys, args, retry=False)
        return breaker_state_from(reply)

    # -- plans (approval gates): see backends/base.py ---------------------------------------------

    plan_pins = False

    def get_counter_version(self, name: str) -> tuple[int, int]:
        raise NotImplementedError("plans on this store: not yet")

    def plan_secret(self) -> bytes:
        raise NotImplementedError("plans on this store: not yet")

    def act_plan(
        self,
        plan_id: str,
        reads: Sequence[PlanRead],
        writes: Sequence[PlanWrite],
        approved_by: str,
        keep_for: float,
        not_after: float | None,
    ) -> PlanReceipt | list[StaleRead]:
        raise NotImplementedError("plans on this store: not yet")


def _ratio(ratio: float) -> float:
    """A budget's ratio as the script reads it: NaN (which Lua may not parse) grants nothing
    beyond the minimum on every store, as 0 does."""
    return 0.0 if math.isnan(ratio) else float(ratio)


def _refusal(key: str, write: RecordWrite, reply: list[Any]) -> GuardError:
    """The error a refused ``record_write.lua`` reply stands for."""
    if reply[0] == b"fenced":
        return FencedOff(key, write.fence or 0, int(reply[1]))
    if reply[0] == b"conflict":
        current = state_record_from(key, reply[1])
        expected = write.expected_version or 0
        if current is None:
            return ConflictError(key, expected, 0, None)
        return ConflictError(key, expected, current.version, current.value)
    field = write.guard_field or ""
    return TransitionRefused(key, field, _decoded(reply[1]), _decoded(write.fields.get(field)))
