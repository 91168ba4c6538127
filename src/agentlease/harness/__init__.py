"""The fault-injection harness: find concurrency bugs on purpose.

Record a trace of a run (model responses and tool calls, :class:`Recorder`), replay it with the
plan pinned (:class:`ReplayModel`), inject faults into the execution, never into the plan
(:mod:`agentlease.harness.faults`), run many seeds (:func:`explore`), and check invariants over
the history of what the simulated world did rather than over outputs (:func:`check`). A failing
seed is shrunk to a minimal fault schedule and printed with its witness and the command that
replays it.

The pieces:

* :mod:`~agentlease.harness.history`: the Jepsen-shaped history (invoke, then ok / fail / info).
* :mod:`~agentlease.harness.checkers`: the checkers over a history, from here or elsewhere.
* :mod:`~agentlease.harness.trace`: recording traces and replaying model responses.
* :mod:`~agentlease.harness.faults`: seeded fault sites (tool, process and store faults).
* :mod:`~agentlease.harness.run`: one run of a scenario (agents leasing tasks, a verdict).
* :mod:`~agentlease.harness.runner`: many seeds in processes, shrinking, replay commands.
* :mod:`~agentlease.harness.pytest_plugin`: the pytest fixture and marker.

Names are imported on first use (:pep:`562`): the pytest plugin lives in this package and loads
in every pytest run, so importing the package loads nothing but the package.
"""

from importlib import import_module as _import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentlease.harness.checkers import CHECKERS, Checker, Violation, check
    from agentlease.harness.faults import Faults, Fired, ResponseLost, ToolCall
    from agentlease.harness.history import History, Op
    from agentlease.harness.run import Agent, Outcome, Run, Scenario, run_seed
    from agentlease.harness.runner import Finding, Summary, explore, load_scenario, shrink
    from agentlease.harness.trace import Recorder, ReplayModel, Trace

_LAZY = {
    "CHECKERS": "agentlease.harness.checkers",
    "Checker": "agentlease.harness.checkers",
    "Violation": "agentlease.harness.checkers",
    "check": "agentlease.harness.checkers",
    "Faults": "agentlease.harness.faults",
    "Fired": "agentlease.harness.faults",
    "ResponseLost": "agentlease.harness.faults",
    "ToolCall": "agentlease.harness.faults",
    "History": "agentlease.harness.history",
    "Op": "agentlease.harness.history",
    "Agent": "agentlease.harness.run",
    "Outcome": "agentlease.harness.run",
    "Run": "agentlease.harness.run",
    "Scenario": "agentlease.harness.run",
    "run_seed": "agentlease.harness.run",
    "Finding": "agentlease.harness.runner",
    "Summary": "agentlease.harness.runner",
    "explore": "agentlease.harness.runner",
    "load_scenario": "agentlease.harness.runner",
    "shrink": "agentlease.harness.runner",
    "Recorder": "agentlease.harness.trace",
    "ReplayModel": "agentlease.harness.trace",
    "Trace": "agentlease.harness.trace",
}

__all__ = [
    "CHECKERS",
    "Agent",
    "Checker",
    "Faults",
    "Finding",
    "Fired",
    "History",
    "Op",
    "Outcome",
    "Recorder",
    "ReplayModel",
    "ResponseLost",
    "Run",
    "Scenario",
    "Summary",
    "ToolCall",
    "Trace",
    "Violation",
    "check",
    "explore",
    "load_scenario",
    "run_seed",
    "shrink",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
