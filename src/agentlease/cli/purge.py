"""The ``purge`` command: delete a queue's done (or dead) tasks past an age, now.

Workers do this on a timer (``WorkerSettings.purge_every``) with the queue's retention; the
command is for a store no worker runs on, or a retention shorter than the default. It purges in
bounded batches, each one atomic step on the store, until a batch comes back short.
"""

from __future__ import annotations

from typing import get_args

import click
from rich.markup import escape

from agentlease._records import FINISHED, FinishedState
from agentlease.cli._app import backend_option, cli, console, parse_age, reports_errors
from agentlease.cli.admin import open_queue, print_json

__all__ = ["parse_age", "purge"]

BATCH = 1000


@cli.command()
@click.argument("queue")
@click.option(
    "--older-than",
    "older_than",
    required=True,
    help="Age of the tasks purged, since they finished: 30s, 15m, 12h, 1d, 2w (0: all).",
)
@click.option(
    "--state",
    type=click.Choice(get_args(FinishedState)),
    default="done",
    show_default=True,
    help="Which finished tasks.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a line.")
@backend_option
@reports_errors
def purge(queue: str, older_than: str, state: str, as_json: bool, url: str) -> None:
    """Delete the done (dead, cancelled) tasks of QUEUE that finished longer ago than --older-than.

    Their ids and dedup keys are free again. Workers purge on their own after the queue's
    retention (7 days done, 30 days dead or cancelled, by default).
    """
    seconds = parse_age(older_than)
    which: FinishedState = next(s for s in FINISHED if s == state)  # click checked the choice
    q = open_queue(url, must_exist=True)
    total = 0
    try:
        while True:
            n = q.purge(queue, state=which, older_than=seconds, limit=BATCH)
            total += n
            if n < BATCH:
                break
    finally:
        q.close()
    if as_json:
        print_json({"queue": queue, "state": which, "older_than": seconds, "purged": total})
        return
    console.print(
        f"purged {total} {which} task{'s' if total != 1 else ''} of [bold]{escape(queue)}[/] "
        f"finished over {seconds:g}s ago"
    )
