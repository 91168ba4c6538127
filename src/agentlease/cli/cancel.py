"""Ending work early: ``cancel`` (one task) and ``delete-queue`` (a queue and all its tasks)."""

from __future__ import annotations

import click
from rich.markup import escape

from agentlease._records import Cancellation
from agentlease.cli._app import backend_option, cli, console, reports_errors
from agentlease.cli.admin import open_queue, print_json

__all__: list[str] = []

_SAID = {
    "cancelled": "cancelled task [bold]{id}[/]",
    "requested": (
        "task [bold]{id}[/] is leased: cancel requested; its worker is told at its next "
        "heartbeat, and the task then ends cancelled"
    ),
    "finished": "task [bold]{id}[/] had already ended ({state}): nothing changed",
}


def _json(done: Cancellation) -> dict[str, str | None]:
    return {
        "id": done.task_id,
        "outcome": done.outcome,
        "state": done.state,
        "reason": done.reason,
    }


@cli.command()
@click.argument("task_id")
@click.option(
    "--reason",
    default="cancelled from the command line",
    show_default=True,
    help="Why (kept with the task; one line, at most 1000 characters).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@backend_option
@reports_errors
def cancel(task_id: str, reason: str, as_json: bool, url: str) -> None:
    """Cancel TASK_ID: a waiting task ends cancelled at once; a leased one is flagged, and its
    worker stops the handler at its next heartbeat; a finished task is left as it is (exit
    status 1)."""
    q = open_queue(url, must_exist=True)
    try:
        done = q.cancel(task_id, reason)
    finally:
        q.close()
    if as_json:
        print_json(_json(done))
    else:
        said = _SAID[done.outcome].format(id=escape(task_id), state=done.state)
        if done.reason is not None:
            said += f" (reason: {escape(done.reason)})"
        console.print(said)
    if done.outcome == "finished":
        raise click.exceptions.Exit(1)


@cli.command("delete-queue")
@click.argument("queue")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--force",
    is_flag=True,
    help="Delete leased tasks too (their workers' later writes are refused).",
)
@click.option(
    "--batch",
    type=int,
    default=1000,
    show_default=True,
    help="Tasks deleted per atomic step.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@backend_option
@reports_errors
def delete_queue(queue: str, yes: bool, force: bool, batch: int, as_json: bool, url: str) -> None:
    """Delete QUEUE and every one of its tasks, whatever their state, in atomic batches.

    Asks for confirmation unless --yes. A queue with leased tasks is refused unless --force:
    stop its workers first. Tasks deleted before a refusal stay deleted.
    """
    q = open_queue(url, must_exist=True)
    try:
        stats = q.stats(queue)  # UnknownQueue before asking anything
        total = sum(stats.counts.values())
        if not yes:
            click.confirm(
                f"Delete queue {queue!r} and its {total} task(s)? This cannot be undone",
                abort=True,
                err=True,
            )
        deleted = q.delete_queue(queue, force=force, batch=batch)
    finally:
        q.close()
    if as_json:
        print_json({"queue": queue, "deleted": deleted})
        return
    console.print(f"deleted queue [bold]{escape(queue)}[/] and {deleted} task(s)")
