# Generated from agentlease/backends/_async/redis_state.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""The Redis backend's shared-state guards: versioned records, bounded counters and their holds,
lock sets; retry budgets and circuit breakers.

Written once for asyncio; ``backends/_sync/redis_state.py`` is generated from it.

A record is the hash ``<prefix>:rec:{<key>}`` and a counter the string ``<prefix>:ctr:{<name>}``:
each is its own hash tag, so they spread over a Redis Cluster and each script touches one record
or one counter (with its holds and its version, which share the counter's hash tag). A name of a
state space, ``"<space>|<name>"``, is placed in the space's hash tag ``{<prefix>:sp:<space>}``
instead (key layout 3): every record and counter of one space lives on one slot.

A plan (an approval gate) is acted on by one script, ``plan_act.lua``, given every key it reads
or writes and the receipt's: on a Redis Cluster they must share a slot, which a plan whose names
are all of one state space does (or all one plain name); any other plan is refused with
PlanRefused before anything is sent. On a single Redis any names work. A pin (a row of the
user's own table) is refused: Redis holds no such table. The receipt lives in the hash tag of
the plan's first name (``<prefix>:plan:{<tag>}:<id>``), kept ``keep_for`` seconds (Redis
expires it).
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

An act on a plan is resent: it carries a request nonce that its receipt keeps, so a resend of an
act that ran finds the receipt with its own nonce and is answered as the first sending would have
been (``first=True``); a later call of anyone else gets the receipt with ``first=False``. A
resend of an act that did not run acts (every check is made again). The plan's secret is made by
``SET NX`` and read back, which repeats harmlessly, as does ``get_counter_version`` (its sweep
of expired holds finds nothing left to give back).

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
from redis.crc import key_slot

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
from agentlease.backends import _redis_url
from agentlease.backends._sync.redis_link import RedisLink
from agentlease.backends.lua import (
    breaker_hash,
    breaker_state_from,
    budget_hash,
    counter_keys,
    counter_tag,
    lock_keys,
    plan_receipt_key,
    plan_secret_key,
    record_hash,
    record_tag,
    state_record_from,
)
from agentlease.errors import (
    ConflictError,
    FencedOff,
    GuardError,
    LimitReached,
    PlanExpired,
    PlanRefused,
    TransitionRefused,
)

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
    _options: _redis_url.RedisOptions

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
        keys = counter_keys(self._prefix, name)[1:3]
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
    """A pin names a row of the user's own table, which no Redis script can read."""

    def get_counter_version(self, name: str) -> tuple[int, int]:
        keys = counter_keys(self._prefix, name)
        value, version = self._link.script("counter_version", keys, (), retry=True)
        return int(value), int(version)

    def plan_secret(self) -> bytes:
        keys = (plan_secret_key(self._prefix),)
        secret: bytes = self._link.script("plan_secret", keys, (os.urandom(32),), retry=True)
        return secret

    def act_plan(
        self,
        plan_id: str,
        reads: Sequence[PlanRead],
        writes: Sequence[PlanWrite],
        approved_by: str,
        keep_for: float,
        not_after: float | None,
    ) -> PlanReceipt | list[StaleRead]:
        plan = _Plan(self._prefix, plan_id)
        if any(read.kind == "pin" for read in reads):
            raise PlanRefused(
                "a pin checks a row of a table in the store's own database: only SQLite and "
                "PostgreSQL keep one",
                plan_id=plan_id,
            )
        encoded_reads = [
            ["r" if r.kind == "record" else "c", plan.index(r.kind, r.key), str(r.version)]
            for r in reads
        ]
        encoded_writes = [_encoded_write(w, plan.index(w.kind, w.key)) for w in writes]
        keys = plan.keys()
        if self._options.cluster and len({key_slot(k.encode()) for k in keys}) > 1:
            raise PlanRefused(
                "a plan's names must share one state space on a Redis Cluster (name them "
                "'<space>|<name>'): its keys are on more than one slot",
                plan_id=plan_id,
            )
        nonce = _nonce()
        body = {
            "n": nonce,
            "by": approved_by,
            "keep": str(max(1, math.ceil(keep_for * 1000))),
            "until": "" if not_after is None else repr(float(not_after)),
            "counters": plan.counters,
            "reads": encoded_reads,
            "writes": encoded_writes,
        }
        reply = self._link.script("plan_act", keys, (orjson.dumps(body),), retry=True)
        tag = reply[0]
        if tag == b"receipt":
            kept = orjson.loads(reply[2])
            versions = kept["v"] if isinstance(kept["v"], list) else []  # cjson: {} when empty
            return PlanReceipt(
                plan_id,
                reply[1] == 1,
                kept["by"],
                float(kept["at"]),
                tuple(int(v) for v in versions),
            )
        if tag == b"expired":
            raise PlanExpired(plan_id, float(not_after or 0.0), float(reply[1]))
        if tag == b"stale":
            return [
                StaleRead(reads[i - 1].kind, reads[i - 1].key, reads[i - 1].version, int(now))
                for i, now in zip(reply[1::2], reply[2::2], strict=True)
            ]
        write = writes[int(reply[1]) - 1]
        if tag == b"limit":
            raise LimitReached(write.key, int(reply[2]), write.delta, write.low, write.high)
        record = write.record or RecordWrite({})
        if tag == b"conflict":
            current = state_record_from(write.key, reply[3])
            expected = record.expected_version or 0
            seen = None if current is None else current.value
            raise ConflictError(write.key, expected, int(reply[2]), seen)
        raise _refusal(write.key, record, [tag, reply[2]])


class _Plan:
    """The keys of one plan, each once, in the order the script gets them: the receipt first,
    then each record's hash and each counter's four keys, as the plan names them first."""

    def __init__(self, prefix: str, plan_id: str) -> None:
        self._prefix = prefix
        self._plan_id = plan_id
        self._keys: list[str] = []
        self._index: dict[tuple[str, str], int] = {}
        self._tag: str | None = None
        self.counters: list[int] = []

    def index(self, kind: str, name: str) -> int:
        """The KEYS index (from 1) of record or counter ``name`` (a counter: of its first key)."""
        found = self._index.get((kind, name))
        if found is not None:
            return found
        at = len(self._keys) + 2  # KEYS[1] is the receipt
        if kind == "record":
            self._keys.append(record_hash(self._prefix, name))
            self._tag = self._tag or record_tag(self._prefix, name)
        else:
            self._keys.extend(counter_keys(self._prefix, name))
            self._tag = self._tag or counter_tag(self._prefix, name)
            self.counters.append(at)
        self._index[(kind, name)] = at
        return at

    def keys(self) -> list[str]:
        """Every key, the receipt first (in the hash tag of the plan's first name)."""
        tag = self._tag if self._tag is not None else self._plan_id
        return [plan_receipt_key(self._prefix, tag, self._plan_id), *self._keys]


def _encoded_write(write: PlanWrite, at: int) -> list[Any]:
    """One write of a plan as ``plan_act.lua`` reads it (integers as strings: exact in JSON)."""
    if write.kind == "counter":
        return ["c", at, str(write.delta), _text(write.low), _text(write.high)]
    record = write.record or RecordWrite({})
    fields: list[str] = []
    for name, value in record.fields.items():
        fields += (f"f:{name}", value.decode())
    return [
        "r",
        at,
        "1" if record.replace else "0",
        _text(record.expected_version),
        _text(record.fence),
        "" if record.guard_field is None else f"f:{record.guard_field}",
        "1" if None in record.allowed_from else "0",
        [v.decode() for v in record.allowed_from if v is not None],
        fields,
    ]


def _text(value: int | None) -> str:
    return "" if value is None else str(value)


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
