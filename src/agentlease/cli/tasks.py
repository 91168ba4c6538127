"""The ``tasks`` command: one page of a queue's tasks in one state, and the cursor of the next.

Each page is read through the state's index (``Queue.tasks``), so listing a queue of millions
costs what the page costs; ``--cursor`` takes the cursor the last page printed.
"""

from __future__ import annotations

from typing import get_args

import click
from rich import box
from rich.markup import escape

from agentlease._records import ListedState
from agentlease.cli._app import backend_option, cli, console, new_table, reports_errors
from agentlease.cli.admin import _closing, open_queue, print_json
from agentlease.cli.show import task_json

__all__ = ["tasks"]


def _when(at: float | None, now: float) -> str:
    return "-" if at is None else f"{now - at:.1f}s ago"


@cli.command()
@click.argument("queue")
@click.option(
    "--state",
    type=click.Choice(get_args(ListedState)),
    default="queued",
    show_default=True,
    help="queued: claim order; leased: soonest expiry first; done, dead, cancelled: newest first.",
)
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--cursor", help="Where to start: the cursor the previous page printed.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the tasks and the cursor.")
@backend_option
@reports_errors
def tasks(queue: str, state: str, limit: int, cursor: str | None, as_json: bool, url: str) -> None:
    """One page of QUEUE's tasks in --state, read through that state's index."""
    which: ListedState = state  # type: ignore[assignment]  # click checked the choice
    with _closing(open_queue(url, must_exist=True)) as q:
        page, after = q.tasks(queue, state=which, limit=limit, cursor=cursor)
        now = q.backend.now()
    if as_json:
        print_json({"tasks": [task_json(t, now) for t in page], "cursor": after})
        return
    table = new_table(box=box.SIMPLE, title=f"{which} tasks of {escape(queue)}")
    for column in ("id", "priority", "attempt", "created", "finished", "payload"):
        table.add_column(column)
    for t in page:
        table.add_row(
            escape(t.id),
            str(t.priority),
            str(t.attempt),
            _when(t.created_at, now),
            _when(t.finished_at, now),
            escape(str(t.payload)[:60]),
        )
    console.print(table)
    if after is None:
        console.print("(last page)")
    else:
        console.print(f"next page: --cursor {escape(after)}")
