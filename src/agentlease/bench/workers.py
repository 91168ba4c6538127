"""The worker row of ``agentlease bench``: the stock ``agentlease worker`` command, end to end.

The library's side of a round starts N real worker processes, each ``sys.executable -m
agentlease worker agentlease.bench.noop_handler:noop --queue Q --concurrency C
--burst`` (the interpreter that runs the bench, with its environment), on a queue of T tasks
enqueued beforehand (untimed, :meth:`~agentlease.Queue.enqueue_many`, 1,000 a call) whose
handler returns ``None`` at once, and waits for all of them to exit. Whatever batching and
prefetch the command does by default is what the row measures.

How it is timed: from the first completion to the last, as the store recorded them. Once the
processes have exited, every task is read back with :meth:`~agentlease.Queue.get` (untimed):
its ``finished_at`` is stamped by the store, with the store's clock, in the step that accepts the
completion, so the span from the earliest to the latest excludes interpreter start-up and the
workers' exit, and nothing polls the store while the workers run. T completions span T - 1
intervals: the rate is (T - 1) / span. The same read checks that
every task is done (else the bench fails) and counts the tasks claimed more than once
(``attempt > 1``: a no-op should never be). The end-to-end time, also reported, runs on this
machine's monotonic clock from launching the first process to the exit of the last: start-up,
drain and the burst exit.

The raw side of a round is the baseline of the ``claim+complete, N processes`` row: the same
store's raw one-task claim + complete loop in N spawned processes started together behind a
barrier (:func:`~agentlease.bench.loops.drain_together`), timed from the start signal to the
end of the last loop. Rounds alternate library and raw as in
:func:`~agentlease.bench.command.run_bench`; each side's best round counts.

A worker process that exits non-zero, or does not finish within a bound that grows with the
round's tasks, fails the bench with its stderr's tail; every process still running is killed
before the round returns. (With ``--burst`` a worker also exits by itself once the queue is
empty.) The row runs on SQLite, Redis and PostgreSQL, not on ``memory://``, whose store lives in
the bench's own process.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

import click
from rich import box
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from agentlease._codec import JSON
from agentlease._records import TaskSpec
from agentlease.bench.loops import FILL_CHUNK, ROUNDS, drain_together, split

if TYPE_CHECKING:
    from agentlease.bench.command import Side, Stores

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_PROCESSES",
    "DEFAULT_WORKER_TASKS",
    "HANDLER",
    "WorkerRow",
    "drain_with_workers",
    "run_workers",
    "served_workers",
    "workers_table",
]

HANDLER = "agentlease.bench.noop_handler:noop"
DEFAULT_WORKER_TASKS = 15_000
DEFAULT_PROCESSES = 4
DEFAULT_CONCURRENCY = 8
STDERR_TAIL = 2_000  # characters of a failed worker's stderr shown in the error
KILL_WAIT = 10.0  # seconds to wait for a killed worker to be reaped


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """The worker row: ``agentlease worker`` processes beside the raw one-task loop.

    Attributes:
        backend: the store kind (``sqlite``, ``redis``, ``postgresql``).
        processes: worker processes on each side.
        concurrency: ``--concurrency`` of each worker.
        sizes: tasks drained in each round (the library's and the baseline's rounds alternate).
        seconds: per round, the library's first to last completion, by the store's clock.
        end_to_end_seconds: per round, launch of the first worker to exit of the last.
        baseline_seconds: per round, the raw processes' start signal to the end of the last.
        claimed_again: tasks the workers claimed more than once, over all rounds.
    """

    backend: str
    processes: int
    concurrency: int
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    end_to_end_seconds: tuple[float, ...]
    baseline_seconds: tuple[float, ...]
    claimed_again: int

    @property
    def counted(self) -> str:
        """``N processes`` (or ``1 process``)."""
        return f"{self.processes} process{'' if self.processes == 1 else 'es'}"

    @property
    def name(self) -> str:
        """The row's label."""
        return f"worker, {self.counted}"

    @property
    def tasks(self) -> int:
        """Tasks each side drained, over all rounds."""
        return sum(self.sizes)

    @staticmethod
    def _best(sizes: tuple[int, ...], seconds: tuple[float, ...]) -> float:
        return max(n / s for n, s in zip(sizes, seconds, strict=True))

    @property
    def ops_per_s(self) -> float:
        """Tasks per second through the workers, first to last completion, best round: n
        completions span n - 1 intervals, so a round of n tasks counts n - 1 (0 if n is 1)."""
        return self._best(tuple(n - 1 for n in self.sizes), self.seconds)

    @property
    def end_to_end_ops_per_s(self) -> float:
        """Tasks per second through the workers, launch to exit, best round."""
        return self._best(self.sizes, self.end_to_end_seconds)

    @property
    def baseline_ops_per_s(self) -> float:
        """Tasks per second of the raw processes, best round."""
        return self._best(self.sizes, self.baseline_seconds)

    def as_json(self) -> dict[str, JSON]:
        """The row as ``--json`` prints it."""
        ops, base = round(self.ops_per_s, 1), round(self.baseline_ops_per_s, 1)
        return {
            "name": self.name,
            "backend": self.backend,
            "mode": "worker",
            "handler": HANDLER,
            "baseline": f"{self.counted}, raw claim + complete one task at a time",
            "tasks": self.tasks,
            "rounds": len(self.sizes),
            "workers": self.processes,
            "concurrency": self.concurrency,
            "ops_per_s": ops,
            "baseline_ops_per_s": base,
            "ratio": round(ops / base, 3),
            "end_to_end_ops_per_s": round(self.end_to_end_ops_per_s, 1),
            "drain_s": [round(s, 4) for s in self.seconds],
            "end_to_end_s": [round(s, 4) for s in self.end_to_end_seconds],
            "baseline_s": [round(s, 4) for s in self.baseline_seconds],
            "completed": self.tasks,  # a round with a task not done fails the bench
            "claimed_again": self.claimed_again,
        }


def _fill(stores: Stores, queue: str, count: int) -> list[str]:
    """Enqueue ``count`` tasks on the library's store, 1,000 a call; returns their ids."""
    q = stores.library.q
    ids: list[str] = []
    for start in range(0, count, FILL_CHUNK):
        specs = [TaskSpec(payload={"n": i}) for i in range(start, min(count, start + FILL_CHUNK))]
        ids += [e.task_id for e in q.enqueue_many(queue, specs)]
    return ids


def _tail(log: IO[bytes]) -> str:
    log.seek(0)
    text = log.read().decode(errors="replace").strip()
    return text[-STDERR_TAIL:] or "(nothing on stderr)"


def _failure(proc: subprocess.Popen[bytes], log: IO[bytes]) -> click.ClickException:
    code = proc.returncode
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    return click.ClickException(
        f"bench: worker process {proc.pid} ({HANDLER}) {how}; its stderr ends:\n{_tail(log)}"
    )


def drain_with_workers(url: str, queue: str, processes: int, concurrency: int, tasks: int) -> float:
    """Run ``processes`` ``agentlease worker --burst`` processes with the no-op handler on
    ``queue`` of ``url`` until all have exited.

    Returns:
        The seconds from the first launch to the last exit.

    Raises:
        click.ClickException: a process exited non-zero, or was still running after a bound
            that grows with ``tasks``; the message ends with its stderr. Every process still
            running has been killed by then.
    """
    # The URL goes in the environment, not the command line, which any local user can list.
    command = [sys.executable, "-m", "agentlease", "worker", HANDLER]
    command += ["--queue", queue, "--concurrency", str(concurrency), "--burst"]
    env = {**os.environ, "AGENTLEASE_URL": url}
    bound = 60.0 + tasks / 100  # generous: a hundred tasks a second, after a minute's start
    with ExitStack() as stack:
        logs = [
            stack.enter_context(tempfile.TemporaryFile(prefix="agentlease-bench-worker-"))
            for _ in range(processes)
        ]
        procs: list[subprocess.Popen[bytes]] = []
        stack.callback(_kill, procs)  # runs first: the logs are closed after it
        start = time.monotonic()
        for log in logs:
            procs.append(
                subprocess.Popen(
                    command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                )
            )
        while True:
            codes = [p.poll() for p in procs]
            if all(code == 0 for code in codes):
                return time.monotonic() - start
            for proc, log, code in zip(procs, logs, codes, strict=True):
                if code not in (None, 0):
                    raise _failure(proc, log)
            if time.monotonic() - start > bound:
                late = codes.index(None)
                raise click.ClickException(
                    f"bench: worker process {procs[late].pid} did not finish {tasks} tasks "
                    f"within {bound:.0f}s; its stderr ends:\n{_tail(logs[late])}"
                )
            time.sleep(0.005)  # a few waitpid calls: cheap beside the workers' own work


def _kill(procs: list[subprocess.Popen[bytes]]) -> None:
    """Kill every process still running and reap it (each wait bounded)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        with suppress(subprocess.TimeoutExpired):  # SIGKILL sent: nothing more to do
            proc.wait(timeout=KILL_WAIT)


def _library_round(
    stores: Stores, url: str, queue: str, size: int, processes: int, concurrency: int
) -> tuple[float, float, int]:
    """One round of the workers: (first to last completion, end to end, tasks claimed again)."""
    ids = _fill(stores, queue, size)
    gc.collect()
    end_to_end = drain_with_workers(url, queue, processes, concurrency, size)
    q = stores.library.q
    finished: list[float] = []
    again = 0
    for task_id in ids:
        task = q.get(task_id)
        if task.state != "done" or task.finished_at is None:
            raise click.ClickException(
                f"bench: the workers exited with task {task_id} {task.state} "
                f"(attempt {task.attempt}) on queue {queue}"
            )
        finished.append(task.finished_at)
        again += task.attempt > 1
    return max(max(finished) - min(finished), 1e-9), end_to_end, again


def _raw_round(stores: Stores, queue: str, size: int, processes: int) -> float:
    """One round of the raw baseline: ``processes`` one-task loops started together."""
    assert stores.targets is not None
    stores.raw.fill(queue, size)
    gc.collect()
    claimed, seconds = drain_together(processes, queue, target=stores.targets[1])
    if claimed != size:
        raise click.ClickException(f"bench: worker row (raw) claimed {claimed} of {size} tasks")
    return max(seconds, 1e-9)


def run_workers(
    stores: Stores,
    tasks: int,
    *,
    processes: int = DEFAULT_PROCESSES,
    concurrency: int = DEFAULT_CONCURRENCY,
    rounds: int = ROUNDS,
    progress: Progress | None = None,
) -> list[WorkerRow]:
    """The worker row on ``stores`` (none on a store that lives in this process: memory).

    Args:
        stores: the library's store and its raw baseline, with the targets processes open.
        tasks: tasks each side drains, split over ``rounds``.
        processes: worker processes on each side.
        concurrency: ``--concurrency`` of each worker.
        rounds: rounds of each side, alternating (library, raw, raw, library, ...).
        progress: a progress display to advance after each round.
    """
    if stores.targets is None:
        return []
    url = stores.targets[0].url
    run = uuid.uuid4().hex[:8]
    sizes = split(tasks, rounds)
    bar = None if progress is None else progress.add_task("worker", total=2 * len(sizes))
    seconds: dict[Side, list[float]] = {"library": [], "raw": []}
    end_to_end: list[float] = []
    again = 0
    for index, size in enumerate(sizes):
        sides: tuple[Side, Side] = ("library", "raw") if index % 2 == 0 else ("raw", "library")
        for side in sides:
            if progress is not None and bar is not None:
                progress.update(bar, description=f"worker row ({side})")
                progress.refresh()
            queue = f"bench-{run}-worker-{index}"
            if side == "library":
                drain, total, repeated = _library_round(
                    stores, url, queue, size, processes, concurrency
                )
                seconds["library"].append(drain)
                end_to_end.append(total)
                again += repeated
            else:
                seconds["raw"].append(_raw_round(stores, queue, size, processes))
            if progress is not None and bar is not None:
                progress.advance(bar)
                progress.refresh()
    return [
        WorkerRow(
            stores.kind,
            processes,
            concurrency,
            sizes,
            tuple(seconds["library"]),
            tuple(end_to_end),
            tuple(seconds["raw"]),
            again,
        )
    ]


def workers_table(rows: list[WorkerRow], url: str) -> Table:
    """The worker row as the ``bench`` command prints it."""
    from agentlease.cli._app import new_table

    table = new_table(title=escape(f"agentlease worker on {url}"), box=box.SIMPLE_HEAD)
    table.add_column("row", style="bold")
    table.add_column("tasks", justify="right", no_wrap=True)
    table.add_column("worker ops/s", justify="right", style="cyan", no_wrap=True)
    table.add_column("raw ops/s", justify="right", no_wrap=True)
    table.add_column("ratio", justify="right", no_wrap=True)
    table.add_column("end to end", justify="right", no_wrap=True)
    for r in rows:
        ratio = r.ops_per_s / r.baseline_ops_per_s
        style = "green" if ratio >= 0.8 else "yellow"
        table.add_row(
            r.name,
            str(r.tasks),
            f"{r.ops_per_s:,.0f}",
            f"{r.baseline_ops_per_s:,.0f}",
            f"[{style}]{ratio:.2f}[/]",
            f"{r.end_to_end_ops_per_s:,.0f}",
        )
    if rows:
        r = rows[0]
        again = f"; {r.claimed_again} tasks claimed more than once" if r.claimed_again else ""
        table.caption = (
            f"worker: {HANDLER} in `agentlease worker --burst --concurrency {r.concurrency}` "
            "processes, first to last completion (end to end: launch to exit, start-up "
            f"included); raw: {r.counted} of the one-task claim + complete loop{again}"
        )
    return table


def served_workers(
    url: str, kind: str, tasks: int, *, processes: int, concurrency: int
) -> list[WorkerRow]:
    """The worker row on Redis or PostgreSQL, in fresh namespaces deleted afterwards (see
    :func:`agentlease.bench.served.fresh_stores`)."""
    from agentlease.bench.served import fresh_stores

    with fresh_stores(url, kind) as stores:
        return run_workers(stores, tasks, processes=processes, concurrency=concurrency)
