"""Idempotent side effects with real processes on real stores: SQLite, Redis, Redis Cluster and
PostgreSQL (the memory store, which processes cannot share, is covered with threads).

Every side effect is written to an independent append-only ledger (see
``tests/acceptance/_idempotency_child.py``), so the assertions hold the library's account against
what the outside world saw:

- many processes calling one action at the same instant act once; every caller gets the original
  result, a replay of it, or DuplicateInFlight (or, asked to wait, the original result);
- a holder SIGKILLed between its side effect and its record is taken over once its in-flight lease
  runs out, and the action runs again with the same key (so a downstream that deduplicates by key
  sees one effect); a holder frozen there and resumed after the takeover has its write refused;
- a worker SIGKILLed after step s2 is reaped, and the next worker replays s1 and s2 and runs s3
  (killed between s2's side effect and its record, the reaped task waits out s2's in-flight
  lease and takes s2 over, with the same key).

One seed by default; AGENTLEASE_DEEP=1 repeats each scenario with several.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import agentlease as al
from tests.acceptance._idempotency_child import (
    CRASH_HOLD_FOR,
    STEPS,
    WORKER_LEASE,
    Ledger,
    charge_tool,
    read_ledger,
)
from tests.conftest import BACKENDS, Store

# Many real processes (SIGKILL, SIGSTOP) on short leases: the "processes" group runs one test at
# a time on one xdist worker, so they starve neither each other nor the servers' connections.
pytestmark = pytest.mark.xdist_group("processes")

DEEP = os.environ.get("AGENTLEASE_DEEP") == "1"
SEEDS = list(range(5)) if DEEP else [0]
KINDS = [k for k in BACKENDS if k != "memory"]  # processes cannot share memory://
ROOT = Path(__file__).resolve().parents[2]
CROWD = 8
CROWD_HOLD_FOR = 5.0  # the crowd's in-flight lease (see _idempotency_child.crowd)
ROUNDS = ("nowait", "wait")
# Every wait for another process is bounded by this (seconds): no test can hang.
BOUND = 30.0


# -- processes ------------------------------------------------------------------------------------


class Children:
    """The child processes of one test: started here, always reaped (killed if still running)."""

    module = "tests.acceptance._idempotency_child"  # what each child runs (``python -m``)

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.finished: set[int] = set()  # pids the test waited for: their exit is expected

    def spawn(self, *args: str | Path) -> subprocess.Popen[bytes]:
        err = self.logs / f"child-{len(self.procs)}.err"
        with err.open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *map(str, args)],
                cwd=ROOT,
                # A child that hangs is dumped (SIGABRT) before the test fails: see finish().
                env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        self.procs.append(proc)
        return proc

    def stderr(self) -> str:
        return "\n".join(
            f"--- child {i} (pid {p.pid}, rc {p.returncode}):\n"
            + (self.logs / f"child-{i}.err").read_text(errors="replace")[-6000:]
            for i, p in enumerate(self.procs)
        )

    def check_alive(self) -> None:
        for p in self.procs:
            if p.pid not in self.finished and p.poll() is not None:
                pytest.fail(f"child {p.pid} exited early with {p.returncode}\n{self.stderr()}")

    def wait_for(self, what: str, ready: Callable[[], bool]) -> None:
        """Poll ``ready`` until true; fail after BOUND seconds or if a child dies."""
        deadline = time.monotonic() + BOUND
        while not ready():
            self.check_alive()
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}\n{self.stderr()}")
            time.sleep(0.005)

    def finish(self, proc: subprocess.Popen[bytes]) -> int:
        self.finished.add(proc.pid)
        try:
            return proc.wait(timeout=BOUND)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
            pytest.fail(f"child {proc.pid} did not exit\n{self.stderr()}")

    def reap(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()  # SIGKILL ends stopped processes too
            p.wait(timeout=BOUND)


@contextmanager
def children(tmp_path: Path) -> Iterator[Children]:
    kids = Children(tmp_path)
    try:
        yield kids
    finally:
        kids.reap()


def wait_stopped(kids: Children, proc: subprocess.Popen[bytes]) -> None:
    """Wait until ``proc`` is stopped by SIGSTOP (without reaping it)."""
    deadline = time.monotonic() + BOUND
    while True:
        pid, status = os.waitpid(proc.pid, os.WNOHANG | os.WUNTRACED)
        if pid == proc.pid:
            assert os.WIFSTOPPED(status), f"child {proc.pid} ended: status {status}"
            return
        if time.monotonic() > deadline:
            pytest.fail(f"child {proc.pid} never stopped\n{kids.stderr()}")
        time.sleep(0.005)


def all_exist(paths: list[Path]) -> bool:
    return all(p.exists() for p in paths)


def of(lines: list[dict[str, Any]], kind: str, **match: object) -> list[dict[str, Any]]:
    return [
        line
        for line in lines
        if line["kind"] == kind and all(line.get(k) == v for k, v in match.items())
    ]


# -- 1. many callers, one key, at once -------------------------------------------------------------


def charge_key(keys: al.Idempotency, task: str, order: str, amount: int) -> str:
    key, _ = keys.identity(
        "charge", {"order": order, "amount": amount}, step="charge", task_id=task
    )
    return key


def check_crowd_round(
    lines: list[dict[str, Any]], keys: al.Idempotency, key: str, r: int, mode: str, callers: int
) -> None:
    """One round of one action called by ``callers`` at once: one effect; every caller got the
    original result, a replay equal to it, or (not waiting) DuplicateInFlight."""
    effects = of(lines, "effect", key=key)
    assert len(effects) == 1, effects
    outcomes = of(lines, "outcome", round=r)
    duplicates = of(lines, "duplicate", round=r)
    assert len(outcomes) + len(duplicates) == callers, (outcomes, duplicates)
    assert {o["key"] for o in outcomes} | {d["key"] for d in duplicates} == {key}
    originals = [o for o in outcomes if not o["replayed"]]
    assert len(originals) == 1, outcomes
    original = originals[0]["value"]
    assert original["by"] == effects[0]["who"]
    assert original["pid"] == effects[0]["pid"] == originals[0]["pid"]
    assert original["key"] == key
    assert all(o["value"] == original for o in outcomes), outcomes
    if mode == "wait":
        assert duplicates == [], "every caller waited for the original result"
    else:
        assert duplicates, "no call overlapped the first one: the race was not exercised"
        for d in duplicates:
            assert 0 < d["retry_after"] <= CROWD_HOLD_FOR + 0.5, d
            assert f":{original['pid']} " in d["by"], d  # the holder names the first caller
    record = keys.get(key)
    assert record is not None
    assert record.state == "done"
    assert record.fence == 1
    assert record.result == original


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_many_processes_calling_one_action_at_once_act_once(
    url: str, tmp_path: Path, seed: int
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    task = f"crowd-{seed}"
    with children(tmp_path) as kids:
        for i in range(CROWD):
            kids.spawn("crowd", url, ledger, barrier, str(i), task, ",".join(ROUNDS))
        for r in range(len(ROUNDS)):
            ready = [barrier / f"ready-{r}-{i}" for i in range(CROWD)]
            kids.wait_for(f"round {r} ready", functools.partial(all_exist, ready))
            (barrier / f"go-{r}").touch()  # every process is polling for it: they start at once
        for p in kids.procs:
            assert kids.finish(p) == 0, kids.stderr()
    lines = read_ledger(ledger)
    with al.Idempotency.connect(url) as keys:
        for r, mode in enumerate(ROUNDS):
            key = charge_key(keys, f"{task}-{r}", "order-1", 100)
            check_crowd_round(lines, keys, key, r, mode, CROWD)


def test_many_threads_calling_one_action_at_once_act_once(store: Store, tmp_path: Path) -> None:
    """The same race with threads, so the memory store is covered too (each thread has its own
    connection, except memory, whose threads share the one store)."""
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    settings = al.IdempotencySettings(hold_for=CROWD_HOLD_FOR)
    backends = [store.backend() for _ in range(CROWD)]
    clients = [al.Idempotency(b, settings=settings) for b in backends]
    start = threading.Barrier(CROWD)
    errors: list[BaseException] = []

    def caller(i: int) -> None:
        tools = {"nowait": charge_tool(clients[i]), "wait": charge_tool(clients[i], wait=BOUND)}
        try:
            for r, mode in enumerate(ROUNDS):
                start.wait(timeout=BOUND)
                with al.idempotency_scope(task_id=f"threads-{r}"):
                    try:
                        out = tools[mode].outcome(
                            "order-1", 100, ledger=ledger, who=f"t{i}", pause=0.3
                        )
                    except al.DuplicateInFlight as exc:
                        ledger.write(
                            "duplicate",
                            round=r,
                            key=exc.key,
                            retry_after=exc.retry_after,
                            by=exc.holder,
                        )
                    else:
                        ledger.write(
                            "outcome", round=r, key=out.key, replayed=out.replayed, value=out.value
                        )
        except BaseException as exc:
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(CROWD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=BOUND)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    ledger.close()
    lines = read_ledger(path)
    # Threads share one pid, so the holder check below cannot single out the first caller.
    for line in lines:
        if line["kind"] == "outcome":
            line["value"]["pid"] = line["pid"]
    keys = clients[0]
    for r, mode in enumerate(ROUNDS):
        key = charge_key(keys, f"threads-{r}", "order-1", 100)
        check_crowd_round(lines, keys, key, r, mode, CROWD)
    if store.kind != "memory":
        for client in clients:
            client.close()


# -- 2. a holder dies, or freezes, between its side effect and its record ----------------------


def first_effect(kids: Children, ledger: Path) -> dict[str, Any]:
    kids.wait_for("the first side effect", lambda: bool(of(read_ledger(ledger), "effect")))
    (effect,) = of(read_ledger(ledger), "effect")
    return effect


def duplicate_now(
    keys: al.Idempotency, ledger: Ledger, task: str, key: str, holder_pid: int
) -> None:
    """A call right after the crash finds the dead (or frozen) holder's reservation live."""
    with al.idempotency_scope(task_id=task), pytest.raises(al.DuplicateInFlight) as dup:
        charge_tool(keys)("order-7", 42, ledger=ledger, who="too-early")
    assert dup.value.key == key
    assert 0 < dup.value.retry_after <= CRASH_HOLD_FOR + 0.5
    assert f":{holder_pid} " in dup.value.holder
    record = keys.get(key)
    assert record is not None
    assert record.state == "in_flight"
    assert record.fence == 1


def take_over(
    keys: al.Idempotency, ledger: Ledger, task: str, key: str, caplog: pytest.LogCaptureFixture
) -> al.Outcome[Any]:
    """Once the in-flight lease runs out, a caller takes the reservation over and acts again,
    with the same key; a later call replays that second result."""
    with (
        al.idempotency_scope(task_id=task),
        caplog.at_level(logging.WARNING, logger="agentlease.idempotency"),
    ):
        out = charge_tool(keys, wait=BOUND).outcome("order-7", 42, ledger=ledger, who="second")
    assert not out.replayed
    assert out.key == key
    assert out.value["by"] == "second"
    assert out.value["key"] == key
    assert any("taken over (fence 2)" in r.getMessage() for r in caplog.records), caplog.text
    record = keys.get(key)
    assert record is not None
    assert record.state == "done"
    assert record.fence == 2, "the second reservation was a takeover"
    assert record.result == out.value
    return out


def replay_third(keys: al.Idempotency, ledger: Ledger, task: str, second: al.Outcome[Any]) -> None:
    with al.idempotency_scope(task_id=task):
        third = charge_tool(keys).outcome("order-7", 42, ledger=ledger, who="third")
    assert third.replayed
    assert third.value == second.value
    assert third.key == second.key


def check_two_effects_one_key(path: Path, key: str, first_pid: int) -> None:
    """The action ran twice (the crash hid the first run's outcome), both times with the same
    key: a downstream that deduplicates by key sees exactly one effect."""
    effects = of(read_ledger(path), "effect")
    assert [(e["who"], e["key"]) for e in effects] == [("first", key), ("second", key)]
    assert effects[0]["pid"] == first_pid
    downstream = {e["key"]: e for e in effects}  # the remote side honours the key
    assert len(downstream) == 1


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_holder_killed_between_effect_and_record_is_taken_over_with_the_same_key(
    url: str, tmp_path: Path, seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.jsonl"
    task = f"kill-{seed}"
    with children(tmp_path) as kids, al.Idempotency.connect(url) as keys:
        proc = kids.spawn("crash", url, path, task, "kill")
        assert kids.finish(proc) == -signal.SIGKILL, kids.stderr()
        effect = first_effect(kids, path)
        key = effect["key"]
        assert key == charge_key(keys, task, "order-7", 42)
        ledger = Ledger(path)
        duplicate_now(keys, ledger, task, key, proc.pid)
        second = take_over(keys, ledger, task, key, caplog)
        replay_third(keys, ledger, task, second)
        ledger.close()
    check_two_effects_one_key(path, key, proc.pid)
    lines = read_ledger(path)
    assert of(lines, "outcome", pid=proc.pid) == [], "the killed holder recorded nothing"
    assert of(lines, "effect", who="too-early") == []
    assert of(lines, "effect", who="third") == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_holder_frozen_between_effect_and_record_has_its_late_write_refused(
    url: str, tmp_path: Path, seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.jsonl"
    task = f"stop-{seed}"
    with children(tmp_path) as kids, al.Idempotency.connect(url) as keys:
        proc = kids.spawn("crash", url, path, task, "stop")
        effect = first_effect(kids, path)
        wait_stopped(kids, proc)
        key = effect["key"]
        ledger = Ledger(path)
        duplicate_now(keys, ledger, task, key, proc.pid)
        second = take_over(keys, ledger, task, key, caplog)
        proc.send_signal(signal.SIGCONT)  # the zombie wakes and tries to record its result
        assert kids.finish(proc) == 0, kids.stderr()
        (refused,) = of(read_ledger(path), "refused")
        assert refused["pid"] == proc.pid
        assert refused["key"] == key
        assert refused["fence"] == 1
        # Frozen past hold_for, the zombie is past its local deadline: it refuses its own
        # write before sending it (the store, which has fence 2 done, would refuse it too).
        assert refused["current_fence"] is None
        assert refused["state"] is None
        record = keys.get(key)
        assert record is not None
        assert record.result == second.value, "the zombie's result was not stored"
        assert record.fence == 2
        replay_third(keys, ledger, task, second)
        ledger.close()
    check_two_effects_one_key(path, key, proc.pid)
    assert of(read_ledger(path), "outcome", pid=proc.pid) == []


# -- 3. a worker killed mid-task ------------------------------------------------------------------


def step_keys(keys: al.Idempotency, task_id: str) -> dict[str, str]:
    """The key of each step of the worker scenario's task (see _idempotency_child.worker)."""
    return {
        s: keys.identity("apply_step", {"doc": "report.pdf"}, step=s, task_id=task_id)[0]
        for s in STEPS
    }


def kill_a_worker_mid_task(
    url: str, tmp_path: Path, task_id: str, *worker_args: str
) -> tuple[al.Task, int, int, list[dict[str, Any]]]:
    """Two worker processes race for one task; the one running attempt 1 blocks after s2 (where
    ``worker_args`` say) and is SIGKILLed there; the other runs the reaped task to its end (done or
    dead). Returns the task, the victim's and the survivor's pids, and the ledger."""
    path = tmp_path / "ledger.jsonl"
    queue_name = "idem"
    with al.Queue.connect(url, settings=al.QueueSettings(lease_for=WORKER_LEASE)) as queue:
        queue.enqueue(queue_name, {"doc": "report.pdf"}, id=task_id)
        with children(tmp_path) as kids:
            workers = [kids.spawn("worker", url, path, queue_name, *worker_args) for _ in range(2)]
            kids.wait_for("a worker blocked at s2", lambda: bool(of(read_ledger(path), "blocked")))
            (blocked,) = of(read_ledger(path), "blocked")
            (victim,) = [w for w in workers if w.pid == blocked["pid"]]
            (survivor,) = [w for w in workers if w is not victim]
            victim.send_signal(signal.SIGKILL)
            assert kids.finish(victim) == -signal.SIGKILL
            kids.wait_for("the task finished", lambda: queue.get(task_id).state in ("done", "dead"))
            survivor.send_signal(signal.SIGTERM)
            assert kids.finish(survivor) == 0, kids.stderr()
        return queue.get(task_id), victim.pid, survivor.pid, read_ledger(path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_worker_killed_after_step_two_is_resumed_with_steps_one_and_two_replayed(
    url: str, tmp_path: Path, seed: int
) -> None:
    task_id = f"doc-{seed}"
    task, victim, survivor, lines = kill_a_worker_mid_task(url, tmp_path, task_id)
    assert task.state == "done", task.error_json
    assert task.attempt == 2
    assert task.reclaims == 1
    assert task.result == {"done_by": survivor, "attempt": 2}
    with al.Idempotency.connect(url) as keys:
        expected = step_keys(keys, task_id)
        records = {s: keys.get(k) for s, k in expected.items()}
    effects = of(lines, "effect")
    assert sorted((e["step"], e["key"]) for e in effects) == sorted(expected.items()), (
        "each step acted exactly once, keyed on the worker's task"
    )
    assert [(e["step"], e["pid"]) for e in effects] == [
        ("s1", victim),
        ("s2", victim),
        ("s3", survivor),
    ]
    first = of(lines, "outcome", attempt=1)
    second = of(lines, "outcome", attempt=2)
    assert [(o["step"], o["replayed"], o["pid"]) for o in first] == [
        ("s1", False, victim),
        ("s2", False, victim),
    ]
    assert [(o["step"], o["replayed"], o["pid"]) for o in second] == [
        ("s1", True, survivor),
        ("s2", True, survivor),
        ("s3", False, survivor),
    ]
    for before, after in zip(first, second[:2], strict=True):
        assert after["value"] == before["value"], "a replay returns the original result"
        assert after["key"] == before["key"] == expected[before["step"]]
    assert second[2]["value"] == {"step": "s3", "doc": "report.pdf", "attempt": 2, "pid": survivor}
    for record in records.values():
        assert record is not None
        assert record.state == "done"
        assert record.fence == 1


@pytest.mark.slow
def test_worker_killed_between_a_step_effect_and_its_record_takes_the_step_over(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The README's promise for a crash between a side effect and its record, inside a worker:
    the worker that runs the reaped task takes the step over once its in-flight lease runs out
    (here 3 s, three task leases) and acts again with the same key."""
    hold_for, retry_base = "3.0", "0.05"
    task_id = "doc-crash"
    task, victim, survivor, lines = kill_a_worker_mid_task(
        sqlite_url, tmp_path, task_id, "effect", hold_for, retry_base
    )
    assert task.state == "done", task.error_json
    with al.Idempotency.connect(sqlite_url) as keys:
        expected = step_keys(keys, task_id)
        s2 = keys.get(expected["s2"])
    assert s2 is not None
    assert s2.fence == 2, "the survivor took s2 over"
    assert [(e["step"], e["key"], e["pid"]) for e in of(lines, "effect")] == [
        ("s1", expected["s1"], victim),
        ("s2", expected["s2"], victim),
        ("s2", expected["s2"], survivor),  # again, with the same key
        ("s3", expected["s3"], survivor),
    ]
