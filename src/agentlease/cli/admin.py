"""Administration commands: ``enqueue``, ``stats``, ``inspect``, ``workers`` and ``dead``.

Also home to what every command shares: :func:`reports_errors`, which turns any
:class:`~agentlease.AgentLeaseError` into one red line on stderr and exit status 2, and
:func:`open_queue`, which opens a queue client on a ``--backend`` URL.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import IO
from urllib.parse import urlsplit

import click
import orjson
from rich import box
from rich.markup import escape
from rich.progress import Progress
from rich.text import Text

from agentlease._codec import JSON, encode
from agentlease._records import STATES, QueueStats, Task, TaskSpec, WorkerInfo
from agentlease._redact import redact_url
from agentlease._sync.queue import Queue
from agentlease.backends import connect
from agentlease.cli._app import (
    backend_option,
    cli,
    console,
    err_console,
    new_table,
    reports_errors,
)
from agentlease.errors import BackendUnavailable, InvalidInput, NotJSON, UnknownTask

__all__ = ["open_queue", "print_json"]


CHUNK = 500  # tasks per enqueue step: short write locks, and a progress bar on big files
ERROR_WIDTH = 160  # characters of an error shown in the dead-letter table


def open_queue(url: str, *, must_exist: bool = False) -> Queue:
    """A queue client on the store named by ``url``.

    Args:
        url: the ``--backend`` URL.
        must_exist: refuse a SQLite file that does not exist yet, so that a mistyped path in a
            read-only command is an error rather than a new empty database.

    Raises:
        InvalidURL: the URL is malformed.
        BackendUnavailable: the store cannot be opened (or, with ``must_exist``, is missing).
    """
    if must_exist:
        missing = _missing_sqlite_file(url)
        if missing is not None:
            raise BackendUnavailable(
                f"no SQLite database at {missing!r} (from {redact_url(url)!r})"
            )
    return Queue(connect(url))


def _missing_sqlite_file(url: str) -> str | None:
    try:
        parts = urlsplit(url)
    except ValueError:
        return None  # connect() explains what is wrong with it
    file = parts.path[1:]
    if parts.scheme.lower() != "sqlite" or parts.netloc or not parts.path.startswith("/"):
        return None
    if file in ("", ":memory:") or file.endswith("/") or os.path.exists(file):
        return None
    return file


def print_json(value: object) -> None:
    """Print ``value`` as indented JSON on stdout, exactly (no markup, no wrapping)."""
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


@contextmanager
def _closing(queue: Queue) -> Iterator[Queue]:
    try:
        yield queue
    finally:
        queue.close()


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


# -- enqueue ------------------------------------------------------------------------------------


def _parse(text: str, where: str) -> JSON:
    try:
        value: JSON = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        hint = " (a string needs JSON quotes: '\"text\"')" if text[:1].isalpha() else ""
        raise NotJSON(f"{where} is not valid JSON{hint}: {exc}") from exc
    return value


def _payloads(arguments: Sequence[str], file: IO[str] | None) -> list[JSON]:
    payloads = [_parse(a, f"PAYLOAD_JSON #{i} {a[:60]!r}") for i, a in enumerate(arguments, 1)]
    if file is not None:
        for number, line in enumerate(file, 1):
            if line.strip():
                payloads.append(_parse(line, f"{file.name} line {number}"))
    return payloads


@cli.command()
@click.argument("queue")
@click.argument("payload_json", nargs=-1)
@click.option(
    "--file",
    "-f",
    "file",
    type=click.File("r", encoding="utf-8"),
    help="A JSON Lines file: one payload per line ('-' reads stdin).",
)
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first.")
@click.option("--delay", type=float, default=0.0, help="Seconds before the tasks may run.")
@click.option("--id", "task_id", help="The task's id (one task only); an existing id is kept.")
@click.option("--dedup-key", help="A key unique within the queue (one task only).")
@click.option("--timeout", type=float, default=None, help="Seconds each attempt may run.")
@click.option(
    "--partition", help="The resource the tasks write to: they run one at a time, in order."
)
@click.option("--json", "as_json", is_flag=True, help="Print each task's id and if it was new.")
@backend_option
@reports_errors
def enqueue(
    queue: str,
    payload_json: tuple[str, ...],
    file: IO[str] | None,
    priority: int,
    delay: float,
    task_id: str | None,
    dedup_key: str | None,
    partition: str | None,
    timeout: float | None,
    as_json: bool,
    url: str,
) -> None:
    """Add tasks to QUEUE: one per PAYLOAD_JSON argument and per line of --file.

    Every payload is checked before anything is written: one that is not JSON, or too large,
    refuses the whole command. Write 'null' for a task without payload.
    """
    payloads = _payloads(payload_json, file)
    if not payloads:
        raise InvalidInput("nothing to enqueue: give PAYLOAD_JSON arguments or --file")
    if len(payloads) > 1 and (task_id is not None or dedup_key is not None):
        raise InvalidInput(f"--id and --dedup-key name one task, but {len(payloads)} were given")
    with _closing(open_queue(url)) as q:
        limit = q.settings.max_payload_bytes
        for number, payload in enumerate(payloads, 1):  # refuse before any chunk is written
            encode(payload, what=f"payload #{number}", limit=limit)
        specs = [
            TaskSpec(
                payload=p,
                id=task_id,
                priority=priority,
                delay=delay,
                dedup_key=dedup_key,
                partition=partition,
                timeout=timeout,
            )
            for p in payloads
        ]
        if len(specs) == 1 and not as_json:
            (result,) = q.enqueue_many(queue, specs)
            if result.created:
                console.print(
                    f"enqueued task [bold]{escape(result.task_id)}[/] to [bold]{escape(queue)}[/]"
                )
            else:
                console.print(
                    f"task [bold]{escape(result.task_id)}[/] already exists: nothing created"
                )
            return
        results = []
        with Progress(console=err_console, transient=True) as progress:
            bar = progress.add_task(f"enqueue to {queue}", total=len(specs))
            for start in range(0, len(specs), CHUNK):
                chunk = specs[start : start + CHUNK]
                results.extend(q.enqueue_many(queue, chunk))
                progress.advance(bar, len(chunk))
    if as_json:
        print_json([{"id": r.task_id, "created": r.created} for r in results])
        return
    created = sum(r.created for r in results)
    existed = len(specs) - created
    note = f" ({existed} already existed)" if existed else ""
    console.print(f"enqueued {created} tasks to [bold]{escape(queue)}[/]{note}:")
    for r in results:  # the ids created, one per line
        if r.created:
            click.echo(r.task_id)


# -- stats --------------------------------------------------------------------------------------


_QUEUE_MIN = 10  # the narrowest the queue column of the stats table may fold to


def _stats_json(s: QueueStats) -> dict[str, JSON]:
    return {
        "queue": s.queue,
        "counts": {state: s.counts.get(state, 0) for state in STATES},
        "depth": s.depth,
        "oldest_queued_age": s.oldest_queued_age,
        "hot_partitions": [{"partition": p, "parked": n} for p, n in s.hot_partitions],
    }


@cli.command()
@click.argument("queues", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@backend_option
@reports_errors
def stats(queues: tuple[str, ...], as_json: bool, url: str) -> None:
    """Counts by state, depth and oldest queued age of QUEUES (default: every queue)."""
    with _closing(open_queue(url, must_exist=True)) as q:
        names = list(queues) or q.queues()
        rows = [q.stats(name) for name in names]
    if as_json:
        print_json([_stats_json(s) for s in rows])
        return
    if not rows:
        console.print("no queues yet")
        return
    # Compact enough for 80 columns: no edge padding, and "delayed" for the scheduled state.
    table = new_table(title="queues", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    table.add_column("queue", style="bold", overflow="fold", min_width=_QUEUE_MIN)
    # Parked tasks exist only with partitions, cancelled ones only after a cancel: their columns
    # appear when there are some.
    rare = ("parked", "cancelled")
    shown = [st for st in STATES if st not in rare or any(s.counts.get(st) for s in rows)]
    cells = [
        [
            *(str(s.counts.get(state, 0)) for state in shown),
            str(s.depth),
            _seconds(s.oldest_queued_age),
        ]
        for s in rows
    ]
    headers = ["delayed" if st == "scheduled" else st for st in shown] + ["depth", "oldest"]
    needed = _QUEUE_MIN + 6  # the queue column, its padding and the table's edges
    for i, header in enumerate(headers):
        # Numbers are never cut: a table too wide for them is printed another way (below).
        width = max(len(header), *(len(row[i]) for row in cells))
        needed += width + 2
        style = "cyan" if header == "depth" else None
        table.add_column(header, justify="right", no_wrap=True, min_width=width, style=style)
    for s, row in zip(rows, cells, strict=True):
        table.add_row(escape(s.queue), *row)
    if needed <= console.width:
        console.print(table)
    else:  # too narrow for every column: one line per queue, which wraps instead
        for s, row in zip(rows, cells, strict=True):
            parts = ", ".join(f"{h} {v}" for h, v in zip(headers, row, strict=True))
            console.print(f"[bold]{escape(s.queue)}[/]: {parts}", soft_wrap=False)
    for s in rows:
        if s.hot_partitions:
            hot = ", ".join(f"{p} ({n} parked)" for p, n in s.hot_partitions)
            console.print(f"hot partitions of [bold]{escape(s.queue)}[/]: {escape(hot)}")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of the names.")
@backend_option
@reports_errors
def queues(as_json: bool, url: str) -> None:
    """The store's queues (every queue ever enqueued to), one name a line."""
    with _closing(open_queue(url, must_exist=True)) as q:
        names = sorted(q.queues())
    if as_json:
        print_json(names)
        return
    for name in names:
        click.echo(name)  # names only: plain lines to read or pipe, never markup


# -- inspect ------------------------------------------------------------------------------------


@cli.command()
@click.argument("queue")
@click.option("--limit", type=int, default=100, show_default=True, help="Most leases shown.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@backend_option
@reports_errors
def inspect(queue: str, limit: int, as_json: bool, url: str) -> None:
    """Live leases of QUEUE, soonest expiry first, with the worker holding each (its id:
    host:pid:...) and each task's last progress."""
    with _closing(open_queue(url, must_exist=True)) as q:
        leases = q.inspect(queue, limit=limit)
        progress = {info.task_id: _progress_of(q, info.task_id) for info in leases}
    if as_json:
        print_json([{**asdict(info), "progress": progress[info.task_id]} for info in leases])
        return
    if not leases:
        console.print(f"no live leases in [bold]{escape(queue)}[/]")
        return
    # Compact enough for 80 columns: no edge padding, short headers, long values folded or cut.
    table = new_table(
        title=f"live leases of {queue}", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1)
    )
    table.add_column("task id", style="bold", overflow="fold", min_width=8)
    for name in ("att", "held", "ends in", "recl", "fail"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("holder", overflow="fold", min_width=14, max_width=24)
    table.add_column("progress", overflow="ellipsis", no_wrap=True, min_width=8, max_width=16)
    for info in leases:
        shown = progress[info.task_id]
        table.add_row(
            escape(info.task_id),
            str(info.attempt),
            _seconds(info.leased_for),
            _seconds(info.expires_in),
            str(info.reclaims),
            str(info.failures),
            "-" if info.holder is None else escape(info.holder),
            "-" if shown is None else escape(orjson.dumps(shown).decode()),
        )
    console.print(table)


# -- workers ------------------------------------------------------------------------------------


def _worker_json(w: WorkerInfo, now: float) -> dict[str, JSON]:
    return {
        "id": w.id,
        "host": w.host,
        "pid": w.pid,
        "queues": list(w.queues),
        "concurrency": w.concurrency,
        "started": w.started,
        "last_beat": w.beat_at,
        "last_beat_age": now - w.beat_at,
        "expires_in": w.expires_at - now,
        "tasks": list(w.tasks),
    }


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@backend_option
@reports_errors
def workers(as_json: bool, url: str) -> None:
    """Live workers of the store: id, host and pid, queues, concurrency, uptime, last heartbeat
    and the tasks in their hands. A worker that died is listed until its entry's TTL lapses."""
    with _closing(open_queue(url, must_exist=True)) as q:
        listed = q.workers()
        now = q.backend.now()
    if as_json:
        print_json([_worker_json(w, now) for w in listed])
        return
    if not listed:
        console.print("no live workers")
        return
    table = new_table(title="live workers", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    table.add_column("worker", style="bold", overflow="fold", min_width=12, max_width=28)
    table.add_column("queues", overflow="fold", min_width=6, max_width=16)
    for name in ("conc", "up", "beat", "held"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("tasks", overflow="ellipsis", no_wrap=True, min_width=6, max_width=18)
    for w in listed:
        started = w.started
        table.add_row(
            escape(w.id),
            escape(",".join(w.queues)) or "-",
            str(w.concurrency),
            "-" if started is None else _seconds(max(0.0, time.time() - started)),
            _seconds(now - w.beat_at),
            str(len(w.tasks)),
            escape(" ".join(w.tasks)) or "-",
        )
    console.print(table)


def _progress_of(q: Queue, task_id: str) -> JSON:
    """A task's last progress (``None`` if it reported none, or finished meanwhile and went)."""
    try:
        return q.get(task_id).progress
    except UnknownTask:
        return None


# -- dead letters -------------------------------------------------------------------------------


def _describe(error: JSON) -> str:
    if isinstance(error, dict) and "type" in error and "message" in error:
        return f"{error['type']}: {error['message']}"
    return orjson.dumps(error).decode()


def _dead_json(task: Task, now: float) -> dict[str, JSON]:
    return {
        "id": task.id,
        "attempt": task.attempt,
        "failures": task.failures,
        "reclaims": task.reclaims,
        "finished_at": task.finished_at,
        "dead_for": None if task.finished_at is None else now - task.finished_at,
        "error": task.error,
        "payload": task.payload,
    }


@cli.command()
@click.argument("queue")
@click.argument("task_ids", nargs=-1)
@click.option("--limit", type=int, default=100, show_default=True, help="Most tasks listed.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--requeue", is_flag=True, help="Requeue TASK_IDS (or --all) with fresh budgets.")
@click.option("--all", "requeue_all", is_flag=True, help="With --requeue: every dead task.")
@click.option("--front", is_flag=True, help="With --requeue: to the front of their priority.")
@backend_option
@reports_errors
def dead(
    queue: str,
    task_ids: tuple[str, ...],
    limit: int,
    as_json: bool,
    requeue: bool,
    requeue_all: bool,
    front: bool,
    url: str,
) -> None:
    """List the dead letters of QUEUE with their errors, or requeue them with --requeue."""
    if not requeue and (task_ids or requeue_all or front):
        raise InvalidInput("TASK_IDS, --all and --front go with --requeue")
    if requeue and not (task_ids or requeue_all):
        raise InvalidInput("name the TASK_IDS to requeue, or give --all")
    if task_ids and requeue_all:
        raise InvalidInput("give TASK_IDS or --all, not both")
    with _closing(open_queue(url, must_exist=True)) as q:
        if requeue:
            wanted = None if requeue_all else list(dict.fromkeys(task_ids))
            count = q.requeue_dead(queue, wanted, front=front)
            where = "front" if front else "back"
            console.print(f"requeued {count} dead tasks of [bold]{escape(queue)}[/] to the {where}")
            if wanted is not None and count < len(wanted):
                missing = len(wanted) - count
                err_console.print(
                    Text(f"{missing} of the named tasks are not dead letters of {queue}", "yellow")
                )
                raise click.exceptions.Exit(1)
            return
        tasks = q.dead(queue, limit=limit)
    now = time.time()
    if as_json:
        print_json([_dead_json(t, now) for t in tasks])
        return
    if not tasks:
        console.print(f"no dead letters in [bold]{escape(queue)}[/]")
        return
    table = new_table(title=f"dead letters of {escape(queue)}", box=box.SIMPLE_HEAD)
    table.add_column("task id", style="bold", overflow="fold")
    for name in ("failures", "reclaims", "dead for"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("error", style="red", ratio=1, min_width=24)
    for t in tasks:
        age = None if t.finished_at is None else now - t.finished_at
        error = _describe(t.error)
        if len(error) > ERROR_WIDTH:
            error = error[: ERROR_WIDTH - 1] + "…"
        table.add_row(t.id, str(t.failures), str(t.reclaims), _seconds(age), Text(error))
    console.print(table)
