"""The ``show`` command: everything the store knows about one task."""

from __future__ import annotations

import time

import click
import orjson
from rich import box
from rich.markup import escape
from rich.table import Table

from agentlease._codec import JSON
from agentlease._records import Task
from agentlease.cli._app import backend_option, cli, console, new_table, reports_errors
from agentlease.cli.admin import _closing, open_queue, print_json

__all__ = ["show"]


def _ago(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    seconds = now - at
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))
    if seconds >= 0:
        return f"{when} UTC ({seconds:.1f}s ago)"
    return f"{when} UTC (in {-seconds:.1f}s)"


def task_json(task: Task, now: float) -> dict[str, JSON]:
    """One task as ``show --json`` prints it (times are seconds since the epoch, store clock)."""
    return {
        "id": task.id,
        "queue": task.queue,
        "state": task.state,
        "cancel_reason": task.cancel_reason,
        "priority": task.priority,
        "attempt": task.attempt,
        "failures": task.failures,
        "reclaims": task.reclaims,
        "max_reclaims": task.max_reclaims,
        "partition": task.partition,
        "dedup_key": task.dedup_key,
        "root_id": task.root_id,
        "deadline": task.deadline,
        "created_at": task.created_at,
        "run_at": task.run_at,
        "leased_at": task.leased_at,
        "expires_at": task.expires_at,
        "expires_in": None if task.expires_at is None else task.expires_at - now,
        "finished_at": task.finished_at,
        "payload": task.payload,
        "progress": task.progress,
        "checkpoint": task.checkpoint,
        "result": task.result,
        "error": task.error,
        "attempts": [a.to_dict() for a in task.attempts],
    }


def _text(value: JSON) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


@cli.command()
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@backend_option
@reports_errors
def show(task_id: str, as_json: bool, url: str) -> None:
    """Everything the store knows about TASK_ID: state, attempts, times, payload, progress,
    checkpoint, result, its last error with the end of its traceback, and its last attempts
    (worker, start, duration, outcome)."""
    with _closing(open_queue(url, must_exist=True)) as q:
        task = q.get(task_id)
        now = q.backend.now()
    if as_json:
        print_json(task_json(task, now))
        return
    table = new_table(title=f"task {escape(task.id)}", box=box.SIMPLE_HEAD, show_header=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    rows = [
        ("queue", task.queue),
        ("state", f"{task.state} (cancel requested)" if task.cancel_requested else task.state),
        ("attempt", f"{task.attempt} ({task.failures} failed, {task.reclaims} reclaimed)"),
        ("priority", str(task.priority)),
        ("partition", task.partition or "-"),
        ("root task", task.root_id),
        ("deadline", _ago(task.deadline, now)),
        ("created", _ago(task.created_at, now)),
        ("runs from", _ago(task.run_at, now)),
        ("leased", _ago(task.leased_at, now)),
        ("lease ends", _ago(task.expires_at, now)),
        ("finished", _ago(task.finished_at, now)),
        ("payload", _text(task.payload)),
    ]
    for name, value in (("progress", task.progress), ("checkpoint", task.checkpoint)):
        if value is not None:
            rows.append((name, _text(value)))
    if task.result is not None:
        rows.append(("result", _text(task.result)))
    error = task.error
    if isinstance(error, dict):
        rows.append(("error", f"{error.get('type')}: {error.get('message')}"))
        if error.get("reason"):
            rows.append(("reason", str(error["reason"])))
    elif error is not None:
        rows.append(("error", _text(error)))
    for name, value in rows:
        table.add_row(name, escape(value))
    console.print(table)
    if task.attempts:
        console.print(_attempts_table(task, now))
    if isinstance(error, dict) and isinstance(error.get("traceback"), str):
        console.print("traceback (its end):", style="bold")
        console.print(error["traceback"], markup=False, highlight=False, soft_wrap=True)


def _attempts_table(task: Task, now: float) -> Table:
    """The task's last attempts, oldest first (fits 80 columns: long worker ids fold)."""
    table = new_table(
        title=f"attempts (last {len(task.attempts)})",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
    )
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("worker", overflow="fold", min_width=10, max_width=28)
    table.add_column("started (UTC)", no_wrap=True)
    table.add_column("ran", justify="right", no_wrap=True)
    table.add_column("outcome", overflow="fold", min_width=8)
    for a in task.attempts:
        ran = (a.ended if a.ended is not None else now) - a.started
        outcome = a.outcome or "running"
        if a.error and a.outcome != "timed_out":
            outcome = f"{outcome} ({a.error})"
        table.add_row(
            str(a.attempt),
            escape(a.worker or "-"),
            time.strftime("%m-%d %H:%M:%S", time.gmtime(a.started)),
            f"{max(0.0, ran):.1f}s",
            escape(outcome),
        )
    return table
