"""The processes of tests/acceptance/test_idempotency_processes.py.

    python -m tests.acceptance._idempotency_child crowd URL LEDGER BARRIER INDEX TASK ROUNDS
    python -m tests.acceptance._idempotency_child crash URL LEDGER TASK MODE
    python -m tests.acceptance._idempotency_child worker URL LEDGER QUEUE [BLOCK_AT HOLD_FOR BASE]

Every side effect and every outcome goes to one shared ledger: JSON lines appended with single
``os.write`` calls on an ``O_APPEND`` descriptor, so lines from many processes never interleave
and a line is whole even if its process is SIGKILLed right after. The ledger is independent of the
store: it is what the outside world saw.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import orjson

import agentlease as al

# The tool's in-flight lease in the crash scenario: short, so the takeover comes quickly.
CRASH_HOLD_FOR = 1.5
# The worker scenario's task lease and in-flight lease.
WORKER_LEASE = 1.0
STEPS = ("s1", "s2", "s3")
# How long a process waits for its barrier before giving up (no test may hang).
BARRIER_TIMEOUT = 60.0


class Ledger:
    """One shared append-only file of JSON lines."""

    def __init__(self, path: Path | str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, kind: str, **fields: Any) -> None:
        os.write(self._fd, orjson.dumps({"kind": kind, "pid": os.getpid(), **fields}) + b"\n")

    def close(self) -> None:
        os.close(self._fd)


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Every line of the ledger (a torn line would fail the test: none is expected)."""
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def charge_tool(keys: al.Idempotency, *, wait: float = 0.0) -> al.IdempotentFunction[..., Any]:
    """An idempotent ``charge``: its key is (task, step "charge", tool "charge", order, amount);
    the ledger, the caller's name, the pause and the fault are left out of it."""

    @al.idempotent(
        tool="charge",
        store=keys,
        step="charge",
        wait=wait,
        exclude=("ledger", "who", "pause", "fault"),
    )
    def charge(
        order: str, amount: int, *, ledger: Ledger, who: str, pause: float = 0.0, fault: str = ""
    ) -> dict[str, Any]:
        key = al.current_key()
        ledger.write("effect", key=key, who=who, order=order, amount=amount)
        if fault == "kill":  # dies between the side effect and its record
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "stop":  # frozen there until the test sends SIGCONT
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(pause)
        return {"charged": amount, "by": who, "pid": os.getpid(), "key": key}

    return charge


def _await_file(path: Path) -> None:
    deadline = time.monotonic() + BARRIER_TIMEOUT
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"barrier {path} never opened")
        time.sleep(0.001)


def crowd(url: str, ledger_path: str, barrier: str, index: str, task: str, rounds: str) -> int:
    """Round ``r`` of ``rounds`` (``nowait`` or ``wait``): announce readiness, wait for the
    start, then call the same action as every other process, once."""
    ledger = Ledger(ledger_path)
    gate = Path(barrier)
    keys = al.Idempotency.connect(url, settings=al.IdempotencySettings(hold_for=5.0))
    tools = {"nowait": charge_tool(keys), "wait": charge_tool(keys, wait=30.0)}
    for r, mode in enumerate(rounds.split(",")):
        (gate / f"ready-{r}-{index}").touch()
        _await_file(gate / f"go-{r}")
        with al.idempotency_scope(task_id=f"{task}-{r}"):
            try:
                out = tools[mode].outcome("order-1", 100, ledger=ledger, who=f"p{index}", pause=0.3)
            except al.DuplicateInFlight as exc:
                ledger.write(
                    "duplicate", round=r, key=exc.key, retry_after=exc.retry_after, by=exc.holder
                )
            else:
                ledger.write(
                    "outcome", round=r, key=out.key, replayed=out.replayed, value=out.value
                )
    keys.close()
    ledger.close()
    return 0


def crash(url: str, ledger_path: str, task: str, fault: str) -> int:
    """Reserve the action, act, then die (``kill``) or freeze (``stop``) before the record."""
    ledger = Ledger(ledger_path)
    keys = al.Idempotency.connect(url, settings=al.IdempotencySettings(hold_for=CRASH_HOLD_FOR))
    charge = charge_tool(keys)
    with al.idempotency_scope(task_id=task):
        try:
            out = charge.outcome("order-7", 42, ledger=ledger, who="first", fault=fault)
        except al.ReservationLost as exc:
            ledger.write(
                "refused",
                key=exc.key,
                fence=exc.fence,
                current_fence=exc.current_fence,
                state=exc.state,
            )
        else:
            ledger.write("outcome", key=out.key, replayed=out.replayed, value=out.value)
    keys.close()
    ledger.close()
    return 0


def worker(
    url: str,
    ledger_path: str,
    queue_name: str,
    block_at: str = "recorded",
    hold_for: str = str(WORKER_LEASE),
    retry_base: str = "1.0",
) -> int:
    """A worker whose handler runs steps s1, s2, s3 as idempotent actions keyed on its task (the
    worker supplies the task id). On the task's first attempt it blocks after s2 is recorded
    (``block_at="recorded"``) or between s2's side effect and its record (``"effect"``), for the
    test to SIGKILL it there."""
    ledger = Ledger(ledger_path)
    keys = al.Idempotency.connect(url, settings=al.IdempotencySettings(hold_for=float(hold_for)))

    def apply_step(doc: str, *, step: str, attempt: int) -> dict[str, Any]:
        ledger.write("effect", key=al.current_key(), step=step, attempt=attempt)
        if step == "s2" and attempt == 1 and block_at == "effect":
            ledger.write("blocked", attempt=attempt)
            time.sleep(30.0)  # the test SIGKILLs this process here
            raise RuntimeError("the test should have killed this worker by now")
        return {"step": step, "doc": doc, "attempt": attempt, "pid": os.getpid()}

    tools = {
        s: al.idempotent(tool="apply_step", store=keys, step=s, exclude=("step", "attempt"))(
            apply_step
        )
        for s in STEPS
    }

    def handler(ctx: al.JobContext) -> al.JSON:
        payload = ctx.payload
        assert isinstance(payload, dict)
        doc = str(payload["doc"])
        ledger.write("start", task=ctx.task_id, attempt=ctx.attempt)
        for s in STEPS:
            try:
                out = tools[s].outcome(doc, step=s, attempt=ctx.attempt)
            except al.AgentLeaseError as exc:
                ledger.write("error", attempt=ctx.attempt, step=s, error=type(exc).__name__)
                raise
            ledger.write(
                "outcome",
                task=ctx.task_id,
                attempt=ctx.attempt,
                step=s,
                key=out.key,
                replayed=out.replayed,
                value=out.value,
            )
            if s == "s2" and ctx.attempt == 1 and block_at == "recorded":
                ledger.write("blocked", task=ctx.task_id, attempt=ctx.attempt)
                ctx.wait(30.0)  # the test SIGKILLs this process here
                raise RuntimeError("the test should have killed this worker by now")
        return {"done_by": os.getpid(), "attempt": ctx.attempt}

    queue = al.Queue.connect(url, settings=al.QueueSettings(lease_for=WORKER_LEASE))
    w = al.Worker(
        queue,
        queue_name,
        handler,
        settings=al.WorkerSettings(
            concurrency=1,
            poll_interval=0.1,
            shutdown_grace=5.0,
            retry=al.RetryPolicy(base=float(retry_base)),
        ),
    )
    ledger.write("ready")
    w.run()
    ledger.write("exit")
    keys.close()
    ledger.close()
    return 0


def main(argv: list[str]) -> int:
    command, rest = argv[0], argv[1:]
    if command == "crowd":
        return crowd(*rest)
    if command == "crash":
        return crash(*rest)
    if command == "worker":
        return worker(*rest)
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
