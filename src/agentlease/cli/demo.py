"""``agentlease demo``: the crash-and-zombie scenario, live, with a checked report.

N worker processes run M tasks; K are SIGKILLed mid-task and F are frozen with SIGSTOP past their
lease, then resumed with SIGCONT. The report checks every invariant against the store and against
an independent ledger of what the handlers did; the exit status is 0 only if all held.
"""

from __future__ import annotations

import sys

import click
import orjson
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentlease._demo.scenario import DemoConfig, DemoReport, run_demo
from agentlease.cli._app import cli, console, err_console, new_table, plain
from agentlease.errors import AgentLeaseError


@cli.command()
@click.option("--backend", "url", default=None, help="Store URL (default: SQLite in a temp dir).")
@click.option("--workers", default=20, show_default=True, help="Worker processes.")
@click.option("--tasks", default=200, show_default=True, help="Tasks to run.")
@click.option("--kill", default=3, show_default=True, help="Workers to SIGKILL mid-task.")
@click.option("--freeze", default=2, show_default=True, help="Workers to SIGSTOP past their lease.")
@click.option("--lease-for", default=2.0, show_default=True, help="Lease length in seconds.")
@click.option("--seed", default=0, show_default=True, help="Seed of task lengths and victims.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--keep", is_flag=True, help="On Redis or PostgreSQL, keep the demo's key prefix or schema."
)
def demo(
    url: str | None,
    workers: int,
    tasks: int,
    kill: int,
    freeze: int,
    lease_for: float,
    seed: int,
    as_json: bool,
    keep: bool,
) -> None:
    """Run many workers, kill and freeze some, and check that nothing ran twice or was lost.

    On Redis or PostgreSQL the demo runs in a key prefix or schema of its own and removes it
    afterwards (--keep keeps it), unless the URL names its own prefix= or schema=, which it uses
    as it is; without --backend it runs on SQLite in a temp dir."""
    try:
        config = DemoConfig(
            url=url,
            workers=workers,
            tasks=tasks,
            kill=kill,
            freeze=freeze,
            lease_for=lease_for,
            seed=seed,
            keep=keep,
        )
        report = run_demo(config) if as_json else _run_live(config)
    except AgentLeaseError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        sys.exit(2)
    if as_json:
        click.echo(orjson.dumps(report.as_json()).decode())
    else:
        _print(report)
    sys.exit(0 if report.ok else 1)


def _run_live(config: DemoConfig) -> DemoReport:
    console.print(
        f"[bold]agentlease demo[/bold]: {config.workers} worker processes, {config.tasks} tasks, "
        f"SIGKILL {config.kill}, SIGSTOP {config.freeze}, lease {config.lease_for}s"
    )
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("completed", total=config.tasks)

        def progress(done: int, total: int, message: str) -> None:
            bar.update(task, completed=done, total=total)
            if message:
                bar.console.print(f"  {escape(message)}")

        return run_demo(config, progress)


def _print(report: DemoReport) -> None:
    table = new_table(title="invariants", show_lines=False)
    table.add_column("", width=2)
    table.add_column("invariant")
    table.add_column("evidence", overflow="fold")
    for c in report.checks:
        mark = ("ok" if c.ok else "NO") if plain() else ("✓" if c.ok else "✗")
        table.add_row(f"[{'green' if c.ok else 'red'}]{mark}[/]", escape(c.name), escape(c.detail))
    console.print(table)
    f = report.figures
    console.print(
        f"{f['completed']}/{f['tasks']} completed, {f['lost']} lost, "
        f"{f['duplicate_completions']} duplicate completions, {f['reaped']} reaped, "
        f"{f['zombie_writes_rejected']} zombie writes rejected, slowest recovery "
        f"{f['recovery_seconds_max']}s, {f['elapsed_seconds']}s in all"
    )
    console.print(f"store: {escape(str(f['backend']))}")
    verdict = "[green]every invariant held[/green]" if report.ok else "[red]INVARIANT BROKEN[/red]"
    console.print(verdict)
