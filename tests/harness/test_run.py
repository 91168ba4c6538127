"""Runs of a scenario: determinism on memory, one fault schedule on every store, shrinking,
replay commands, the CLI and the pytest plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentlease.cli import cli
from agentlease.harness import History, load_scenario, run_seed, shrink
from agentlease.harness.runner import explore, replay_command
from tests.conftest import Store
from tests.harness.test_six_bugs import CLASSES, spec

# One worker runs the harness's tests, one at a time (see test_six_bugs.py).
pytestmark = pytest.mark.xdist_group("harness")

ROOT = Path(__file__).resolve().parents[2]
LOST = f"{ROOT}/examples/six_bugs/lost_update.py"
BROKEN, FIXED = f"{LOST}:BROKEN", f"{LOST}:FIXED"


def _ops(history: History) -> list[dict[str, object]]:
    return [op.to_json() for op in history.ops]


EVERY_EXAMPLE = [spec(name, variant) for name in CLASSES for variant in ("BROKEN", "FIXED")]


@pytest.mark.parametrize("spec", EVERY_EXAMPLE)
def test_on_memory_a_seed_replays_the_same_interleaving_and_verdict(spec: str) -> None:
    scenario = load_scenario(spec)
    for seed in range(8):
        first, second = run_seed(scenario, seed), run_seed(scenario, seed)
        assert _ops(first.history) == _ops(second.history)
        assert first.fired == second.fired
        assert [v.message for v in first.violations] == [v.message for v in second.violations]


def test_a_seed_draws_the_same_fault_schedule_on_every_store(store: Store) -> None:
    scenario = load_scenario(FIXED)
    schedules = []
    for seed in range(4):
        # A long lease: a loaded machine must not reclaim a task and so change the attempts.
        memory = run_seed(scenario, seed, lease_for=2.0)
        there = run_seed(scenario, seed, store=store.url, lease_for=2.0)
        assert there.fired == memory.fired, f"seed {seed}"
        assert not there.violations, there.violations[0].format(seed=seed)
        schedules.append(memory.fired)
    assert any(schedules)  # some seed injects faults at all


def test_a_failing_seed_shrinks_to_a_schedule_that_still_fails() -> None:
    scenario = load_scenario(BROKEN)
    noisy = next(
        o for seed in range(200) if (o := run_seed(scenario, seed)).violations and len(o.fired) >= 3
    )
    finding = shrink(scenario, noisy)
    shrunk = finding.outcome
    assert len(shrunk.fired) < len(noisy.fired)
    assert {v.checker for v in shrunk.violations} & {v.checker for v in noisy.violations}
    again = run_seed(scenario, noisy.seed, only=shrunk.fired)
    assert [v.message for v in again.violations] == [v.message for v in shrunk.violations]
    report = finding.report(scenario)
    assert f"--seed {noisy.seed}" in report
    assert "VIOLATION" in report


def test_the_replay_command_replays_the_violation() -> None:
    scenario = load_scenario(BROKEN)
    outcome = next(o for seed in range(50) if (o := run_seed(scenario, seed)).violations)
    command = replay_command(scenario, outcome.seed, "memory://", outcome.fired)
    args = command.split()[1:]  # without the program name
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert outcome.violations[0].message in result.output
    assert f"seed: {outcome.seed}" in result.output


def test_replay_of_the_fixed_system_finds_nothing(tmp_path: Path) -> None:
    out = tmp_path / "h.jsonl"
    result = CliRunner().invoke(
        cli, ["replay", "--system", FIXED, "--seed", "2", "--history", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "no violation" in result.output
    checked = CliRunner().invoke(cli, ["check", str(out)])
    assert checked.exit_code == 0, checked.output
    assert History.load(out).meta["seed"] == 2


def test_check_reads_a_history_from_elsewhere(tmp_path: Path) -> None:
    h = History()
    h.world("effect", kind="email", resource="m1", step="s1", task="t1")
    h.world("effect", kind="email", resource="m2", step="s1", task="t1")
    h.dump(tmp_path / "h.jsonl")
    result = CliRunner().invoke(cli, ["check", str(tmp_path / "h.jsonl")])
    assert result.exit_code == 1
    assert "created_once" in result.output
    (tmp_path / "bad.jsonl").write_text("{}\n")
    refused = CliRunner().invoke(cli, ["check", str(tmp_path / "bad.jsonl")])
    assert refused.exit_code == 2
    assert "not an agentlease history" in refused.output


def test_explore_summarises_many_seeds_in_processes() -> None:
    summary = explore(FIXED, range(40), processes=2)
    assert summary.seeds == 40
    assert summary.failed == []
    assert summary.seeds_per_minute > 0
    broken = explore(BROKEN, range(40), processes=2)
    assert broken.failed
    assert broken.checkers["monotonic"] == len(broken.failed)
    assert broken.finding is not None
    assert broken.finding.seed == broken.failed[0]


def test_the_explore_command_prints_the_summary_and_the_witness() -> None:
    result = CliRunner().invoke(cli, ["explore", BROKEN, "--seeds", "30", "--processes", "0"])
    assert result.exit_code == 1, result.output
    for part in ("seeds/min", "monotonic", "shrunk to", "agentlease replay", "VIOLATION"):
        assert part in result.output
    ok = CliRunner().invoke(cli, ["explore", FIXED, "--seeds", "30", "--processes", "0"])
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize(
    "bad", ["nowhere.py:X", f"{LOST}:NOPE", f"{LOST}:planner", "no-colon", "agentlease:X"]
)
def test_a_bad_scenario_spec_is_refused_clearly(bad: str) -> None:
    result = CliRunner().invoke(cli, ["replay", "--system", bad, "--seed", "1"])
    assert result.exit_code == 2
    assert "error:" in result.output


def test_a_bad_fault_is_refused_clearly() -> None:
    result = CliRunner().invoke(
        cli, ["replay", "--system", FIXED, "--seed", "1", "--faults", "tool:price:melt@t1/s1/1"]
    )
    assert result.exit_code == 2
    assert "SITE@KEY" in result.output


def test_the_pytest_plugin_imports_nothing_heavy() -> None:
    code = (
        "import sys, agentlease.harness.pytest_plugin as p; "
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('hypothesis', 'redis', 'psycopg', 'rich') or m.startswith('agentlease.harness.') "
        "and m != 'agentlease.harness.pytest_plugin' or m.startswith('agentlease.backends')]; "
        "print(heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_the_pytest_plugin_fails_a_test_with_the_minimal_witness(tmp_path: Path) -> None:
    (tmp_path / "test_agents.py").write_text(
        textwrap.dedent(
            f"""
            import pytest

            @pytest.mark.agentlease_scenario({BROKEN!r}, seeds=30)
            def test_broken_marker():
                pass

            @pytest.mark.agentlease_scenario({FIXED!r}, seeds=30)
            def test_fixed_marker():
                pass

            def test_fixture(agentlease_harness):
                agentlease_harness.assert_finds({BROKEN!r}, seeds=30)
                agentlease_harness.assert_holds({FIXED!r}, seeds=30)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        check=False,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=240,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 2 passed" in run.stdout
    assert "VIOLATION monotonic" in run.stdout
    assert "agentlease replay" in run.stdout


def test_a_plan_that_diverges_from_the_trace_stops_the_run_loudly() -> None:
    from agentlease.harness import Agent, Run, Scenario

    lost = load_scenario(FIXED)

    async def greedy(run: Run) -> None:
        await run.enqueue("q", "t1")

        async def handler(agent: Agent) -> object:
            for _ in range(3):  # the trace holds two model responses for t1
                await agent.plan()
            return None

        await run.agents("q", handler)

    outcome = run_seed(Scenario("greedy", greedy, trace=lost.trace, faults=("delay",)), 0)
    assert outcome.failed
    assert outcome.error is not None
    assert outcome.error.startswith("PlanDiverged: the plan diverged at step m3 of task 't1'")


def test_a_system_that_never_finishes_is_stopped_at_its_time_limit() -> None:
    from agentlease.harness import Agent, Run, Scenario

    async def stuck(run: Run) -> None:
        await run.enqueue("q", "t1")

        async def handler(agent: Agent) -> object:
            await run.sleep(10_000)
            return None

        await run.agents("q", handler)

    outcome = run_seed(Scenario("stuck", stuck, time_limit=30), 0)
    assert [v.checker for v in outcome.violations] == ["completions"]
    assert "t1" in outcome.violations[0].message
    stop = [op for op in outcome.history.ops if op.f == "stop"]
    assert stop[0].time >= 30
