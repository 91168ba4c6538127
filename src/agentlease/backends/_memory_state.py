"""The memory backend's shared-state guards: versioned records, bounded counters (and their
holds), lock sets; retry budgets and circuit breakers (their steps are those of ``_budgets.py``).

Every method is called with the backend's lock held and the store's ``now``, so each one is one
atomic step. Expired locks, and each counter's expired holds, are found through a heap by expiry
(lazy deletion), so sweeping never looks at live ones.

Plans: every counter has a version (``counter_versions``) that each change of its value raises,
holds and the giving back of expired holds included. ``act_plan`` checks a plan's reads and
stages its writes on copies (each guarded as its own step would be) before applying any, so a
refusal leaves nothing written; receipts are kept by plan id with a heap by ``purge_at`` that
``purge`` drains in its batch. The store's plan secret is drawn once, when the tables are made.
"""

from __future__ import annotations

import heapq
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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
from agentlease.errors import LimitReached, PlanExpired, PlanRefused

__all__ = ["MemoryState", "StateTables"]


@dataclass(slots=True)
class _Lock:
    owner: str | None = None
    expires_at: float = 0.0
    fence: int = 0


@dataclass(slots=True)
class _Holds:
    """A counter's live holds: token -> (units, expires_at), and a heap of (expires_at, token)
    to find the expired ones without looking at the live (lazy deletion: an entry whose hold
    was renewed, released or committed since is skipped)."""

    live: dict[str, tuple[int, float]] = field(default_factory=dict)
    expiries: list[tuple[float, str]] = field(default_factory=list)


@dataclass(slots=True)
class StateTables:
    """Records, counters, counter holds, locks, retry budgets and breakers held in memory.
    Expired budgets and breakers count as absent; :meth:`purge` deletes them through a heap by
    expiry (``lapses``, lazy deletion: an entry whose row was written again since is skipped)."""

    records: dict[str, StateRecord] = field(default_factory=dict)
    budgets: dict[str, BudgetRow] = field(default_factory=dict)
    breakers: dict[str, BreakerRow] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    locks: dict[str, _Lock] = field(default_factory=dict)
    expiries: list[tuple[float, str]] = field(default_factory=list)
    holds: dict[str, _Holds] = field(default_factory=dict)
    lapses: list[tuple[float, bool, str]] = field(default_factory=list)  # (expiry, breaker?, key)
    counter_versions: dict[str, int] = field(default_factory=dict)
    receipts: dict[str, tuple[PlanReceipt, float]] = field(default_factory=dict)  # id -> purge_at
    receipt_lapses: list[tuple[float, str]] = field(default_factory=list)
    secret: bytes = field(default_factory=lambda: os.urandom(32))

    def _set_counter(self, name: str, value: int) -> None:
        """Store a counter's new value and raise its version (the one way a value changes)."""
        self.counters[name] = value
        self.counter_versions[name] = self.counter_versions.get(name, 0) + 1

    def write_record(self, key: str, write: RecordWrite, now: float) -> StateRecord:
        current = self.records.get(key)
        check_write(key, current, write)
        record = applied(key, current, write, now)
        self.records[key] = record
        return record

    def counter(self, name: str, now: float) -> int:
        """A counter's value after giving back the units of its holds that ran out by ``now``."""
        holds = self.holds.get(name)
        if holds is not None:
            while holds.expiries and holds.expiries[0][0] <= now:
                expires_at, token = heapq.heappop(holds.expiries)
                hold = holds.live.get(token)
                if hold is not None and hold[1] == expires_at:
                    del holds.live[token]
                    self._set_counter(name, self.counters.get(name, 0) - hold[0])
            if not holds.live:
                del self.holds[name]
        return self.counters.get(name, 0)

    def add_counter(
        self, name: str, delta: int, low: int | None, high: int | None, now: float
    ) -> int:
        value = self.counter(name, now)
        new = value + delta
        if (low is not None and new < low) or (high is not None and new > high):
            raise LimitReached(name, value, delta, low, high)
        self._set_counter(name, new)
        return new

    def hold(self, name: str, token: str, units: int, high: int, ttl: float, now: float) -> int:
        value = self.counter(name, now)
        holds = self.holds.setdefault(name, _Holds())
        if token in holds.live:
            return value  # a resend of a hold that was made
        new = value + units
        if new > high:
            if not holds.live:
                del self.holds[name]
            raise LimitReached(name, value, units, None, high)
        self._set_counter(name, new)
        holds.live[token] = (units, now + ttl)
        heapq.heappush(holds.expiries, (now + ttl, token))
        return new

    def extend_hold(self, name: str, token: str, ttl: float, now: float) -> bool:
        self.counter(name, now)
        holds = self.holds.get(name)
        if holds is None or token not in holds.live:
            return False
        units, _ = holds.live[token]
        holds.live[token] = (units, now + ttl)
        heapq.heappush(holds.expiries, (now + ttl, token))
        return True

    def end_hold(
        self, name: str, token: str, commit: bool, now: float, settle: int | None = None
    ) -> bool:
        self.counter(name, now)
        holds = self.holds.get(name)
        if holds is None or token not in holds.live:
            return False
        units, _ = holds.live.pop(token)
        kept = 0 if not commit else units if settle is None else settle  # taken for good
        if kept != units:
            self._set_counter(name, self.counters.get(name, 0) - units + kept)
        if not holds.live:
            del self.holds[name]
        return True

    def retry_budget(
        self,
        key: str,
        calls: int,
        retry: bool,
        ratio: float,
        minimum: int,
        ttl: float,
        now: float,
    ) -> BudgetState:
        row, state = budget_step(
            live(self.budgets.get(key), now), now, calls, retry, ratio, minimum, ttl
        )
        if row is not None:
            self.budgets[key] = row
            heapq.heappush(self.lapses, (row.expires_at, False, key))
        return state

    def breaker_admit(self, key: str, trial_for: float, ttl: float, now: float) -> BreakerState:
        row, state = admit_step(live(self.breakers.get(key), now), now, trial_for, ttl)
        if row is not None:
            self.breakers[key] = row
            heapq.heappush(self.lapses, (row.expires_at, True, key))
        return state

    def breaker_record(
        self,
        key: str,
        fence: int,
        ok: bool,
        threshold: int,
        cooldown: float,
        ttl: float,
        now: float,
    ) -> BreakerState:
        current = live(self.breakers.get(key), now)
        row, state = record_step(current, now, fence, ok, threshold, cooldown, ttl)
        if row is not None:
            self.breakers[key] = row
            heapq.heappush(self.lapses, (row.expires_at, True, key))
        return state

    def _held_by(self, name: str, now: float) -> _Lock | None:
        lock = self.locks.get(name)
        if lock is None or lock.owner is None or lock.expires_at <= now:
            return None
        return lock

    def acquire(
        self, names: Sequence[str], owner: str, ttl: float, now: float
    ) -> list[int] | LockBusy:
        for name in names:
            lock = self._held_by(name, now)
            if lock is not None and lock.owner != owner:
                assert lock.owner is not None
                return LockBusy(name, lock.owner, lock.expires_at - now)
        tokens = []
        for name in names:
            lock = self.locks.setdefault(name, _Lock())
            lock.owner = owner
            lock.expires_at = now + ttl
            lock.fence += 1
            heapq.heappush(self.expiries, (lock.expires_at, name))
            tokens.append(lock.fence)
        return tokens

    def extend(self, names: Sequence[str], owner: str, ttl: float, now: float) -> list[str]:
        missing = []
        for name in names:
            lock = self._held_by(name, now)
            if lock is None or lock.owner != owner:
                missing.append(name)
                continue
            lock.expires_at = now + ttl
            heapq.heappush(self.expiries, (lock.expires_at, name))
        return missing

    def release(self, names: Sequence[str], owner: str, now: float) -> list[str]:
        missing = []
        for name in names:
            lock = self._held_by(name, now)
            if lock is None or lock.owner != owner:
                missing.append(name)
                continue
            lock.owner = None
        return missing

    def holders(self, names: Sequence[str], now: float) -> list[tuple[str, float] | None]:
        out: list[tuple[str, float] | None] = []
        for name in names:
            lock = self._held_by(name, now)
            out.append(
                None if lock is None or lock.owner is None else (lock.owner, lock.expires_at)
            )
        return out

    def purge(self, limit: int, now: float) -> int:
        """Delete up to ``limit`` expired budgets and ``limit`` expired breakers."""
        purged = {False: 0, True: 0}
        later: list[tuple[float, bool, str]] = []  # due, of a kind whose batch is full
        while self.lapses and self.lapses[0][0] <= now:
            if purged[False] >= limit and purged[True] >= limit:
                break
            entry = heapq.heappop(self.lapses)
            expires_at, breaker, key = entry
            table: dict[str, BudgetRow] | dict[str, BreakerRow]
            table = self.breakers if breaker else self.budgets
            row = table.get(key)
            if row is None or row.expires_at != expires_at:
                continue  # written again (or deleted) since: a stale entry
            if purged[breaker] >= limit:
                later.append(entry)
                continue
            del table[key]
            purged[breaker] += 1
        for entry in later:
            heapq.heappush(self.lapses, entry)
        receipts = 0
        while self.receipt_lapses and self.receipt_lapses[0][0] <= now and receipts < limit:
            purge_at, plan_id = heapq.heappop(self.receipt_lapses)
            kept = self.receipts.get(plan_id)
            if kept is not None and kept[1] == purge_at:
                del self.receipts[plan_id]
                receipts += 1
        return purged[False] + purged[True] + receipts

    def counter_version(self, name: str, now: float) -> tuple[int, int]:
        value = self.counter(name, now)
        return value, self.counter_versions.get(name, 0)

    def act_plan(
        self,
        plan_id: str,
        reads: Sequence[PlanRead],
        writes: Sequence[PlanWrite],
        approved_by: str,
        keep_for: float,
        not_after: float | None,
        now: float,
    ) -> PlanReceipt | list[StaleRead]:
        kept = self.receipts.get(plan_id)
        if kept is not None and kept[1] > now:
            receipt = kept[0]
            return PlanReceipt(
                receipt.plan_id, False, receipt.approved_by, receipt.approved_at, receipt.versions
            )
        if not_after is not None and not_after <= now:
            raise PlanExpired(plan_id, not_after, now)
        stale: list[StaleRead] = []
        for read in reads:
            if read.kind == "pin":
                raise PlanRefused("this store has no tables of yours to pin", plan_id=plan_id)
            if read.kind == "record":
                record = self.records.get(read.key)
                current = 0 if record is None else record.version
            else:
                current = self.counter_version(read.key, now)[1]
            if current != read.version:
                stale.append(StaleRead(read.kind, read.key, read.version, current))
        if stale:
            return stale
        # Stage every write on copies, each guarded as its own step; apply none until all pass.
        records: dict[str, StateRecord] = {}
        counters: dict[str, tuple[int, int]] = {}  # name -> (value, version)
        versions: list[int] = []
        for write in writes:
            if write.kind == "record":
                assert write.record is not None
                current_record = records.get(write.key, self.records.get(write.key))
                check_write(write.key, current_record, write.record)
                staged = applied(write.key, current_record, write.record, now)
                records[write.key] = staged
                versions.append(staged.version)
            else:
                value, version = counters.get(write.key) or self.counter_version(write.key, now)
                new = value + write.delta
                if (write.low is not None and new < write.low) or (
                    write.high is not None and new > write.high
                ):
                    raise LimitReached(write.key, value, write.delta, write.low, write.high)
                counters[write.key] = (new, version + 1)
                versions.append(version + 1)
        self.records.update(records)
        for name, (value, version) in counters.items():
            self.counters[name] = value
            self.counter_versions[name] = version
        receipt = PlanReceipt(plan_id, True, approved_by, now, tuple(versions))
        purge_at = now + keep_for
        self.receipts[plan_id] = (receipt, purge_at)
        heapq.heappush(self.receipt_lapses, (purge_at, plan_id))
        return receipt

    def sweep(self, limit: int, now: float) -> int:
        swept = 0
        while self.expiries and self.expiries[0][0] <= now and swept < limit:
            expires_at, name = heapq.heappop(self.expiries)
            lock = self.locks.get(name)
            if lock is not None and lock.owner is not None and lock.expires_at == expires_at:
                lock.owner = None
                swept += 1
        return swept


class MemoryState:
    """The ``*_record``, ``*_counter``, ``*_hold``, ``*_locks``, ``retry_budget`` and
    ``breaker_*`` primitives of the memory backend (a base of the backend class), each under the
    backend's lock."""

    if TYPE_CHECKING:
        _lock: threading.RLock
        _clock: Callable[[], float]
        _state: StateTables

    def get_record(self, key: str) -> StateRecord | None:
        with self._lock:
            return self._state.records.get(key)

    def write_record(self, key: str, write: RecordWrite) -> StateRecord:
        with self._lock:
            return self._state.write_record(key, write, self._clock())

    def add_counter(self, name: str, delta: int, low: int | None, high: int | None) -> int:
        with self._lock:
            return self._state.add_counter(name, delta, low, high, self._clock())

    def get_counter(self, name: str) -> int:
        with self._lock:
            return self._state.counter(name, self._clock())

    def hold_counter(self, name: str, token: str, units: int, high: int, ttl: float) -> int:
        with self._lock:
            return self._state.hold(name, token, units, high, ttl, self._clock())

    def extend_hold(self, name: str, token: str, ttl: float) -> bool:
        with self._lock:
            return self._state.extend_hold(name, token, ttl, self._clock())

    def release_hold(self, name: str, token: str) -> bool:
        with self._lock:
            return self._state.end_hold(name, token, False, self._clock())

    def commit_hold(self, name: str, token: str, units: int | None = None) -> bool:
        with self._lock:
            return self._state.end_hold(name, token, True, self._clock(), units)

    def acquire_locks(self, names: Sequence[str], owner: str, ttl: float) -> list[int] | LockBusy:
        with self._lock:
            return self._state.acquire(names, owner, ttl, self._clock())

    def extend_locks(self, names: Sequence[str], owner: str, ttl: float) -> list[str]:
        with self._lock:
            return self._state.extend(names, owner, ttl, self._clock())

    def release_locks(self, names: Sequence[str], owner: str) -> list[str]:
        with self._lock:
            return self._state.release(names, owner, self._clock())

    def lock_holders(self, names: Sequence[str]) -> list[tuple[str, float] | None]:
        with self._lock:
            return self._state.holders(names, self._clock())

    def sweep_locks(self, limit: int) -> int:
        with self._lock:
            return self._state.sweep(limit, self._clock())

    def purge_state(self, limit: int) -> int:
        with self._lock:
            return self._state.purge(limit, self._clock())

    def retry_budget(
        self, key: str, calls: int, retry: bool, ratio: float, minimum: int, ttl: float
    ) -> BudgetState:
        with self._lock:
            return self._state.retry_budget(key, calls, retry, ratio, minimum, ttl, self._clock())

    def breaker_admit(self, key: str, trial_for: float, ttl: float) -> BreakerState:
        with self._lock:
            return self._state.breaker_admit(key, trial_for, ttl, self._clock())

    def breaker_record(
        self, key: str, fence: int, ok: bool, threshold: int, cooldown: float, ttl: float
    ) -> BreakerState:
        with self._lock:
            now = self._clock()
            return self._state.breaker_record(key, fence, ok, threshold, cooldown, ttl, now)

    # -- plans (approval gates): see backends/base.py ---------------------------------------------

    plan_pins = False

    def get_counter_version(self, name: str) -> tuple[int, int]:
        with self._lock:
            return self._state.counter_version(name, self._clock())

    def plan_secret(self) -> bytes:
        with self._lock:
            return self._state.secret

    def act_plan(
        self,
        plan_id: str,
        reads: Sequence[PlanRead],
        writes: Sequence[PlanWrite],
        approved_by: str,
        keep_for: float,
        not_after: float | None,
    ) -> PlanReceipt | list[StaleRead]:
        with self._lock:
            now = self._clock()
            return self._state.act_plan(
                plan_id, reads, writes, approved_by, keep_for, not_after, now
            )
