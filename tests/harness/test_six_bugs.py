"""The six bug classes: the harness catches every broken example and passes every fixed one.

The fast profile (CI) catches each broken example within 50 seeds on memory, runs each fixed
example over 30 seeds on memory and 3 on every store. ``AGENTLEASE_DEEP=1`` runs the fixed
examples over 300 seeds on memory and 30 on every store.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from agentlease.harness import CHECKERS, explore, load_scenario, run_seed
from tests.conftest import Store

# One worker runs the harness's tests, one at a time: they are CPU-bound in bursts, and the
# lease-timed tests on the other workers need the cores.
pytestmark = pytest.mark.xdist_group("harness")

DEEP = os.environ.get("AGENTLEASE_DEEP") == "1"
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "six_bugs"
# Each class, and the checker that must catch its broken example.
CLASSES = {
    "lost_update": {"monotonic"},
    "duplicate_side_effect": {"created_once"},
    "write_skew": {"spend_within_budget"},
    "deadlock": {"completions", "locks_released"},
    "retry_storm": {"spend_within_budget"},
    "context_divergence": {"facts_agree"},
}
CATCH_WITHIN = 50
MEMORY_SEEDS = 300 if DEEP else 30
STORE_SEEDS = 30 if DEEP else 3


def spec(name: str, variant: str) -> str:
    return f"{EXAMPLES / name}.py:{variant}"


@pytest.mark.parametrize("name", CLASSES)
def test_the_harness_catches_the_broken_example(name: str) -> None:
    summary = explore(spec(name, "BROKEN"), range(CATCH_WITHIN), processes=0, stop_at_first=True)
    assert summary.first_failure is not None, f"{name}: no seed of {CATCH_WITHIN} caught it"
    assert set(summary.checkers) & CLASSES[name], summary.checkers
    finding = summary.finding
    assert finding is not None
    report = finding.report(load_scenario(spec(name, "BROKEN")))
    assert "VIOLATION" in report
    assert f"--seed {finding.seed}" in report


@pytest.mark.parametrize("name", CLASSES)
def test_the_fixed_example_passes_every_seed_on_memory(name: str) -> None:
    summary = explore(spec(name, "FIXED"), range(MEMORY_SEEDS), processes=0, shrink_first=True)
    assert summary.errors == 0
    if summary.finding is not None:
        pytest.fail(summary.finding.report(load_scenario(spec(name, "FIXED"))))
    assert summary.failed == []


@pytest.mark.parametrize("name", CLASSES)
def test_the_fixed_example_passes_on_every_store(name: str, store: Store) -> None:
    scenario = load_scenario(spec(name, "FIXED"))
    for seed in range(STORE_SEEDS):
        outcome = run_seed(scenario, seed, store=store.url)
        assert outcome.error is None, f"seed {seed}: {outcome.error}"
        for v in outcome.violations:
            pytest.fail(v.format(seed=seed))


# Every checker in turn is covered by tests/unit/test_harness_checkers.py; these are the ones
# the examples lean on.
@pytest.mark.parametrize("checker", sorted({c for cs in CLASSES.values() for c in cs}))
def test_disabling_a_checker_the_examples_need_lets_a_broken_example_through(
    checker: str,
) -> None:
    mutated = {k: v for k, v in CHECKERS.items() if k != checker}
    for name, checkers in CLASSES.items():
        if checker not in checkers:
            continue
        scenario = load_scenario(spec(name, "BROKEN"))
        blind = dataclasses.replace(scenario, checkers=mutated)
        for seed in range(CATCH_WITHIN):
            if run_seed(scenario, seed).violations and not run_seed(blind, seed).violations:
                return  # this seed's bug escapes the mutated suite
    pytest.fail(f"with {checker} disabled every broken example is still caught")
