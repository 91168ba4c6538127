"""The ``bench`` command: claim and complete throughput, and the cost of ``@idempotent`` and of the
shared-state guards, through the library, each row beside a raw baseline measured in the same run
on the same kind of store with the same driver.

Each throughput row drains ``--tasks`` freshly enqueued tasks in three rounds that alternate with
its baseline's, and reports each side's best round; only the claim/complete loops are timed. Rows:

* claim+complete, batching off: ``claim(n=1)`` then ``complete``, one task at a time;
* claim+complete, batch B: ``claim(n=B)`` then ``complete`` each;
* claim+complete, K workers: K processes (threads for memory://) each running the batching-off
  loop on one queue, started together; throughput is all tasks over the wall time;
* claim only, one by one and batch B: the claim rate alone, to compare batch with one-by-one.

Then the worker row (``--worker-tasks``, 0 to skip; see :mod:`agentlease.bench.workers`):
``--worker-processes`` real ``agentlease worker --burst`` processes with a no-op handler, timed
from the first completion to the last (and end to end, start-up included), beside as many
processes of the raw one-task claim + complete loop. Not on memory:// (one process's store).

The baseline of a SQLite row issues the backend's own statements from ``sql/sqlite.sql`` straight
through :mod:`sqlite3` on a fresh database with the same schema and PRAGMAs, in the same loop
shape; the baseline of a memory row calls the :class:`~agentlease.MemoryBackend` primitives
without the client. See :mod:`agentlease.bench.loops`.

Then two idempotency rows (``--keys`` calls each, 0 to skip), in microseconds per call and in
raw operations per call (see :mod:`agentlease.bench.keys`):

* idempotent no-op, first call: ``@idempotent`` around a function that does nothing, with new
  arguments (reserve + complete: ideally 2 raw round trips), beside one minimal atomic write of
  a new key on the same store with the same driver;
* idempotent no-op, replay: the same calls again (one reserve that finds the outcome: ideally
  1), beside the same write of a key that is present.

Then four shared-state guard rows (``--guards`` calls each, 0 to skip; see
:mod:`agentlease.bench.guards`), in the same units:

* compare_and_set, right version: :meth:`~agentlease.SharedState.compare_and_set` over an
  existing record (ideally 1), beside one atomic version-checked write;
* retry + budget + breaker call: that raw write, each call through ``al.retry`` with a retry
  budget and a circuit breaker kept in the store, on the healthy path (ideally 1; target 1.3);
* plan approval: ``state.act(sealed, approved_by=...)`` of a plan that read one record and
  sets one field (sealed untimed), beside that raw write (ideally 1);
* lock set of one, acquire + release: ``with state.locks([name], timeout=5): pass`` (ideally
  2), beside an owner-checked conditional acquire and an owner-checked release.

On Redis and PostgreSQL the rows are measured by each backend's own module in fresh namespaces
(see :mod:`agentlease.bench.served`), with latency lines under ``--latency``.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import click
from rich import box
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentlease._codec import JSON
from agentlease._redact import redact_url
from agentlease.backends import connect
from agentlease.backends.memory import MemoryBackend
from agentlease.bench import served as _bench_served
from agentlease.bench.guards import DEFAULT_GUARDS, GuardRow, guards_table, local_guards
from agentlease.bench.keys import DEFAULT_CALLS, KeyRow, keys_table, local_keys
from agentlease.bench.loops import (
    ROUNDS,
    Driver,
    Library,
    Mode,
    RawMemory,
    RawSQLite,
    Target,
    drain_together,
    split,
    sqlite_synchronous,
)
from agentlease.bench.workers import (
    DEFAULT_CONCURRENCY,
    DEFAULT_PROCESSES,
    DEFAULT_WORKER_TASKS,
    WorkerRow,
    run_workers,
    served_workers,
    workers_table,
)
from agentlease.cli._app import cli, console, err_console, new_table, reports_errors
from agentlease.cli.admin import print_json
from agentlease.errors import InvalidURL

__all__ = ["Case", "Row", "run_bench"]

DEFAULT_TASKS = 30_000
Side = Literal["library", "raw"]


@dataclass(frozen=True, slots=True)
class Case:
    """One row to measure."""

    name: str
    mode: Mode
    batch: int = 1
    workers: int = 1
    together: bool = False  # several workers (processes, or threads for memory) at once


@dataclass(frozen=True, slots=True)
class Row:
    """One measured row: the best round of the library beside the best round of the baseline.

    Attributes:
        case: what was measured.
        backend: the store kind (``sqlite``, ``memory``).
        tasks: tasks each side drained, over all rounds.
        seconds: the library's timed seconds per round.
        baseline_seconds: the baseline's timed seconds per round.
        sizes: tasks drained in each round (the library's and the baseline's rounds alternate).
    """

    case: Case
    backend: str
    tasks: int
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    baseline_seconds: tuple[float, ...]

    @property
    def ops_per_s(self) -> float:
        """Tasks per second through the library, in its best round."""
        return max(n / s for n, s in zip(self.sizes, self.seconds, strict=True))

    @property
    def baseline_ops_per_s(self) -> float:
        """Tasks per second of the raw baseline, in its best round."""
        return max(n / s for n, s in zip(self.sizes, self.baseline_seconds, strict=True))

    def as_json(self) -> dict[str, JSON]:
        """The row as ``--json`` prints it."""
        ops, base = round(self.ops_per_s, 1), round(self.baseline_ops_per_s, 1)
        return {
            "name": self.case.name,
            "backend": self.backend,
            "mode": self.case.mode,
            "tasks": self.tasks,
            "rounds": len(self.sizes),
            "batch": self.case.batch,
            "workers": self.case.workers,
            "ops_per_s": ops,
            "baseline_ops_per_s": base,
            "ratio": round(ops / base, 3),
        }


class Stores:
    """The library's store (the ``--backend`` URL) and the raw baseline's fresh store of the same
    kind, plus how worker processes open each of them."""

    def __init__(self, url: str, scratch: Path) -> None:
        self.kind = urlsplit(url).scheme.lower()
        self.targets: tuple[Target, Target] | None = None
        self.library = Library(connect(url))  # validates the URL
        try:
            self.raw = self._raw(url, scratch)
        except BaseException:
            self.library.close()
            raise

    def _raw(self, url: str, scratch: Path) -> Driver:
        if self.kind == "memory":
            return RawMemory(MemoryBackend())
        if self.kind == "sqlite":
            synchronous = sqlite_synchronous(url)
            raw_path = str(scratch / "raw.db")
            self.targets = (Target("library", url), Target("raw", raw_path, synchronous))
            return RawSQLite(raw_path, synchronous)
        raise InvalidURL(f"bench runs on sqlite:// and memory:// stores, not {redact_url(url)!r}")

    def driver(self, side: Side) -> Driver:
        """The in-process driver of one side."""
        return self.library if side == "library" else self.raw

    def close(self) -> None:
        """Close both stores."""
        self.library.close()
        self.raw.close()


def cases(processes: int, batch: int, kind: str) -> list[Case]:
    """The rows of one run, in order."""
    singular, plural = ("thread", "threads") if kind == "memory" else ("process", "processes")
    unit = singular if processes == 1 else plural
    return [
        Case("claim+complete, batching off", "claim_complete"),
        Case(f"claim+complete, batch {batch}", "claim_complete", batch=batch),
        Case(
            f"claim+complete, {processes} {unit}",
            "claim_complete",
            workers=processes,
            together=True,
        ),
        Case("claim only, one by one", "claim_only"),
        Case(f"claim only, batch {batch}", "claim_only", batch=batch),
    ]


def _measure(stores: Stores, side: Side, case: Case, queue: str, tasks: int) -> float:
    """Fill ``queue`` on one side (untimed), then time draining it; returns seconds."""
    driver = stores.driver(side)
    driver.fill(queue, tasks)
    gc.collect()
    if not case.together:
        start = time.perf_counter()
        claimed = driver.drain(queue, case.batch, case.mode)
        seconds = time.perf_counter() - start
    elif stores.targets is None:
        claimed, seconds = drain_together(case.workers, queue, shared=driver)
    else:
        target = stores.targets[0 if side == "library" else 1]
        claimed, seconds = drain_together(case.workers, queue, target=target)
    if claimed != tasks:
        raise click.ClickException(f"{case.name} ({side}) claimed {claimed} of {tasks} tasks")
    return max(seconds, 1e-9)


def run_bench(
    stores: Stores,
    plan: list[Case],
    tasks: int,
    *,
    rounds: int = ROUNDS,
    progress: Progress | None = None,
) -> list[Row]:
    """Measure every case on both sides in alternating rounds (library, raw, raw, library, ...),
    so a slow drift of the machine favours neither; each side's best round counts, as the one
    least disturbed by other processes."""
    run = uuid.uuid4().hex[:8]
    sizes = split(tasks, rounds)
    bar = None if progress is None else progress.add_task("bench", total=2 * len(plan) * len(sizes))
    rows = []
    for number, case in enumerate(plan):
        seconds: dict[Side, list[float]] = {"library": [], "raw": []}
        for index, size in enumerate(sizes):
            sides: tuple[Side, Side] = ("library", "raw") if index % 2 == 0 else ("raw", "library")
            for side in sides:
                if progress is not None and bar is not None:
                    progress.update(bar, description=f"{case.name} ({side})")
                    progress.refresh()
                queue = f"bench-{run}-{number}-{index}"
                seconds[side].append(_measure(stores, side, case, queue, size))
                if progress is not None and bar is not None:
                    progress.advance(bar)
                    progress.refresh()
        rows.append(
            Row(
                case,
                stores.kind,
                tasks,
                sizes,
                tuple(seconds["library"]),
                tuple(seconds["raw"]),
            )
        )
    return rows


def speedups(rows: list[Row]) -> tuple[float, float] | None:
    """Batch claim rate over one-by-one claim rate: (library, raw baseline)."""
    claims = [r for r in rows if r.case.mode == "claim_only"]
    one = next((r for r in claims if r.case.batch == 1), None)
    many = next((r for r in claims if r.case.batch > 1), None)
    if one is None or many is None:
        return None
    return (
        many.ops_per_s / one.ops_per_s,
        many.baseline_ops_per_s / one.baseline_ops_per_s,
    )


def _table(rows: list[Row], url: str) -> Table:
    table = new_table(title=escape(f"agentlease bench on {url}"), box=box.SIMPLE_HEAD)
    table.add_column("row", style="bold")  # long names wrap; the figures never do
    table.add_column("tasks", justify="right", no_wrap=True)
    table.add_column("library ops/s", justify="right", style="cyan", no_wrap=True)
    table.add_column("raw ops/s", justify="right", no_wrap=True)
    table.add_column("ratio", justify="right", no_wrap=True)
    for r in rows:
        ratio = r.ops_per_s / r.baseline_ops_per_s
        style = "green" if ratio >= 0.8 else "yellow"
        table.add_row(
            r.case.name,
            str(r.tasks),
            f"{r.ops_per_s:,.0f}",
            f"{r.baseline_ops_per_s:,.0f}",
            f"[{style}]{ratio:.2f}[/]",
        )
    speedup = speedups(rows)
    if speedup is not None:
        # The 5x target is for stores with a round trip to save; memory has none.
        target = ""
        if rows[0].backend == "sqlite":
            target = "; target 5x: " + ("[green]met[/]" if speedup[0] >= 5 else "[yellow]missed[/]")
        table.caption = (
            f"batch claim is {speedup[0]:.1f}x the one-by-one claim rate "
            f"(raw: {speedup[1]:.1f}x{target})"
        )
    return table


@contextmanager
def _scratch(url: str | None) -> Iterator[tuple[str, Path]]:
    """The URL to measure and a scratch directory on the same filesystem, removed afterwards."""
    parent = None
    if url is not None and urlsplit(url).scheme.lower() == "sqlite":
        parent = os.path.dirname(os.path.abspath(urlsplit(url).path[1:])) or None
    with tempfile.TemporaryDirectory(prefix="agentlease-bench-", dir=parent) as scratch:
        yield url or f"sqlite:///{scratch}/bench.db", Path(scratch)


@cli.command()
@click.option(
    "--backend",
    "url",
    default=None,
    help="Store URL to measure (default: a fresh SQLite file in a temporary directory).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list of rows, nothing else.")
@click.option(
    "--tasks",
    type=click.IntRange(min=1),
    default=DEFAULT_TASKS,
    show_default=True,
    help="Tasks each row drains, split over 3 rounds (and as many for its baseline).",
)
@click.option(
    "--processes",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="Workers of the multi-worker row.",
)
@click.option(
    "--batch", type=click.IntRange(2, 10_000), default=50, show_default=True, help="Claim size."
)
@click.option(
    "--latency",
    is_flag=True,
    help="Redis/PostgreSQL: also claim latency with 1,000,000 vs 1,000 queued, and one extend "
    "of 10,000 leases (fills a million tasks: minutes).",
)
@click.option(
    "--keys",
    type=click.IntRange(min=0),
    default=DEFAULT_CALLS,
    show_default=True,
    help="Calls of each idempotency row (first calls, then replays of them), split over 3 "
    "rounds, beside as many raw writes; 0 skips the rows.",
)
@click.option(
    "--guards",
    type=click.IntRange(min=0),
    default=DEFAULT_GUARDS,
    show_default=True,
    help="Calls of each shared-state guard row (compare_and_set; lock acquire + release), "
    "split over 3 rounds, beside as many raw operations; 0 skips the rows.",
)
@click.option(
    "--worker-tasks",
    type=click.IntRange(min=0),
    default=DEFAULT_WORKER_TASKS,
    show_default=True,
    help="Tasks of the worker row (agentlease worker processes with a no-op handler), split "
    "over 3 rounds, beside as many through the raw loop; 0 skips the row.",
)
@click.option(
    "--worker-processes",
    type=click.IntRange(1, 64),
    default=DEFAULT_PROCESSES,
    show_default=True,
    help="agentlease worker processes of the worker row (and raw processes beside them).",
)
@click.option(
    "--worker-concurrency",
    type=click.IntRange(1, 1000),
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    help="--concurrency of each agentlease worker of the worker row.",
)
@reports_errors
def bench(
    url: str | None,
    as_json: bool,
    tasks: int,
    processes: int,
    batch: int,
    latency: bool,
    keys: int,
    guards: int,
    worker_tasks: int,
    worker_processes: int,
    worker_concurrency: int,
) -> None:
    """Measure claim+complete throughput, and the cost of @idempotent and of shared-state
    guards, beside raw baselines.

    Each row's baseline runs the same store kind and driver with no library: for SQLite the
    backend's own statements through sqlite3 on a fresh database; for Redis a minimal claim
    script and a minimal complete script through redis-py, over the connection the library
    uses (plus two rows beside the same loop through redis-py's client API, and the batch claim
    beside a plain script that makes the library's claim changes); for PostgreSQL one
    FOR UPDATE SKIP LOCKED claim statement and one complete statement through psycopg; for
    memory the backend's primitives without the client.

    Then @idempotent around a no-op, first calls and replays, in microseconds and in raw
    operations per call, beside one minimal atomic write per key: INSERT OR IGNORE in its own
    transaction (SQLite), SET NX (Redis), INSERT ... ON CONFLICT DO NOTHING (PostgreSQL), a dict
    insert under a lock (memory). Ideally a first call costs 2 and a replay 1.

    Then SharedState.compare_and_set at the right version (ideally 1 raw operation) beside one
    version-checked UPDATE (SQLite, PostgreSQL) or script (Redis); that raw write through
    al.retry with a RetryBudget and a CircuitBreaker kept in the store, healthy (ideally 1,
    target 1.3); a sealed plan that read one record and sets one field, approved (ideally 1);
    and a lock set of one, acquired and released (ideally 2), beside a conditional
    acquire and an owner-checked release: an upsert and an UPDATE (SQLite, PostgreSQL), SET NX
    PX and a script (Redis).

    Then the worker row (not on memory://): --worker-processes `agentlease worker --burst`
    processes with a no-op handler drain --worker-tasks tasks, timed from the first completion
    to the last as the store stamped them (and end to end, start-up included), beside as many
    processes of the raw loop that claims and completes one task at a time.

    Redis and PostgreSQL rows run in a fresh key prefix or schema, deleted afterwards; on a
    SQLite --backend, tasks are left in bench-* queues, keys in its idempotency table, and
    bench-guards-* records, locks and plan receipts.
    """
    kind = urlsplit(url).scheme.lower() if url else "sqlite"
    if kind in _bench_served.SERVED:
        served = url or ""
        if not as_json:
            also = f" and {keys} idempotent calls" if keys else ""
            also += f" and {guards} guard calls" if guards else ""
            also += f" and {worker_tasks} worker tasks" if worker_tasks else ""
            err_console.print(
                f"bench: {tasks} tasks a row{also} on {redact_url(served)} (fresh namespace)",
                soft_wrap=True,
            )
        measured = _bench_served.measure(
            served,
            kind,
            tasks=tasks,
            processes=processes,
            batch=batch,
            latency=latency,
            keys=keys,
            guards=guards,
        )
        worker_rows = []
        if worker_tasks:
            worker_rows = served_workers(
                served,
                kind,
                worker_tasks,
                processes=worker_processes,
                concurrency=worker_concurrency,
            )
        _report(served, as_json, *measured, workers=worker_rows)
        return
    with _scratch(url) as (target, scratch):
        stores = Stores(target, scratch)
        try:
            plan = cases(processes, batch, stores.kind)
            if not as_json:
                also = f" and 2 rows x {keys} idempotent calls" if keys else ""
                also += f" and 4 rows x {guards} guard calls" if guards else ""
                if worker_tasks and stores.targets is not None:
                    also += f" and {worker_tasks} worker tasks"
                err_console.print(
                    f"bench: {len(plan)} rows x {tasks} tasks{also} in {ROUNDS} rounds, each "
                    f"beside its raw baseline, on {target}",
                    soft_wrap=True,
                )
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            # Redrawn only between measurements: no refresh thread competes with a timed loop.
            with Progress(
                *columns, console=err_console, transient=True, auto_refresh=False
            ) as progress:
                rows = run_bench(stores, plan, tasks, progress=progress)
                worker_rows = []
                if worker_tasks:
                    worker_rows = run_workers(
                        stores,
                        worker_tasks,
                        processes=worker_processes,
                        concurrency=worker_concurrency,
                        progress=progress,
                    )
                key_rows = local_keys(target, scratch, keys, progress) if keys else []
                guard_rows = local_guards(target, scratch, guards, progress) if guards else []
        finally:
            stores.close()
    _report(target, as_json, rows, key_rows, guard_rows, workers=worker_rows)


def _report(
    url: str,
    as_json: bool,
    rows: list[Row],
    key_rows: list[KeyRow],
    guard_rows: list[GuardRow],
    extra: list[dict[str, JSON]] | None = None,
    *,
    workers: list[WorkerRow] | None = None,
) -> None:
    """Print every row: one JSON list, or tables (and, on a served store, ``extra`` lines)."""
    versus = _versus_one_at_a_time(rows)
    if as_json:
        micro = [r.as_json() for r in workers or []]
        micro += [r.as_json() for r in key_rows] + [r.as_json() for r in guard_rows]
        print_json([r.as_json() for r in rows] + versus + micro + (extra or []))
        return
    shown = redact_url(url)  # the store as messages name it: no password, no key file
    console.print(_table(rows, shown))
    if workers:
        console.print(workers_table(workers, shown))
    if key_rows:
        console.print(keys_table(key_rows, shown))
    if guard_rows:
        console.print(guards_table(guard_rows, shown))
    for item in [] if extra is None else versus + extra:
        console.print(f"{item['name']}: ratio {item['ratio']}  {item.get('detail', '')}")


def _versus_one_at_a_time(rows: list[Row]) -> list[dict[str, JSON]]:
    """Batched claim+complete through the library against the raw one-at-a-time loop."""
    off = next(
        (
            r
            for r in rows
            if r.case.mode == "claim_complete" and r.case.batch == 1 and r.case.workers == 1
        ),
        None,
    )
    on = next((r for r in rows if r.case.mode == "claim_complete" and r.case.batch > 1), None)
    if off is None or on is None:
        return []
    # The ratio of the rates as printed, like every other row's.
    ops, base = round(on.ops_per_s, 1), round(off.baseline_ops_per_s, 1)
    return [
        {
            "name": f"claim+complete, batch {on.case.batch} vs raw one at a time",
            "backend": on.backend,
            "ops_per_s": ops,
            "baseline_ops_per_s": base,
            "ratio": round(ops / base, 3),
        }
    ]
