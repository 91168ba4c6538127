"""The demo scenario, made real: N worker processes on M tasks, K SIGKILLed mid-task, F frozen
with SIGSTOP past their lease and resumed with SIGCONT; then every invariant is checked.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agentlease as al
from agentlease._demo.checks import Check, Faults, check
from agentlease._demo.ledger import read_ledgers
from agentlease._demo.namespace import Namespace, namespace
from agentlease.errors import InvalidInput

__all__ = ["DemoConfig", "DemoReport", "run_demo"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoConfig:
    """What the demo runs.

    Attributes:
        url: the store; ``None`` makes a SQLite database in a temp dir.
        workers: worker processes.
        tasks: tasks to run.
        kill: workers SIGKILLed mid-task.
        freeze: workers SIGSTOPped mid-task past their lease, then resumed.
        lease_for: each lease's length in seconds.
        work: the range of seconds a task's handler works.
        seed: the random stream of task lengths and victims.
        timeout: the most seconds the run may take before it is declared failed.
        keep: on Redis or PostgreSQL, keep the demo's key prefix or schema afterwards (by
            default the demo runs in one of its own and removes it).
    """

    url: str | None = None
    workers: int = 20
    tasks: int = 200
    kill: int = 3
    freeze: int = 2
    lease_for: float = 2.0
    work: tuple[float, float] = (0.2, 0.6)
    seed: int = 0
    timeout: float = 120.0
    keep: bool = False

    def __post_init__(self) -> None:
        if self.workers < 1 or self.tasks < 1:
            raise InvalidInput("the demo needs at least one worker and one task")
        if self.kill < 0 or self.freeze < 0 or self.kill + self.freeze >= self.workers:
            raise InvalidInput("--kill plus --freeze must leave at least one healthy worker")
        if self.url is not None and self.url.startswith("memory:"):
            raise InvalidInput(
                "the demo runs separate worker processes, which cannot share memory://; "
                "use a sqlite:/// URL"
            )


@dataclass(frozen=True, slots=True)
class DemoReport:
    """The outcome: each invariant and the figures."""

    checks: list[Check]
    figures: dict[str, Any]

    @property
    def ok(self) -> bool:
        """Whether every invariant held."""
        return all(c.ok for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        """The report as one JSON object."""
        return {
            **self.figures,
            "invariants_ok": self.ok,
            "invariants": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }


Progress = Callable[[int, int, str], None]


def run_demo(config: DemoConfig, progress: Progress | None = None) -> DemoReport:
    """Run the scenario and check it; ``progress(done, total, message)`` sees it live."""
    say = progress or (lambda done, total, message: None)
    rand = random.Random(config.seed)
    space = namespace(config.url) if config.url else None
    with tempfile.TemporaryDirectory(prefix="agentlease-demo-") as tmp:
        url = space.url if space is not None else f"sqlite:///{Path(tmp) / 'demo.db'}"
        ledgers = Path(tmp) / "ledgers"
        ledgers.mkdir()
        queue = al.Queue.connect(url, settings=al.QueueSettings(lease_for=config.lease_for))
        try:
            run = uuid.uuid4().hex[:8]  # a queue and ids of its own on a shared store
            name = f"demo-{run}"
            ids = _enqueue(queue, name, run, config, rand)
            say(0, config.tasks, f"enqueued {config.tasks} tasks on {queue.backend.url}")
            started = time.monotonic()
            procs = _start_workers(url, name, ledgers, config)
            try:
                faults = _run(queue, name, ids, procs, ledgers, config, rand, say)
            finally:
                _stop_workers(procs)
            elapsed = time.monotonic() - started
            tasks = [queue.get(task_id) for task_id in ids]
            shown = queue.backend.url  # as the backend shows it: never a password
        finally:
            queue.close()
            removed = _remove(space, config.keep)
        checks, figures = check(tasks, read_ledgers(ledgers), faults)
    if space is None:
        where = f"sqlite at {Path(tmp) / 'demo.db'} (a temp dir, removed)"
    else:
        where = shown if space.name is None else f"{shown} ({space.name}, {removed})"
    figures.update(
        backend=where,
        workers=config.workers,
        killed=len(faults.killed),
        frozen=len(faults.frozen),
        lease_for=config.lease_for,
        elapsed_seconds=round(elapsed, 2),
    )
    return DemoReport(checks, figures)


def _remove(space: Namespace | None, keep: bool) -> str:
    """Remove the demo's namespace unless asked to keep it; says what became of it."""
    if space is None or space.drop is None:
        return "left as it was"
    if keep:
        return "kept: --keep"
    try:
        space.drop()
    except Exception as exc:  # the demo's verdict stands; say why its data is still there
        return f"not removed: {type(exc).__name__}: {exc}"
    return "removed"


def _enqueue(
    queue: al.Queue, name: str, run: str, config: DemoConfig, rand: random.Random
) -> list[str]:
    low, high = config.work
    specs = [
        al.TaskSpec(
            id=f"{run}-{i:05d}", payload={"n": i, "work": round(rand.uniform(low, high), 3)}
        )
        for i in range(config.tasks)
    ]
    return [e.task_id for e in queue.enqueue_many(name, specs)]


def _start_workers(
    url: str, name: str, ledgers: Path, config: DemoConfig
) -> list[subprocess.Popen[bytes]]:
    # The URL goes in the environment, not the command line, which any local user can list.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "AGENTLEASE_URL": url}
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentlease._demo.proc",
                name,
                str(ledgers / f"worker-{i:03d}.jsonl"),
                str(config.lease_for),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(config.workers)
    ]


def _busy(ledgers: Path, pids: set[int]) -> list[int]:
    """Workers among ``pids`` that just started a task (claimed 20 to 120 ms ago), so a signal
    sent now lands mid-task: every task works for longer than that."""
    last: dict[int, tuple[float, str]] = {}
    now = time.time()
    for r in read_ledgers(ledgers):
        relevant = r["pid"] in pids and r["kind"] in ("claimed", "completed", "lease_lost")
        if relevant and (r["pid"] not in last or r["t"] >= last[r["pid"]][0]):
            last[r["pid"]] = (r["t"], r["kind"])
    return [pid for pid, (t, kind) in last.items() if kind == "claimed" and 0.02 <= now - t <= 0.12]


def _run(
    queue: al.Queue,
    name: str,
    ids: list[str],
    procs: list[subprocess.Popen[bytes]],
    ledgers: Path,
    config: DemoConfig,
    rand: random.Random,
    say: Progress,
) -> Faults:
    faults = Faults()
    deadline = time.monotonic() + config.timeout
    healthy = {p.pid for p in procs}
    by_pid = {p.pid: p for p in procs}
    resume_at: dict[int, float] = {}
    to_kill, to_freeze = config.kill, config.freeze
    while time.monotonic() < deadline:
        stats = queue.stats(name)
        done = stats.counts.get("done", 0) + stats.counts.get("dead", 0)
        if done >= len(ids):
            to_kill = to_freeze = 0  # too few tasks left to land every fault mid-task
        if to_kill or to_freeze:
            victims = _busy(ledgers, healthy)
            rand.shuffle(victims)
            for pid in victims:
                healthy.discard(pid)
                if to_kill:
                    to_kill -= 1
                    by_pid[pid].send_signal(signal.SIGKILL)
                    faults.killed[pid] = time.time()
                    say(done, config.tasks, f"SIGKILL worker {pid} mid-task")
                elif to_freeze:
                    to_freeze -= 1
                    by_pid[pid].send_signal(signal.SIGSTOP)
                    faults.frozen[pid] = (time.time(), 0.0)
                    resume_at[pid] = time.monotonic() + config.lease_for * 2
                    say(done, config.tasks, f"SIGSTOP worker {pid} mid-task")
        for pid, at in list(resume_at.items()):
            if time.monotonic() >= at:
                faults.frozen[pid] = (faults.frozen[pid][0], time.time())
                by_pid[pid].send_signal(signal.SIGCONT)
                del resume_at[pid]
                say(done, config.tasks, f"SIGCONT worker {pid}, past its lease: now a zombie")
        say(done, config.tasks, "")
        if done >= len(ids) and not (to_kill or to_freeze or resume_at):
            break
        time.sleep(0.02 if to_kill or to_freeze else 0.1)
    _await_zombies(ledgers, faults, deadline)
    return faults


def _await_zombies(ledgers: Path, faults: Faults, deadline: float) -> None:
    """Give resumed workers time to make (and have refused) their stale writes."""
    end = min(deadline, time.monotonic() + 10.0)
    while faults.frozen and time.monotonic() < end:
        seen = {
            r["pid"]
            for r in read_ledgers(ledgers)
            if r["kind"] in ("zombie_rejected", "lease_lost") and r["pid"] in faults.frozen
        }
        if seen >= set(faults.frozen):
            time.sleep(0.3)  # let the handler's own refused writes land too
            return
        time.sleep(0.1)


def _stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + 15.0
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
