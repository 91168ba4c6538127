"""The processes of tests/acceptance/test_plans_processes.py.

    python -m tests.acceptance._plans_child plan URL SPACE LEDGER DIR
    python -m tests.acceptance._plans_child change URL SPACE KEY FIELD VALUE
    python -m tests.acceptance._plans_child watch URL SPACE LEDGER DIR
    python -m tests.acceptance._plans_child worker URL LEDGER DIR QUEUE
    python -m tests.acceptance._plans_child approve URL LEDGER DIR INDEX PARTIES

``plan`` reads the order and the refunds counter in a plan, declares the refund (the order's
status, a ledger record, the counter), writes the sealed plan to ``DIR/plan.json``, touches
``DIR/planned`` and waits for ``DIR/go`` before approving it. ``watch`` reads the order and the
ledger over and over until ``DIR/stop``, and logs any read that saw one of the plan's writes
without the other. ``worker`` claims the task holding a sealed plan, waits for ``DIR/go`` and
approves it. ``approve`` approves ``DIR/plan.json`` when all ``PARTIES`` have arrived at a file
barrier. Every outcome goes to the shared ``O_APPEND`` ledger of
``tests/acceptance/_idempotency_child.py``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson

import agentlease as al
from tests.acceptance._guards_child import meet
from tests.acceptance._idempotency_child import BARRIER_TIMEOUT, Ledger


def wait_file(path: Path) -> None:
    """Wait (bounded) until ``path`` exists."""
    deadline = time.monotonic() + BARRIER_TIMEOUT
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{path.name} never appeared")
        time.sleep(0.002)


def publish(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole (a reader never sees part of it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def outcome(ledger: Ledger, act: Any) -> None:
    """Approve and log what happened: the receipt, or each stale read."""
    try:
        receipt = act()
    except al.StalePlan as exc:
        stale = [[s.kind, s.key, s.read_version, s.current_version] for s in exc.stale]
        ledger.write("stale", plan=exc.plan_id, stale=stale)
    except al.PlanExpired as exc:
        ledger.write("expired", plan=exc.plan_id)
    else:
        ledger.write(
            "receipt",
            plan=receipt.plan_id,
            first=receipt.first,
            by=receipt.approved_by,
            versions=list(receipt.versions),
        )


def plan(url: str, space: str, ledger_path: str, directory: str) -> None:
    where, ledger = Path(directory), Ledger(ledger_path)
    with al.SharedState.connect(url, space=space) as state:
        with state.plan(step="refund-42") as p:
            order = state.get("order")
            assert order.value["status"] == "paid"
            state.counter_version("refunds")
            p.set_field("order", "status", "refunded")
            p.compare_and_set("ledger", {"refund": order.value["amount"]})
            p.add("refunds", 1)
        publish(where / "plan.json", p.seal())
        (where / "planned").touch()
        wait_file(where / "go")  # the approval, a while later
        outcome(ledger, lambda: p.act(f"approver-{os.getpid()}"))
    ledger.close()


def change(url: str, space: str, key: str, field: str, value: str) -> None:
    with al.SharedState.connect(url, space=space) as state:
        state.set_field(key, field, value)


def watch(url: str, space: str, ledger_path: str, directory: str) -> None:
    where, ledger = Path(directory), Ledger(ledger_path)
    reads = halves = 0
    with al.SharedState.connect(url, space=space) as state:
        (where / "watching").touch()
        deadline = time.monotonic() + BARRIER_TIMEOUT
        while not (where / "stop").exists() and time.monotonic() < deadline:
            # Whichever is read first, seeing it written means the other is written too.
            order = state.get("order")
            if order.value.get("status") == "refunded" and state.get("ledger").version == 0:
                halves += 1
            ledger_first = state.get("ledger")
            if ledger_first.version and state.get("order").value.get("status") != "refunded":
                halves += 1
            reads += 1
    ledger.write("watched", reads=reads, halves=halves)
    ledger.close()


def worker(url: str, ledger_path: str, directory: str, queue: str) -> None:
    where, ledger = Path(directory), Ledger(ledger_path)
    with al.Queue.connect(url) as q, al.SharedState.connect(url) as state:
        jobs: list[al.Job] = []
        deadline = time.monotonic() + BARRIER_TIMEOUT
        while not jobs and time.monotonic() < deadline:
            jobs = q.claim(queue, lease_for=60)
            if not jobs:
                time.sleep(0.01)
        (job,) = jobs
        (where / "claimed").touch()
        wait_file(where / "go")
        sealed = orjson.loads(job.payload_json)["plan"]
        outcome(ledger, lambda: state.act(sealed, approved_by="worker"))
        q.complete(job.lease, None)
    ledger.close()


def approve(url: str, ledger_path: str, directory: str, index: str, parties: str) -> None:
    where, ledger = Path(directory), Ledger(ledger_path)
    with al.SharedState.connect(url) as state:
        sealed = (where / "plan.json").read_text()
        meet(where, "approve", int(index), int(parties))
        outcome(ledger, lambda: state.act(sealed, approved_by=f"approver-{index}"))
    ledger.close()


COMMANDS = {"plan": plan, "change": change, "watch": watch, "worker": worker, "approve": approve}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
