"""The harness commands: ``explore`` many seeds, ``replay`` one, ``check`` a history file."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentlease.cli._app import cli, console, new_table, reports_errors
from agentlease.harness.checkers import check
from agentlease.harness.history import History
from agentlease.harness.run import run_seed
from agentlease.harness.runner import (
    DEFAULT_SEEDS,
    Summary,
    explore,
    load_scenario,
    replay_command,
)

__all__ = ["check_history", "explore_command", "replay"]

FAILED_STATUS = 1  # a violation was found (2 is kept for refusals and bad input)


def _summary_table(s: Summary) -> Table:
    table = new_table(title=escape(f"{s.scenario} on {s.store}"))
    for column in ("seeds", "failed", "first fail", "checkers", "faults", "seeds/min"):
        justify: Literal["left", "right"] = "left" if column == "checkers" else "right"
        table.add_column(column, justify=justify, overflow="fold")
    lines = [f"{name} x{n}" for name, n in sorted(s.checkers.items())]
    if s.errors:
        lines.append(f"system raised x{s.errors}")
    checkers = "\n".join(lines) or "-"
    table.add_row(
        str(s.seeds),
        str(len(s.failed)),
        "-" if not s.failed else str(s.failed[0]),
        checkers,
        str(s.faults_fired),
        f"{s.seeds_per_minute:.0f}",
    )
    return table


@cli.command("explore")
@click.argument("scenario")
@click.option("--seeds", default=DEFAULT_SEEDS, show_default=True, help="How many seeds.")
@click.option("--first-seed", default=0, show_default=True, help="The first seed.")
@click.option("--store", default="memory://", show_default=True, help="Store URL.")
@click.option("--processes", type=int, default=None, help="Worker processes (default: cores).")
@click.option("--stop-at-first", is_flag=True, help="Stop at the first failing seed.")
@click.option("--no-shrink", is_flag=True, help="Do not shrink the first failing seed.")
@reports_errors
def explore_command(
    scenario: str,
    seeds: int,
    first_seed: int,
    store: str,
    processes: int | None,
    stop_at_first: bool,
    no_shrink: bool,
) -> None:
    """Run SCENARIO (FILE.py:NAME or MODULE:NAME) over many seeds and check every history.

    Prints a summary, and for the first failing seed the shrunk fault schedule, its minimal
    witness and the command that replays it. Exits 1 if any seed failed.
    """
    loaded = load_scenario(scenario)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("[red]{task.fields[failed]} failed"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        bar = progress.add_task(loaded.name, total=seeds, failed=0)
        failed = 0

        def on_seed(seed: int, bad: bool) -> None:
            nonlocal failed
            failed += bad
            progress.update(bar, advance=1, failed=failed)

        summary = explore(
            scenario,
            range(first_seed, first_seed + seeds),
            store=store,
            processes=processes,
            stop_at_first=stop_at_first,
            shrink_first=not no_shrink,
            on_seed=on_seed,
        )
    console.print(_summary_table(summary))
    if summary.finding is not None:
        f = summary.finding
        console.print(
            f"seed {f.seed} shrunk to {len(f.outcome.fired)} fault(s) in {f.runs} run(s):",
            highlight=False,
            soft_wrap=True,
        )
        console.print(f.report(loaded), markup=False, highlight=False, soft_wrap=True)
    elif summary.failed:
        seed = summary.failed[0]
        console.print(
            f"replay: {replay_command(loaded, seed, store, None)}", markup=False, soft_wrap=True
        )
    if summary.failed:
        raise click.exceptions.Exit(FAILED_STATUS)


@cli.command()
@click.argument("trace", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--system", "spec", required=True, help="The scenario: FILE.py:NAME or MODULE:NAME.")
@click.option("--seed", type=int, required=True, help="The seed to replay.")
@click.option("--faults", default=None, help="Exactly these faults (SITE@KEY,...; 'none').")
@click.option("--store", default="memory://", show_default=True, help="Store URL.")
@click.option(
    "--history",
    "history_out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the run's history to this file.",
)
@click.option("--timeline", is_flag=True, help="Print every op of the history.")
@reports_errors
def replay(
    trace: Path | None,
    spec: str,
    seed: int,
    faults: str | None,
    store: str,
    history_out: Path | None,
    timeline: bool,
) -> None:
    """Replay one run of a scenario with TRACE's plan pinned (default: the scenario's trace).

    Exits 1 if a checker found a violation.
    """
    scenario = load_scenario(spec)
    if trace is not None:
        scenario = dataclasses.replace(scenario, trace=trace)
    only = None
    if faults is not None:
        only = [] if faults.strip() in ("", "none") else [f.strip() for f in faults.split(",")]
    outcome = run_seed(scenario, seed, store=store, only=only)
    if history_out is not None:
        outcome.history.dump(history_out)
    if timeline:
        for op in outcome.history.ops:
            console.print(op.describe(), markup=False, highlight=False, soft_wrap=True)
    console.print(
        f"{scenario.name}, seed {seed} on {store}: {len(outcome.history)} ops, "
        f"faults: {', '.join(outcome.fired) or 'none'}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    command = replay_command(scenario, seed, store, outcome.fired)
    for v in outcome.violations:
        console.print(
            v.format(seed=seed, replay=command), markup=False, highlight=False, soft_wrap=True
        )
    if outcome.error is not None:
        console.print(f"the system under test raised {outcome.error}", markup=False, soft_wrap=True)
    if outcome.failed:
        raise click.exceptions.Exit(FAILED_STATUS)
    console.print("no violation", style="green")


@cli.command("check")
@click.argument("history", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@reports_errors
def check_history(history: Path) -> None:
    """Run the checkers on a HISTORY file (JSON lines, recorded here or elsewhere).

    Exits 1 if a checker found a violation.
    """
    loaded = History.load(history)
    violations = check(loaded)
    for v in violations:
        console.print(
            v.format(seed=loaded.meta.get("seed")), markup=False, highlight=False, soft_wrap=True
        )
    if violations:
        raise click.exceptions.Exit(FAILED_STATUS)
    console.print(f"{len(loaded)} ops, no violation", style="green")
