"""Many seeds in parallel processes, a summary, and the shrinking of a failing schedule.

:func:`explore` runs a scenario over many seeds (300 by default) in worker processes, with a
progress bar and a summary table (seeds, failures, the checkers that fired, seeds per minute).
For the first failing seed it shrinks the fault schedule by delta debugging (ddmin over the
faults that fired: keep the smallest subset that still breaks the same checker, then try
removing each fault alone), and prints the minimal witness and the exact command that replays
it: ``agentlease replay TRACE --system NAME --seed S --faults ...``.

Scenarios are named by a spec (``path/to/file.py:NAME`` or ``module:NAME``) so that worker
processes load them for themselves; what comes back from a worker is JSON.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from agentlease.errors import InvalidInput
from agentlease.harness.run import Outcome, Scenario, run_seed

__all__ = ["Finding", "Summary", "explore", "load_scenario", "replay_command", "shrink"]

DEFAULT_SEEDS = 300
_MAX_SHRINK_RUNS = 80


def load_scenario(spec: str) -> Scenario:
    """The scenario named by ``path/to/file.py:NAME`` or ``package.module:NAME``.

    Raises:
        InvalidInput: the spec does not name a :class:`Scenario`.
    """
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise InvalidInput(f"a scenario is FILE.py:NAME or MODULE:NAME, not {spec!r}")
    if where.endswith(".py"):
        path = Path(where).resolve()
        if not path.is_file():
            raise InvalidInput(f"no scenario file {where!r}")
        module_name = f"agentlease_scenario_{abs(hash(str(path)))}"
        module = sys.modules.get(module_name)
        if module is None:
            loader = importlib.util.spec_from_file_location(module_name, path)
            if loader is None or loader.loader is None:
                raise InvalidInput(f"cannot import {where!r}")
            module = importlib.util.module_from_spec(loader)
            sys.modules[module_name] = module
            loader.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    scenario = getattr(module, name, None)
    if not isinstance(scenario, Scenario):
        raise InvalidInput(f"{spec!r} is not a Scenario (found {type(scenario).__name__})")
    if scenario.spec is None:
        object.__setattr__(scenario, "spec", spec)
    return scenario


def replay_command(scenario: Scenario, seed: int, store: str, faults: Sequence[str] | None) -> str:
    """The command that replays one run."""
    if scenario.trace is not None and scenario.spec is not None:
        head = f"agentlease replay {_shown(scenario.trace)} --system {scenario.spec}"
    else:
        head = f"agentlease replay --system {scenario.spec or scenario.name}"
    parts = [head, f"--seed {seed}"]
    if store != "memory://":
        parts.append(f"--store {store}")
    if faults is not None:
        parts.append(f"--faults {','.join(faults) or 'none'}")
    return " ".join(parts)


def _shown(path: Path) -> str:
    """A path as a command line shows it: relative to here when it is below here."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@dataclass
class Finding:
    """A failing seed, shrunk: the minimal schedule and its witness."""

    seed: int
    outcome: Outcome
    runs: int  # runs the shrinking took

    def report(self, scenario: Scenario) -> str:
        """The witness of each violation and the command that replays it."""
        o = self.outcome
        replay = replay_command(scenario, o.seed, o.store, o.fired)
        if o.error is not None and not o.violations:
            return f"the system under test raised {o.error}\nreplay: {replay}"
        found = "\n\n".join(v.format(seed=o.seed, replay=replay) for v in o.violations)
        if not o.fired:
            found = (
                f"seed {o.seed} needs no injected fault: the interleaving it draws (think times, "
                "latencies, who claims what) is enough\n\n" + found
            )
        return found


@dataclass
class Summary:
    """What a many-seed exploration found."""

    scenario: str
    store: str
    seeds: int = 0
    failed: list[int] = field(default_factory=list)
    checkers: Counter[str] = field(default_factory=Counter)
    errors: int = 0
    elapsed: float = 0.0
    faults_fired: int = 0
    finding: Finding | None = None

    @property
    def seeds_per_minute(self) -> float:
        """Seeds run per minute of wall-clock time."""
        return 60.0 * self.seeds / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def first_failure(self) -> int | None:
        """The number of seeds it took to find the first failure (1-based), or ``None``."""
        return None if not self.failed else min(self.failed) + 1


def shrink(scenario: Scenario, failing: Outcome, *, budget: int = _MAX_SHRINK_RUNS) -> Finding:
    """The smallest fault schedule of ``failing``'s seed that still breaks the same checker.

    Delta debugging (ddmin) over the faults that fired, then one-at-a-time removal; every
    candidate is run with exactly its faults (``only``). On ``memory://`` each candidate is
    deterministic; elsewhere a candidate that passes by luck only keeps a larger schedule.
    """
    target = {v.checker for v in failing.violations}
    runs = 0
    best = failing

    def breaks(faults: list[str]) -> Outcome | None:
        nonlocal runs
        runs += 1
        o = run_seed(scenario, failing.seed, store=failing.store, only=faults)
        hit = {v.checker for v in o.violations} & target if target else o.error is not None
        return o if hit else None

    faults = list(failing.fired)
    none = breaks([])
    if none is not None:
        return Finding(failing.seed, none, runs)
    chunks = 2
    while len(faults) >= 2 and runs < budget:
        size = max(1, len(faults) // chunks)
        parts = [faults[i : i + size] for i in range(0, len(faults), size)]
        reduced = False
        for i, part in enumerate(parts):
            for candidate in (part, [f for j, p in enumerate(parts) if j != i for f in p]):
                if runs >= budget or not candidate or len(candidate) >= len(faults):
                    continue
                o = breaks(candidate)
                if o is not None:
                    faults, best, reduced = candidate, o, True
                    chunks = max(2, chunks - 1) if candidate is not part else 2
                    break
            if reduced:
                break
        if not reduced:
            if chunks >= len(faults):
                break
            chunks = min(len(faults), chunks * 2)
    for f in list(faults):
        if runs >= budget or len(faults) <= 1:
            break
        candidate = [g for g in faults if g != f]
        o = breaks(candidate)
        if o is not None:
            faults, best = candidate, o
    if best is failing and failing.only is None:
        o = breaks(faults)  # the same schedule, given explicitly: what the command replays
        best = o if o is not None else failing
    return Finding(failing.seed, best, runs)


# -- worker processes ---------------------------------------------------------------------------

_LOADED: dict[str, Scenario] = {}  # the scenario of this worker process


def _load(spec: str) -> None:
    _LOADED["scenario"] = load_scenario(spec)


def _one(seed: int, store: str) -> bytes:
    try:
        o = run_seed(_LOADED["scenario"], seed, store=store)
    except Exception as exc:  # the harness itself failed on this seed: report it with the seed
        error = f"the run failed: {type(exc).__name__}: {exc}"
        return orjson.dumps({"seed": seed, "checkers": [], "error": error, "fired": 0})
    return orjson.dumps(
        {
            "seed": seed,
            "checkers": sorted({v.checker for v in o.violations}),
            "error": o.error,
            "fired": len(o.fired),
        }
    )


def explore(
    spec: str,
    seeds: Iterable[int] = range(DEFAULT_SEEDS),
    *,
    store: str = "memory://",
    processes: int | None = None,
    stop_at_first: bool = False,
    shrink_first: bool = True,
    on_seed: Callable[[int, bool], None] | None = None,
) -> Summary:
    """Run the scenario ``spec`` over ``seeds`` in ``processes`` worker processes.

    Args:
        spec: the scenario (``file.py:NAME`` or ``module:NAME``).
        seeds: the seeds to run.
        store: ``memory://`` (virtual time) or a store URL.
        processes: worker processes (default: the machine's cores; 0 runs in this process).
        stop_at_first: stop at the first failing seed.
        shrink_first: shrink the first failing seed and keep its :class:`Finding`.
        on_seed: called with (seed, failed) as each seed ends (a progress bar).
    """
    scenario = load_scenario(spec)
    seeds = list(seeds)
    summary = Summary(scenario.name, store)
    started = time.perf_counter()

    def account(data: dict[str, Any]) -> bool:
        failed = bool(data["checkers"]) or data["error"] is not None
        summary.seeds += 1
        summary.faults_fired += data["fired"]
        summary.checkers.update(data["checkers"])
        if data["error"] is not None:
            summary.errors += 1
        if failed:
            summary.failed.append(data["seed"])
        if on_seed is not None:
            on_seed(data["seed"], failed)
        return failed

    workers = (os.cpu_count() or 2) if processes is None else processes
    if workers <= 0:
        _load(spec)
        for seed in seeds:
            if account(orjson.loads(_one(seed, store))) and stop_at_first:
                break
    else:
        with ProcessPoolExecutor(workers, initializer=_load, initargs=(spec,)) as pool:
            futures = [pool.submit(_one, seed, store) for seed in seeds]
            for future in as_completed(futures):
                if account(orjson.loads(future.result())) and stop_at_first:
                    for f in futures:
                        f.cancel()
                    break
    summary.elapsed = time.perf_counter() - started
    summary.failed.sort()
    if summary.failed and shrink_first:
        first = run_seed(scenario, summary.failed[0], store=store)
        if first.failed:
            summary.finding = shrink(scenario, first)
    return summary
