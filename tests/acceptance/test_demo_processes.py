"""The article's scenarios with real worker processes: the proof, crashes, zombies, on SQLite,
Redis, Redis Cluster and PostgreSQL.

Each test runs the demo scenario (``agentlease._demo``) and asserts on its report, which is
checked against the store and against an independent ledger of what the handlers did. One seed
by default; AGENTLEASE_DEEP=1 explores several.
"""

from __future__ import annotations

import os

import pytest

from agentlease._demo.scenario import DemoConfig, run_demo
from tests.conftest import BACKENDS

# Many real processes (SIGKILL, SIGSTOP) on short leases: the "processes" group runs one test at
# a time on one xdist worker, so they starve neither each other nor the servers' connections.
pytestmark = pytest.mark.xdist_group("processes")

SEEDS = list(range(5)) if os.environ.get("AGENTLEASE_DEEP") == "1" else [0]
KINDS = [k for k in BACKENDS if k != "memory"]  # the demo's workers are separate processes


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest) -> str | None:
    """The store of one run: None for SQLite in a temp dir, else a fresh namespace."""
    if request.param == "sqlite":
        return None
    value: str = request.getfixturevalue("served_url_" + request.param.replace("-", "_"))
    return value


def failed(report_checks: list[object]) -> list[object]:
    return [c for c in report_checks if not c.ok]  # type: ignore[attr-defined]


@pytest.mark.slow
def test_twenty_processes_two_hundred_tasks_each_claimed_and_completed_once(
    url: str | None,
) -> None:
    report = run_demo(DemoConfig(url=url, workers=20, tasks=200, kill=0, freeze=0, lease_for=5.0))
    f = report.figures
    assert report.ok, failed(report.checks)
    assert f["completed"] == 200
    assert f["claims"] == 200, "every task claimed exactly once"
    assert f["tasks_claimed_more_than_once"] == 0
    assert f["duplicate_completions"] == 0
    assert f["reaped"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_sigkilled_workers_lose_nothing_and_run_nothing_twice(url: str | None, seed: int) -> None:
    report = run_demo(
        DemoConfig(url=url, workers=8, tasks=60, kill=3, freeze=0, lease_for=1.5, seed=seed)
    )
    f = report.figures
    assert report.ok, failed(report.checks)
    assert f["killed"] == 3
    assert f["lost"] == 0
    assert f["completed"] == 60
    assert f["duplicate_completions"] == 0
    assert f["reaped"] >= 3, "each killed worker's task was reaped"
    assert f["tasks_claimed_more_than_once"] >= 3


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_frozen_workers_writes_are_all_rejected_after_their_lease_is_reaped(
    url: str | None, seed: int
) -> None:
    report = run_demo(
        DemoConfig(url=url, workers=6, tasks=40, kill=0, freeze=2, lease_for=1.5, seed=seed)
    )
    f = report.figures
    assert report.ok, failed(report.checks)
    assert f["frozen"] == 2
    assert f["zombie_writes_rejected"] >= 2, "each resumed worker tried a write and was refused"
    assert f["zombie_writes_accepted"] == 0
    assert f["duplicate_completions"] == 0
    assert f["completed"] == 40


@pytest.mark.slow
def test_demo_refuses_memory_backend() -> None:
    from agentlease.errors import InvalidInput

    with pytest.raises(InvalidInput, match="memory://"):
        DemoConfig(url="memory://")
