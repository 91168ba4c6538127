"""The agent-framework recipes under real crashes: worker processes on real stores, killed with
SIGKILL or frozen with SIGSTOP in the middle of an agent run.

Each worker is an :class:`agentlease.AsyncWorker` running one agent run per task, on the OpenAI
Agents SDK (``openai_agents.agent_handler`` and an ``@openai_agents.idempotent`` function tool)
or on Pydantic AI (an agent with the ``IdempotentTools`` capability); see
``tests/acceptance/_adapters_child.py``. The model replays its answer, as a recorded model does,
so a task's retry asks for the same tool call (same id) as its first attempt. The tool's side
effect is a line in a ledger the library never sees, with the key and fencing number a
downstream would be given. What is proven, as the README's "Idempotent side effects" promises:

- a worker SIGKILLed after the tool acted and its outcome was recorded, before the run
  completed: the task is reaped, the next attempt (another process) replays the call, and the
  task ends done once, with the first call's result in its final output; over several tasks and
  kills, every side effect happened exactly once (SQLite, Redis and PostgreSQL);
- a worker frozen (SIGSTOP) inside the tool, after reserving its key and before acting: the task
  is reaped, and once the frozen reservation's in-flight lease runs out the next attempt takes
  the call over with the next fencing number, acts, and completes the task. The frozen worker,
  resumed, acts late with its old fencing number (no library can stop a process that is not
  running), so a downstream that keeps the highest fence per key refuses it; its own outcome is
  never recorded, and its lease is lost.

One seed by default; AGENTLEASE_DEEP=1 repeats the kill scenario with several.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import agentlease as al
from tests.acceptance._adapters_child import LEASE, ORDER_AMOUNT
from tests.acceptance._idempotency_child import read_ledger
from tests.acceptance.test_idempotency_processes import Children, of, wait_stopped
from tests.conftest import require

# Many real processes on short leases: one test at a time, on one xdist worker.
pytestmark = pytest.mark.xdist_group("processes")

DEEP = os.environ.get("AGENTLEASE_DEEP") == "1"
SEEDS = list(range(4)) if DEEP else [0]
TASKS = 5
FAULTY = 2  # tasks whose first run is killed mid-run
WORKERS = 3  # worker processes, started together: at most FAULTY of them are killed
KILL_HOLD_FOR = 30.0  # never reached: the killed run's calls were recorded
STOP_HOLD_FOR = 1.5  # the frozen reservation's in-flight lease
MODULES = {"openai": ("agents", "openai-agents"), "pydantic": ("pydantic_ai", "pydantic-ai")}


class AgentWorkers(Children):
    """Worker processes running tests/acceptance/_adapters_child.py."""

    module = "tests.acceptance._adapters_child"


@contextmanager
def workers(tmp_path: Path) -> Iterator[AgentWorkers]:
    kids = AgentWorkers(tmp_path)
    try:
        yield kids
    finally:
        kids.reap()


@pytest.fixture
def store_url(request: pytest.FixtureRequest) -> str:
    """The store the test's processes share, named by the ``kind`` parameter."""
    kind = request.node.callspec.params["kind"]
    url: str = request.getfixturevalue(
        {"sqlite": "sqlite_url", "redis": "served_url_redis", "postgres": "served_url_postgres"}[
            kind
        ]
    )
    return url


def call_key(keys: al.Idempotency, task: str) -> str:
    """The key both adapters derive for the task's one call: the run's identity is the task the
    worker runs, the step is the call's id."""
    key, _ = keys.identity(
        "charge_order",
        {"order": task, "amount": ORDER_AMOUNT},
        step=f"call-{task}",
        task_id=task,
    )
    return key


def stored_value(framework: str, record: al.KeyRecord) -> Any:
    """The tool's output as the adapter stored it (Pydantic AI wraps it as ``{"return": ...}``)."""
    result = record.result
    if framework == "pydantic":
        assert isinstance(result, dict)
        result = result["return"]
    assert isinstance(result, str)
    return json.loads(result)


def final_output(task: al.Task) -> Any:
    assert isinstance(task.result, dict), task.result
    output = task.result["final_output"]
    assert isinstance(output, str), output
    return json.loads(output)


def spawn_worker(
    kids: AgentWorkers,
    framework: str,
    url: str,
    ledger: Path,
    flags: Path,
    hold_for: float,
    fault: str,
) -> subprocess.Popen[bytes]:
    return kids.spawn(framework, url, ledger, "billing", flags, str(hold_for), fault)


# -- SIGKILL after the tool's outcome is recorded --------------------------------------------------


KILL_CASES = [
    pytest.param(framework, kind, id=f"{framework}-{kind}")
    for framework in ("openai", "pydantic")
    for kind in ("sqlite", "redis", "postgres")
]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("framework", "kind"), KILL_CASES)
def test_workers_killed_mid_run_leave_every_tool_call_acted_once(
    framework: str, kind: str, store_url: str, tmp_path: Path, seed: int
) -> None:
    require(*MODULES[framework])
    url = store_url
    path, flags = tmp_path / "ledger.jsonl", tmp_path / "flags"
    flags.mkdir()
    tasks = [f"{framework}-{seed}-{i}" for i in range(TASKS)]
    faulty = set(random.Random(seed).sample(tasks, FAULTY))
    victims: dict[str, int] = {}  # faulty task -> the pid killed while running it
    with al.Queue.connect(url, settings=al.QueueSettings(lease_for=LEASE)) as queue:
        for task in tasks:
            queue.enqueue("billing", {"fault": task in faulty}, id=task)
        with workers(tmp_path) as kids:
            procs = {}
            for _ in range(WORKERS):
                p = spawn_worker(kids, framework, url, path, flags, KILL_HOLD_FOR, "kill")
                procs[p.pid] = p
            for _ in faulty:

                def blocked_anew() -> bool:
                    return any(b["task"] not in victims for b in of(read_ledger(path), "blocked"))

                kids.wait_for("a worker blocked mid-run", blocked_anew)
                block = next(
                    b for b in of(read_ledger(path), "blocked") if b["task"] not in victims
                )
                victim = procs.pop(block["pid"])
                victim.send_signal(signal.SIGKILL)
                assert kids.finish(victim) == -signal.SIGKILL
                victims[block["task"]] = victim.pid

            def all_done() -> bool:
                return all(queue.get(t).state in ("done", "dead") for t in tasks)

            kids.wait_for("every task to finish", all_done)
            kids.wait_for(
                "every worker ready", lambda: len(of(read_ledger(path), "ready")) == WORKERS
            )
            for p in procs.values():
                p.send_signal(signal.SIGTERM)
            for p in procs.values():
                assert kids.finish(p) == 0, kids.stderr()
        finished = {t: queue.get(t) for t in tasks}
    assert set(victims) == faulty
    lines = read_ledger(path)
    with al.Idempotency.connect(url) as keys:
        for task in tasks:
            check_task_once(framework, keys, finished[task], lines, victims.get(task))


def check_task_once(
    framework: str,
    keys: al.Idempotency,
    task: al.Task,
    lines: list[dict[str, Any]],
    victim: int | None,
) -> None:
    """One side effect for the task, keyed on the task and the call id; the task done once,
    with that effect's result; a killed run's retry replayed it."""
    assert task.state == "done", task.error_json
    key = call_key(keys, task.id)
    (effect,) = of(lines, "effect", task=task.id)  # exactly once, whatever was killed
    assert effect["key"] == key
    assert effect["fence"] == 1
    value = {k: effect[k] for k in ("order", "amount", "pid", "attempt", "key", "fence")}
    assert final_output(task) == value, "the final output carries the first call's result"
    record = keys.get(key)
    assert record is not None
    assert record.state == "done"
    assert record.fence == 1
    assert stored_value(framework, record) == value
    accepted = [r for r in of(lines, "returned", task=task.id) if r["attempt"] == task.attempt]
    assert [r["result"] for r in accepted] == [task.result]
    if victim is None:
        return
    # The victim acted and its outcome was recorded; it was killed before its run completed.
    assert effect["pid"] == victim
    (block,) = of(lines, "blocked", task=task.id)
    assert block["pid"] == victim
    assert block["attempt"] == effect["attempt"]
    assert of(lines, "returned", task=task.id, pid=victim) == []
    # The task was reaped and run again by another process, whose call replayed.
    assert task.attempt > effect["attempt"]
    assert task.reclaims >= 1
    assert accepted[0]["pid"] != victim


# -- SIGSTOP inside the tool, past both leases --------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["openai", "pydantic"])
def test_a_worker_frozen_inside_a_tool_is_taken_over_and_its_late_act_is_fenced(
    framework: str, sqlite_url: str, tmp_path: Path
) -> None:
    require(*MODULES[framework])
    url = sqlite_url
    path, flags = tmp_path / "ledger.jsonl", tmp_path / "flags"
    flags.mkdir()
    task_id = f"{framework}-frozen"
    with al.Queue.connect(url, settings=al.QueueSettings(lease_for=LEASE)) as queue:
        queue.enqueue("billing", {"fault": True}, id=task_id)
        with workers(tmp_path) as kids:
            procs = {}
            for _ in range(2):
                p = spawn_worker(kids, framework, url, path, flags, STOP_HOLD_FOR, "stop")
                procs[p.pid] = p
            kids.wait_for(
                "a worker frozen in the tool", lambda: bool(of(read_ledger(path), "frozen"))
            )
            (frozen,) = of(read_ledger(path), "frozen")
            zombie = procs[frozen["pid"]]
            (survivor,) = [p for p in procs.values() if p is not zombie]
            kids.wait_for("both workers ready", lambda: len(of(read_ledger(path), "ready")) == 2)
            wait_stopped(kids, zombie)
            kids.wait_for(
                "the task done by the other worker", lambda: queue.get(task_id).state == "done"
            )
            task = queue.get(task_id)
            zombie.send_signal(signal.SIGCONT)

            def zombie_settled() -> bool:
                lines = read_ledger(path)
                return bool(
                    of(lines, "effect", pid=zombie.pid)
                    and of(lines, "lease_lost", pid=zombie.pid)
                    and (
                        of(lines, "returned", pid=zombie.pid) or of(lines, "raised", pid=zombie.pid)
                    )
                )

            kids.wait_for("the resumed worker to act late and lose its lease", zombie_settled)
            for p in (zombie, survivor):
                p.send_signal(signal.SIGTERM)
            for p in (zombie, survivor):
                assert kids.finish(p) == 0, kids.stderr()
        assert queue.get(task_id).result == task.result, "the late run changed nothing"
    lines = read_ledger(path)
    with al.Idempotency.connect(url) as keys:
        key = call_key(keys, task_id)
        record = keys.get(key)
    assert frozen["key"] == key
    assert frozen["fence"] == 1
    # The survivor ran the reaped task, waited out the frozen reservation, took the call over
    # with fence 2 and acted; the zombie, resumed, acted after it with fence 1.
    effects = of(lines, "effect", task=task_id)
    assert [(e["pid"], e["fence"], e["attempt"], e["key"]) for e in effects] == [
        (survivor.pid, 2, 2, key),
        (zombie.pid, 1, 1, key),
    ]
    # A downstream that keeps the highest fence per key applies the survivor's, refuses the
    # zombie's.
    highest: dict[str, int] = {}
    applied = []
    for e in effects:
        if e["fence"] >= highest.get(e["key"], 0):
            highest[e["key"]] = e["fence"]
            applied.append(e["pid"])
    assert applied == [survivor.pid]
    # Only the survivor's outcome is stored, in the key and in the task.
    survivor_value = {
        k: effects[0][k] for k in ("order", "amount", "pid", "attempt", "key", "fence")
    }
    assert record is not None
    assert record.state == "done"
    assert record.fence == 2
    assert stored_value(framework, record) == survivor_value
    assert task.state == "done"
    assert task.attempt == 2
    assert final_output(task) == survivor_value
    # The zombie's lease was lost and its run's end (a refusal, a cancellation, or a result
    # that the queue refused) left the task as the survivor finished it.
    assert [(e["task"], e["attempt"]) for e in of(lines, "lease_lost", pid=zombie.pid)] == [
        (task_id, 1)
    ]
    for ended in of(lines, "raised", pid=zombie.pid):
        assert "ReservationLost" in ended["error"] or "Cancelled" in ended["error"], ended
