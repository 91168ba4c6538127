"""The shared-state guard rows of ``agentlease bench``: ``SharedState.compare_and_set``, the same
write through retry, budget and breaker or as an approved plan, and a lock set of one, acquired
and released, beside the raw store round trip measured in the same run on
the same store with the same driver.

* **compare_and_set**: each round creates N records at version 1 (untimed), then times N calls of
  ``compare_and_set(key_i, 1, {"n": i})``: every call has the right version, so none conflicts.
  Ideally one round trip (the check and the write are one atomic step). The raw side creates as
  many rows and times one atomic conditional write per row, version 1 to 2.
* **retry + budget + breaker call**: the raw side's conditional write, each call through
  ``al.retry(on=BackendUnavailable, attempts=3, budget=..., breaker=...)`` with a
  :class:`~agentlease.RetryBudget` and a :class:`~agentlease.CircuitBreaker` kept in the same
  store, on the healthy path (circuit closed, no retry): what guarding a call costs, in raw
  operations per call beside the one raw round trip it makes (ideally 1; the target is 1.3). The
  breaker's state is cached for its staleness (1 s) and the budget counts calls locally and
  sends them every ``flush_every`` (100) calls, so most calls add no round trip.
* **plan approval**: each round creates N records at version 1 and seals, for each, a plan that
  read it and sets one field (untimed: planning reads the store), then times N calls of
  ``state.act(sealed, approved_by=...)``: the JSON parsed, its MAC checked, the read's version
  compared, the write applied and the receipt kept, in one atomic step. Ideally one round trip
  (the plan secret is read once per client); the raw side is the same conditional write as the
  compare_and_set row's.
* **lock acquire + release**: N cycles of ``with state.locks([name], timeout=5): pass`` on one
  lock name per round. Ideally two round trips (acquire, release); the library also starts and
  stops the lock set's renewal thread each time. The raw side runs N cycles of one owner-checked
  conditional acquire and one owner-checked release, two atomic operations: its microseconds per
  operation are half a cycle's.

The rows report microseconds per call and each call's cost in raw operations (ideally 1 and 2).
Rounds alternate library and raw, after an untimed warm-up of both; each side's best round counts.

The raw operations of each store (those of Redis and PostgreSQL are in
:mod:`~agentlease.bench.redis_rows` and :mod:`~agentlease.bench.postgres_rows`):

* memory: a version check and a ``dict`` write under a :class:`threading.Lock`; a lock is a
  ``dict`` entry (owner, expiry) taken if absent or expired, with a fence count, and removed if
  the owner matches. No round trip: the ratio is the library's own CPU cost, in dict writes.
* SQLite: through :mod:`sqlite3` on a fresh database file beside the library's, with the same
  schema and PRAGMAs (WAL, the URL's ``synchronous``), each statement in a ``BEGIN IMMEDIATE``
  ... ``COMMIT`` of its own: ``UPDATE ... SET version = version + 1, value = ? WHERE key = ? AND
  version = ?`` on a table of (key, version, value); for a lock, ``INSERT ... ON CONFLICT DO
  UPDATE ... WHERE`` free (owner, expiry, fence + 1) into the backend's ``agentlease_locks``,
  then ``UPDATE ... SET owner = NULL`` where the owner matches.
* Redis: a three-line script (``HGET`` the version, ``HSET`` version and value if it matches)
  sent by ``EVALSHA``, the least one atomic conditional write costs on Redis (``WATCH`` ...
  ``EXEC`` takes several round trips); for a lock ``SET key owner NX PX``, then the usual
  owner-checked release script (``GET``, ``DEL`` if it matches).
* PostgreSQL: the same statements as SQLite's, each on an autocommit connection taken from a
  psycopg pool for the call (as the library does), in a fresh schema with the library's tables.
"""

from __future__ import annotations

import gc
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import urlsplit

import click
import orjson
from rich.progress import Progress
from rich.table import Table

from agentlease._codec import JSON
from agentlease._retry import retry
from agentlease._sync.budgets import CircuitBreaker, RetryBudget
from agentlease._sync.state import SharedState
from agentlease.backends import connect
from agentlease.backends.base import Backend
from agentlease.bench.keys import round_trip_table
from agentlease.bench.loops import ROUNDS, RawSQLite, split, sqlite_synchronous
from agentlease.errors import BackendUnavailable

__all__ = [
    "DEFAULT_GUARDS",
    "GuardRow",
    "LibraryGuards",
    "RawGuards",
    "RawMemoryGuards",
    "RawSQLiteGuards",
    "guards_table",
    "local_guards",
    "run_guards",
]

DEFAULT_GUARDS = 3_000
WARM_UP = 20
LOCK_TTL = 30.0  # the library's default ttl, which the library rows run with
LOCK_TIMEOUT = 5.0
Guard = Literal["compare_and_set", "guarded", "plan", "lock"]
Side = Literal["library", "raw"]
GUARDS: tuple[Guard, ...] = ("compare_and_set", "guarded", "plan", "lock")
SIDES: tuple[Side, Side] = ("library", "raw")
#: Raw atomic operations in one call of each row: a conditional write (bare, through retry,
#: retry budget and circuit breaker, or as an approved plan); an acquire and a release.
RAW_OPS: dict[Guard, int] = {"compare_and_set": 1, "guarded": 1, "plan": 1, "lock": 2}


class RawGuards(Protocol):
    """The raw side of the guard rows, straight through the store's driver."""

    #: what the conditional write is, for the rows
    cas_operation: str
    #: what a lock's acquire and release are, for the rows
    lock_operation: str

    def create(self, keys: Sequence[str]) -> None:
        """Create a row for each key at version 1 (not timed)."""
        ...

    def compare_and_set(self, keys: Sequence[str], values: Sequence[bytes]) -> int:
        """One atomic write per key of its value, if the key is still at version 1 (it becomes
        2); how many were written."""
        ...

    def lock_cycles(self, name: str, owner: str, count: int) -> int:
        """Acquire and release lock ``name`` for ``owner`` ``count`` times, one atomic operation
        each; how many acquisitions succeeded."""
        ...

    def close(self) -> None:
        """Release the store (and delete what this driver wrote, where it owns a namespace)."""
        ...


class LibraryGuards:
    """:class:`~agentlease.SharedState` on one store.

    Args:
        backend: the store; closed by :meth:`close`.
    """

    def __init__(self, backend: Backend) -> None:
        self.state = SharedState(backend)
        run = uuid.uuid4().hex[:8]
        self._budget = RetryBudget(self.state, scope=f"bench-guards-{run}")
        self._breaker = CircuitBreaker(self.state, f"bench-guards-{run}")
        self._sealed: dict[str, str] = {}

    def create(self, keys: Sequence[str]) -> None:
        cas = self.state.compare_and_set
        for key in keys:
            cas(key, 0, {"n": -1})

    def seal_plans(self, keys: Sequence[str]) -> None:
        """For each key (created at version 1), a sealed plan that read it and sets its ``n``
        (not timed: planning reads the store; the row times the approval)."""
        state = self.state
        for n, key in enumerate(keys):
            with state.plan(step=key) as plan:
                state.get(key)
                plan.set_field(key, "n", n)
            self._sealed[key] = plan.seal()

    def plans(self, keys: Sequence[str]) -> int:
        """Approve each key's sealed plan: the MAC checked, the read's version compared and the
        write applied in one atomic step; how many acted."""
        act = self.state.act
        acted = 0
        for key in keys:
            if act(self._sealed.pop(key), approved_by="bench").first:
                acted += 1
        return acted

    def compare_and_set(self, keys: Sequence[str]) -> int:
        """``compare_and_set(key_i, 1, {"n": i})`` for each key; how many reached version 2."""
        cas = self.state.compare_and_set
        written = 0
        for n, key in enumerate(keys):
            if cas(key, 1, {"n": n}) == 2:
                written += 1
        return written

    def guarded(self, raw: RawGuards, keys: Sequence[str], values: Sequence[bytes]) -> int:
        """The raw side's conditional write of each key, each call through ``al.retry`` with a
        retry budget and a circuit breaker kept in this store (closed, no retry: the healthy
        path), so the row is the guards' own cost beside one raw round trip."""
        call = retry(on=BackendUnavailable, attempts=3, budget=self._budget, breaker=self._breaker)(
            raw.compare_and_set
        )
        written = 0
        for key, value in zip(keys, values, strict=True):
            written += call((key,), (value,))
        return written

    def lock_cycles(self, name: str, count: int) -> int:
        """Enter and leave a lock set of ``name`` ``count`` times; how many were held."""
        locks = self.state.locks
        held = 0
        for _ in range(count):
            with locks((name,), timeout=LOCK_TIMEOUT, ttl=LOCK_TTL) as lock_set:
                held += len(lock_set.tokens)
        return held

    def close(self) -> None:
        self.state.close()


class RawMemoryGuards:
    """The memory baseline: dict writes under a lock."""

    cas_operation = "version check + dict write under a lock"
    lock_operation = "dict insert if free, dict delete if owner, each under a lock"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, tuple[int, bytes]] = {}
        self._owners: dict[str, tuple[str, float]] = {}
        self._fences: dict[str, int] = {}

    def create(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._records[key] = (1, b"{}")

    def compare_and_set(self, keys: Sequence[str], values: Sequence[bytes]) -> int:
        lock, records = self._lock, self._records
        written = 0
        for key, value in zip(keys, values, strict=True):
            with lock:
                if records[key][0] == 1:
                    records[key] = (2, value)
                    written += 1
        return written

    def lock_cycles(self, name: str, owner: str, count: int) -> int:
        lock, owners, fences = self._lock, self._owners, self._fences
        acquired = 0
        for _ in range(count):
            with lock:
                now = time.monotonic()
                held = owners.get(name)
                if held is None or held[1] <= now:
                    owners[name] = (owner, now + LOCK_TTL)
                    fences[name] = fences.get(name, 0) + 1
                    acquired += 1
            with lock:
                held = owners.get(name)
                if held is not None and held[0] == owner:
                    del owners[name]
        return acquired

    def close(self) -> None:
        self._records.clear()
        self._owners.clear()


RAW_RECORDS = """
CREATE TABLE IF NOT EXISTS bench_records (
    key TEXT PRIMARY KEY, version INTEGER NOT NULL, value BLOB NOT NULL
) WITHOUT ROWID
"""
RAW_SQLITE_CREATE = "INSERT INTO bench_records (key, version, value) VALUES (?, 1, x'7b7d')"
RAW_SQLITE_CAS = (
    "UPDATE bench_records SET version = version + 1, value = ? WHERE key = ? AND version = ?"
)
RAW_SQLITE_ACQUIRE = """
INSERT INTO agentlease_locks AS l (name, owner, expires_at, fence) VALUES (?1, ?2, ?3 + ?4, 1)
ON CONFLICT (name) DO UPDATE
SET owner = excluded.owner, expires_at = excluded.expires_at, fence = l.fence + 1
WHERE l.owner IS NULL OR l.expires_at <= ?3
RETURNING fence
"""
RAW_SQLITE_RELEASE = """
UPDATE agentlease_locks SET owner = NULL, expires_at = NULL
WHERE name = ? AND owner = ? AND expires_at > ?
"""


class RawSQLiteGuards:
    """The SQLite baseline: one statement in its own ``BEGIN IMMEDIATE`` transaction per
    operation.

    Args:
        path: a fresh database file; created with the backend's schema and PRAGMAs.
        synchronous: the ``synchronous`` PRAGMA, as the library's URL sets it.
    """

    cas_operation = "UPDATE ... WHERE key = ? AND version = ? in BEGIN IMMEDIATE ... COMMIT"
    lock_operation = "INSERT ... ON CONFLICT DO UPDATE WHERE free, UPDATE ... WHERE owner = ?"

    def __init__(self, path: str, synchronous: str = "NORMAL") -> None:
        self._raw = RawSQLite(path, synchronous)
        self.db = self._raw.db
        self.db.execute(RAW_RECORDS)

    def create(self, keys: Sequence[str]) -> None:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        db.executemany(RAW_SQLITE_CREATE, [(key,) for key in keys])
        db.execute("COMMIT")

    def compare_and_set(self, keys: Sequence[str], values: Sequence[bytes]) -> int:
        db, update = self.db, RAW_SQLITE_CAS
        written = 0
        for key, value in zip(keys, values, strict=True):
            db.execute("BEGIN IMMEDIATE")
            written += db.execute(update, (value, key, 1)).rowcount
            db.execute("COMMIT")
        return written

    def lock_cycles(self, name: str, owner: str, count: int) -> int:
        db, acquire, release = self.db, RAW_SQLITE_ACQUIRE, RAW_SQLITE_RELEASE
        acquired = 0
        for _ in range(count):
            db.execute("BEGIN IMMEDIATE")
            if db.execute(acquire, (name, owner, time.time(), LOCK_TTL)).fetchone() is not None:
                acquired += 1
            db.execute("COMMIT")
            db.execute("BEGIN IMMEDIATE")
            db.execute(release, (name, owner, time.time()))
            db.execute("COMMIT")
        return acquired

    def close(self) -> None:
        self._raw.close()


@dataclass(frozen=True, slots=True)
class GuardRow:
    """One guard row: the best round of the library beside the best round of the raw
    operations.

    Attributes:
        guard: ``compare_and_set`` or ``lock`` (acquire + release).
        backend: the store kind (``sqlite``, ``memory``, ``redis``, ``postgresql``).
        operation: the raw operation(s) (see the module's docstring).
        sizes: calls in each round (each side made as many).
        seconds: the library's seconds per call, each round.
        baseline_seconds: the raw side's seconds per atomic operation, each round.
    """

    guard: Guard
    backend: str
    operation: str
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    baseline_seconds: tuple[float, ...]

    @property
    def name(self) -> str:
        """The row's name."""
        return {
            "compare_and_set": "compare_and_set, right version",
            "guarded": "compare_and_set through retry + retry budget + circuit breaker",
            "plan": "approve a sealed plan (1 read checked, 1 field written)",
            "lock": "lock set of one, acquire + release",
        }[self.guard]

    @property
    def label(self) -> str:
        """The row's name in the table."""
        return {
            "compare_and_set": "compare_and_set",
            "guarded": "retry+budget+breaker call",
            "plan": "plan approval",
            "lock": "lock acquire+release",
        }[self.guard]

    @property
    def ideal(self) -> float:
        """The round trips a call needs: 1 for a compare-and-set (bare, guarded or an approved
        plan), 2 for a lock cycle."""
        return float(RAW_OPS[self.guard])

    @property
    def us_per_call(self) -> float:
        """Microseconds per call through the library, in its best round."""
        return min(self.seconds) * 1e6

    @property
    def baseline_us_per_op(self) -> float:
        """Microseconds per raw atomic operation, in its best round."""
        return min(self.baseline_seconds) * 1e6

    @property
    def round_trips(self) -> float:
        """A call's cost in raw operations (ideally :attr:`ideal`)."""
        return self.us_per_call / self.baseline_us_per_op

    def as_json(self) -> dict[str, JSON]:
        """The row as ``--json`` prints it; ``ratio`` is ``ops_per_s / baseline_ops_per_s`` as
        in every row (calls per second over raw operations per second: 1 / ``round_trips``)."""
        us, base = self.us_per_call, self.baseline_us_per_op
        ops, base_ops = round(1e6 / us, 1), round(1e6 / base, 1)
        return {
            "name": self.name,
            "backend": self.backend,
            "mode": "guard",
            "guard": self.guard,
            "calls": sum(self.sizes),
            "rounds": len(self.sizes),
            "baseline": self.operation,
            "us_per_call": round(us, 3),
            "baseline_us_per_op": round(base, 3),
            "round_trips": round(us / base, 3),
            "ideal_round_trips": self.ideal,
            "ops_per_s": ops,
            "baseline_ops_per_s": base_ops,
            "ratio": round(ops / base_ops, 3),
        }


def _timed(
    side: Side, guard: Guard, library: LibraryGuards, raw: RawGuards, task: str, count: int
) -> float:
    """One timed pass of ``count`` calls (records created untimed first); seconds per call on
    the library's side, per atomic operation on the raw side. Checks that every call did what
    the row says: each write found its version, each lock was free."""
    keys = [f"{task}.{n}" for n in range(count)] if guard != "lock" else []
    on_raw = side == "raw" or guard == "guarded"  # the guarded row guards the raw write
    values = [orjson.dumps({"n": n}) for n in range(count)] if on_raw and keys else []
    if keys:
        (raw.create if on_raw else library.create)(keys)
    if guard == "plan" and side == "library":
        library.seal_plans(keys)
    owner = f"bench:{task}"
    gc.collect()
    start = time.perf_counter()
    if guard != "lock":
        if side == "raw":
            done = raw.compare_and_set(keys, values)
        elif guard == "guarded":
            done = library.guarded(raw, keys, values)
        elif guard == "plan":
            done = library.plans(keys)
        else:
            done = library.compare_and_set(keys)
    else:
        done = (
            library.lock_cycles(task, count)
            if side == "library"
            else raw.lock_cycles(task, owner, count)
        )
    seconds = time.perf_counter() - start
    if done != count:
        raise click.ClickException(f"{guard} bench ({side}): {done} of {count} calls went through")
    return max(seconds, 1e-9) / count / (1 if side == "library" else RAW_OPS[guard])


def run_guards(
    kind: str,
    library: LibraryGuards,
    raw: RawGuards,
    calls: int,
    *,
    rounds: int = ROUNDS,
    progress: Progress | None = None,
) -> list[GuardRow]:
    """Measure both guard rows through the library beside the raw operations, in alternating
    rounds (library, raw, raw, library, ...).

    Returns:
        Four rows: ``compare_and_set``, ``guarded``, ``plan`` and ``lock``.
    """
    run = uuid.uuid4().hex[:8]
    for guard in GUARDS:  # untimed: connections, pools, prepared statements, scripts, threads
        for side in SIDES:
            _timed(side, guard, library, raw, f"bench-guards-{run}-warm-{guard}-{side}", WARM_UP)
    sizes = split(calls, rounds)
    bar = None if progress is None else progress.add_task("guards", total=8 * len(sizes))
    seconds: dict[tuple[Side, Guard], list[float]] = {
        (side, guard): [] for side in SIDES for guard in GUARDS
    }
    for guard in GUARDS:
        for index, size in enumerate(sizes):
            for side in SIDES if index % 2 == 0 else SIDES[::-1]:
                if progress is not None and bar is not None:
                    progress.update(bar, description=f"{guard} ({side})")
                    progress.refresh()
                task = f"bench-guards-{run}-{guard}-{index}-{side}"
                seconds[(side, guard)].append(_timed(side, guard, library, raw, task, size))
                if progress is not None and bar is not None:
                    progress.advance(bar)
                    progress.refresh()
    operations = {
        "compare_and_set": raw.cas_operation,
        "guarded": raw.cas_operation,
        "plan": raw.cas_operation,
        "lock": raw.lock_operation,
    }
    return [
        GuardRow(
            guard,
            kind,
            operations[guard],
            sizes,
            tuple(seconds[("library", guard)]),
            tuple(seconds[("raw", guard)]),
        )
        for guard in GUARDS
    ]


def local_guards(url: str, scratch: Path, calls: int, progress: Progress | None) -> list[GuardRow]:
    """The rows on a SQLite or memory store: the library on ``url``, the raw side on a fresh
    database file in ``scratch`` (SQLite) or dicts (memory)."""
    kind = urlsplit(url).scheme.lower()
    library = LibraryGuards(connect(url))
    try:
        raw: RawGuards
        if kind == "sqlite":
            raw = RawSQLiteGuards(str(scratch / "raw-guards.db"), sqlite_synchronous(url))
        else:
            raw = RawMemoryGuards()
        try:
            return run_guards(kind, library, raw, calls, progress=progress)
        finally:
            raw.close()
    finally:
        library.close()


def guards_table(rows: list[GuardRow], url: str) -> Table:
    """The rows as the ``bench`` command prints them."""
    lines = [f"{r.label}: {r.operation}" for r in rows]
    if rows and rows[0].backend == "memory":
        lines.append("memory has no round trip: raw ops/call is the library's CPU cost")
    cells = [
        (r.label, sum(r.sizes), r.us_per_call, r.baseline_us_per_op, r.round_trips, r.ideal)
        for r in rows
    ]
    return round_trip_table(f"shared-state guards on {url}", cells, "\n".join(lines))
