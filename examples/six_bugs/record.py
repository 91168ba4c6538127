"""Record the trace of each example: its planner's responses, task by task, step by step.

The planner of an example stands in for the model of a real run (a scripted plan, so the
examples need no model and no network). ``python examples/six_bugs/record.py`` writes
``traces/<example>.jsonl``; the harness then replays those responses with the plan pinned.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from agentlease.harness import Recorder

HERE = Path(__file__).parent
EXAMPLES = [
    "lost_update",
    "duplicate_side_effect",
    "write_skew",
    "deadlock",
    "retry_storm",
    "context_divergence",
]
MAX_STEPS = 50


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"six_bugs_{name}", HERE / f"{name}.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(name: str) -> Path:
    """Record one example's trace and return its path."""
    module = _load(name)
    recorder = Recorder(meta={"example": name})
    model = recorder.model(module.planner, name="planner")
    for task in module.TASKS:
        with recorder.task(task):
            for n in range(1, MAX_STEPS + 1):
                if model(task, f"m{n}").get("action") == "done":
                    break
    recorder.save(module.TRACE)
    return Path(module.TRACE)


if __name__ == "__main__":
    for name in sys.argv[1:] or EXAMPLES:
        if (HERE / f"{name}.py").exists():
            print(record(name))
