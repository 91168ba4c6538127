"""The idempotency rows of ``agentlease bench``: ``@idempotent`` around a no-op, beside the raw
store round trip measured in the same run on the same store with the same driver.

A first call of an idempotent action costs two round trips to the store (reserve the key, then
complete it) and a replay one (the reserve finds the stored outcome). Each round calls a
decorated no-op with N new arguments (N first calls), then with the same N again (N replays);
the raw baseline makes the same two passes with one minimal atomic write per key: N new keys
(an insert), then the same N keys again, present now (the write finds the key and changes
nothing, which is all a replay's reserve has to do). The rows report microseconds per call and
each call's cost in raw operations: ideally 2.0 for a first call and 1.0 for a replay. Rounds
alternate library and raw, after an untimed warm-up of both; each side's best round counts.

The raw operation of each store (the drivers of Redis and PostgreSQL are in
:mod:`~agentlease.bench.redis_rows` and :mod:`~agentlease.bench.postgres_rows`):

* memory: ``dict`` insert-if-absent under a :class:`threading.Lock`. There is no round trip,
  so the ratio is the library's own CPU cost per call, in dict inserts.
* SQLite: ``INSERT OR IGNORE`` into the backend's own ``agentlease_keys`` table, in a
  ``BEGIN IMMEDIATE`` ... ``COMMIT`` of its own, through :mod:`sqlite3` on a fresh database file
  beside the library's, with the same schema and PRAGMAs (WAL, the URL's ``synchronous``).
* Redis: ``SET key value NX`` through redis-py's ``execute_command``, as the library sends its
  scripts: a plain command, the least one atomic write costs.
* PostgreSQL: ``INSERT INTO agentlease_keys ... ON CONFLICT DO NOTHING`` on an autocommit
  connection taken from a psycopg pool for each call (as the library does), in a fresh schema
  with the library's tables.

Raw keys are 64 hex digits, like the library's, computed before the timed loop.
"""

from __future__ import annotations

import gc
import hashlib
import sqlite3
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import urlsplit

import click
from rich import box
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from agentlease._codec import JSON
from agentlease._idempotent import idempotent
from agentlease._scope import idempotency_scope
from agentlease._sync.idempotency import Idempotency
from agentlease.backends import connect
from agentlease.backends.base import Backend
from agentlease.bench.loops import ROUNDS, RawSQLite, split, sqlite_synchronous

__all__ = [
    "DEFAULT_CALLS",
    "KeyRow",
    "LibraryKeys",
    "RawKeys",
    "RawMemoryKeys",
    "RawSQLiteKeys",
    "keys_table",
    "local_keys",
    "round_trip_table",
    "run_keys",
]

DEFAULT_CALLS = 3_000
WARM_UP = 20
Phase = Literal["first", "replay"]
Side = Literal["library", "raw"]
PHASES: tuple[Phase, Phase] = ("first", "replay")
SIDES: tuple[Side, Side] = ("library", "raw")


class RawKeys(Protocol):
    """One minimal atomic write per key, straight through the store's driver."""

    #: what the write is, for the rows: ``SET key value NX``, ...
    operation: str

    def put(self, keys: Sequence[str]) -> int:
        """Write each key that is absent, one atomic operation per key; how many were new."""
        ...

    def close(self) -> None:
        """Release the store (and delete what this driver wrote, where it owns a namespace)."""
        ...


def _noop(n: int) -> None:
    """The action: nothing, so that the rows measure only what ``@idempotent`` adds."""


class LibraryKeys:
    """``@idempotent`` around a no-op, on one store.

    Args:
        backend: the store; closed by :meth:`close`.
    """

    def __init__(self, backend: Backend) -> None:
        self.store = Idempotency(backend)
        self.noop = idempotent(tool="bench_noop", store=self.store, step="noop")(_noop)

    def call(self, task: str, count: int) -> int:
        """Call the no-op with arguments ``0 .. count - 1`` in task ``task``; how many calls
        ran it (first calls) rather than replaying."""
        outcome = self.noop.outcome
        first = 0
        with idempotency_scope(task_id=task):
            for n in range(count):
                if not outcome(n).replayed:
                    first += 1
        return first

    def close(self) -> None:
        self.store.close()


class RawMemoryKeys:
    """The memory baseline: a dict insert-if-absent under a lock."""

    operation = "dict insert under a lock"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, bytes] = {}

    def put(self, keys: Sequence[str]) -> int:
        lock, table = self._lock, self._keys
        new = 0
        for key in keys:
            with lock:
                if key not in table:
                    table[key] = b"null"
                    new += 1
        return new

    def close(self) -> None:
        self._keys.clear()


RAW_SQLITE_INSERT = """
INSERT OR IGNORE INTO agentlease_keys
    (key, state, fingerprint, fence, holder, created_at, purge_at)
VALUES (?, 'done', '', 1, '', ?, ?)
"""


class RawSQLiteKeys:
    """The SQLite baseline: ``INSERT OR IGNORE`` in its own ``BEGIN IMMEDIATE`` transaction.

    Args:
        path: a fresh database file; created with the backend's schema and PRAGMAs.
        synchronous: the ``synchronous`` PRAGMA, as the library's URL sets it.
    """

    operation = "INSERT OR IGNORE in BEGIN IMMEDIATE ... COMMIT"

    def __init__(self, path: str, synchronous: str = "NORMAL") -> None:
        self._raw = RawSQLite(path, synchronous)
        self.db: sqlite3.Connection = self._raw.db

    def put(self, keys: Sequence[str]) -> int:
        db, insert = self.db, RAW_SQLITE_INSERT
        new = 0
        for key in keys:
            db.execute("BEGIN IMMEDIATE")
            now = time.time()
            new += db.execute(insert, (key, now, now + 86_400.0)).rowcount
            db.execute("COMMIT")
        return new

    def close(self) -> None:
        self._raw.close()


@dataclass(frozen=True, slots=True)
class KeyRow:
    """One idempotency row: the best round of the library beside the best round of the raw
    operation, per call.

    Attributes:
        phase: ``first`` (N new keys) or ``replay`` (the same N keys again).
        backend: the store kind (``sqlite``, ``memory``, ``redis``, ``postgresql``).
        operation: the raw operation (see the module's docstring).
        sizes: calls in each round (each side made as many).
        seconds: the library's seconds per call, each round.
        baseline_seconds: the raw operation's seconds per call, each round.
    """

    phase: Phase
    backend: str
    operation: str
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    baseline_seconds: tuple[float, ...]

    @property
    def name(self) -> str:
        """The row's name."""
        if self.phase == "first":
            return "idempotent no-op, first call (reserve + complete)"
        return "idempotent no-op, replay (reserve)"

    @property
    def baseline(self) -> str:
        """What the raw side did, in words."""
        return f"{self.operation}, {'new key' if self.phase == 'first' else 'key present'}"

    @property
    def ideal(self) -> float:
        """The round trips a call needs: 2 for a first call, 1 for a replay."""
        return 2.0 if self.phase == "first" else 1.0

    @property
    def us_per_call(self) -> float:
        """Microseconds per call through the library, in its best round."""
        return min(self.seconds) * 1e6

    @property
    def baseline_us_per_call(self) -> float:
        """Microseconds per raw operation, in its best round."""
        return min(self.baseline_seconds) * 1e6

    @property
    def round_trips(self) -> float:
        """A call's cost in raw operations (ideally :attr:`ideal`)."""
        return self.us_per_call / self.baseline_us_per_call

    def as_json(self) -> dict[str, JSON]:
        """The row as ``--json`` prints it; ``ratio`` is ``ops_per_s / baseline_ops_per_s`` as
        in every row (so the reciprocal of ``round_trips``)."""
        us, base = self.us_per_call, self.baseline_us_per_call
        ops, base_ops = round(1e6 / us, 1), round(1e6 / base, 1)
        return {
            "name": self.name,
            "backend": self.backend,
            "mode": "idempotent",
            "phase": self.phase,
            "calls": sum(self.sizes),
            "rounds": len(self.sizes),
            "baseline": self.baseline,
            "us_per_call": round(us, 3),
            "baseline_us_per_call": round(base, 3),
            "round_trips": round(us / base, 3),
            "ideal_round_trips": self.ideal,
            "ops_per_s": ops,
            "baseline_ops_per_s": base_ops,
            "ratio": round(ops / base_ops, 3),
        }


def _raw_keys(task: str, count: int) -> list[str]:
    """``count`` keys shaped like the library's (hex SHA-256), distinct per ``task``."""
    return [hashlib.sha256(f"{task}/{n}".encode()).hexdigest() for n in range(count)]


def _timed(
    side: Side, library: LibraryKeys, raw: RawKeys, task: str, count: int, expected: int
) -> float:
    """One timed pass of ``count`` calls; seconds per call. Checks that the pass did what the
    row says: on new keys every call is a first call, on present keys none is."""
    keys = _raw_keys(task, count) if side == "raw" else []
    gc.collect()
    start = time.perf_counter()
    new = library.call(task, count) if side == "library" else raw.put(keys)
    seconds = time.perf_counter() - start
    if new != expected:
        what = "first calls" if side == "library" else "new keys"
        raise click.ClickException(f"idempotency bench ({side}): {new} {what}, not {expected}")
    return max(seconds, 1e-9) / count


def run_keys(
    kind: str,
    library: LibraryKeys,
    raw: RawKeys,
    calls: int,
    *,
    rounds: int = ROUNDS,
    progress: Progress | None = None,
) -> list[KeyRow]:
    """Measure first calls and replays through the library beside the raw operation, in
    alternating rounds (library, raw, raw, library, ...).

    Returns:
        Two rows: ``first`` and ``replay``.
    """
    run = uuid.uuid4().hex[:8]
    for side in SIDES:  # untimed: connections, pools, prepared statements, scripts
        for expected in (WARM_UP, 0):
            _timed(side, library, raw, f"bench-keys-{run}-warm", WARM_UP, expected)
    sizes = split(calls, rounds)
    bar = None if progress is None else progress.add_task("keys", total=2 * len(sizes))
    seconds: dict[tuple[Side, Phase], list[float]] = {
        (side, phase): [] for side in SIDES for phase in PHASES
    }
    for index, size in enumerate(sizes):
        sides = SIDES if index % 2 == 0 else SIDES[::-1]
        for side in sides:
            if progress is not None and bar is not None:
                progress.update(bar, description=f"idempotent no-op ({side})")
                progress.refresh()
            task = f"bench-keys-{run}-{index}"
            for phase in PHASES:  # the same keys twice: new, then present
                expected = size if phase == "first" else 0
                seconds[(side, phase)].append(_timed(side, library, raw, task, size, expected))
            if progress is not None and bar is not None:
                progress.advance(bar)
                progress.refresh()
    return [
        KeyRow(
            phase,
            kind,
            raw.operation,
            sizes,
            tuple(seconds[("library", phase)]),
            tuple(seconds[("raw", phase)]),
        )
        for phase in PHASES
    ]


def local_keys(url: str, scratch: Path, calls: int, progress: Progress | None) -> list[KeyRow]:
    """The rows on a SQLite or memory store: the library on ``url``, the raw baseline on a
    fresh database file in ``scratch`` (SQLite) or a dict (memory)."""
    kind = urlsplit(url).scheme.lower()
    library = LibraryKeys(connect(url))
    try:
        raw: RawKeys
        if kind == "sqlite":
            raw = RawSQLiteKeys(str(scratch / "raw-keys.db"), sqlite_synchronous(url))
        else:
            raw = RawMemoryKeys()
        try:
            return run_keys(kind, library, raw, calls, progress=progress)
        finally:
            raw.close()
    finally:
        library.close()


def round_trip_table(
    title: str, rows: list[tuple[str, int, float, float, float, float]], caption: str
) -> Table:
    """A table of rows measured in raw round trips: (label, calls, library µs per call, raw µs
    per operation, raw operations per call, the ideal number)."""
    from agentlease.cli._app import new_table

    table = new_table(title=escape(title), box=box.SIMPLE_HEAD, caption=escape(caption) or None)
    table.add_column("row", style="bold", no_wrap=True)
    table.add_column("calls", justify="right")
    table.add_column("library µs/call", justify="right", style="cyan")
    table.add_column("raw µs/op", justify="right")
    table.add_column("raw ops/call", justify="right")
    table.add_column("ideal", justify="right")
    for label, calls, us, raw_us, round_trips, ideal in rows:
        # Within a quarter of the round trips the design needs (memory has no round trip).
        style = "green" if round_trips <= 1.25 * ideal else "yellow"
        table.add_row(
            label,
            str(calls),
            f"{us:,.1f}",
            f"{raw_us:,.2f}",
            f"[{style}]{round_trips:.2f}[/]",
            f"{ideal:.0f}",
        )
    return table


def keys_table(rows: list[KeyRow], url: str) -> Table:
    """The rows as the ``bench`` command prints them."""
    caption = ""
    if rows:
        caption = f"raw op: {rows[0].operation}, on a new key beside first calls, on the same"
        caption += " key again beside replays"
        if rows[0].backend == "memory":
            caption += "; memory has no round trip: raw ops/call is the library's CPU cost"
    cells = [
        (
            "first call" if r.phase == "first" else "replay",
            sum(r.sizes),
            r.us_per_call,
            r.baseline_us_per_call,
            r.round_trips,
            r.ideal,
        )
        for r in rows
    ]
    return round_trip_table(f"@idempotent around a no-op on {url}", cells, caption)
