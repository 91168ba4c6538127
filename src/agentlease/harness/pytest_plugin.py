"""The harness in pytest: the ``agentlease_harness`` fixture and the ``agentlease_scenario`` marker.

Installed as a pytest plugin (entry point ``pytest11``), so it loads in every pytest run of every
project that installs agentlease: it imports only pytest here, and the harness, Hypothesis-free
as it is, and the stores only when a test uses the fixture or the marker.

Use::

    @pytest.mark.agentlease_scenario("tests/scenarios.py:CHECKOUT", seeds=100)
    def test_checkout_survives_faults() -> None:
        pass  # the marker runs the seeds first; a violation fails the test with its witness

    def test_checkout(agentlease_harness) -> None:
        agentlease_harness.assert_holds("tests/scenarios.py:CHECKOUT", seeds=100)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from agentlease.harness.runner import Summary

__all__ = ["Harness", "agentlease_harness"]


class Harness:
    """Run scenarios over seeds from a test; a failure fails the test with the minimal witness.

    Args:
        processes: worker processes per exploration (0: in the test's own process).
    """

    def __init__(self, processes: int | None = 0) -> None:
        self.processes = processes

    def explore(
        self, spec: str, *, seeds: int | Iterable[int] = 50, store: str = "memory://"
    ) -> Summary:
        """Run ``spec`` over ``seeds`` (a count or the seeds) and return the summary."""
        from agentlease.harness.runner import explore

        chosen = range(seeds) if isinstance(seeds, int) else seeds
        return explore(spec, chosen, store=store, processes=self.processes)

    def assert_holds(
        self, spec: str, *, seeds: int | Iterable[int] = 50, store: str = "memory://"
    ) -> Summary:
        """Fail the test if any seed breaks a checker, with the shrunk witness and its replay."""
        from agentlease.harness.runner import load_scenario

        summary = self.explore(spec, seeds=seeds, store=store)
        if summary.failed:
            detail = ""
            if summary.finding is not None:
                detail = summary.finding.report(load_scenario(spec))
            pytest.fail(
                f"{summary.scenario}: {len(summary.failed)} of {summary.seeds} seeds failed "
                f"(first: seed {summary.failed[0]})\n{detail}",
                pytrace=False,
            )
        return summary

    def assert_finds(
        self, spec: str, *, seeds: int | Iterable[int] = 50, store: str = "memory://"
    ) -> Summary:
        """Fail the test unless some seed breaks a checker (for a system known to be broken)."""
        summary = self.explore(spec, seeds=seeds, store=store)
        if not summary.failed:
            pytest.fail(
                f"{summary.scenario}: no seed of {summary.seeds} found a violation",
                pytrace=False,
            )
        return summary


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker."""
    config.addinivalue_line(
        "markers",
        "agentlease_scenario(spec, seeds=50, store='memory://'): run an agentlease harness "
        "scenario over seeds before the test; a violation fails it with the minimal witness",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """Run the scenario of an ``agentlease_scenario`` marker before the test's body."""
    marker = item.get_closest_marker("agentlease_scenario")
    if marker is not None:
        kwargs: dict[str, Any] = dict(marker.kwargs)
        processes = kwargs.pop("processes", 0)
        Harness(processes).assert_holds(*marker.args, **kwargs)


@pytest.fixture
def agentlease_harness() -> Harness:
    """A :class:`Harness` running seeds in the test's own process."""
    return Harness()
