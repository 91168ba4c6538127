"""Approval gates with real processes on real stores (SQLite, Redis, Redis Cluster, PostgreSQL;
the memory store, which processes cannot share, is covered in tests/contract/test_plans_api.py
and here with its fake clock).

1. One process plans (reads the order and a counter, declares the refund) and waits for its
   approval; another changes the order meanwhile: the approval raises StalePlan naming the
   order with both versions, and nothing is written. Without the change, the approval applies
   every write at once: a reader process polling the order and the ledger never sees one written
   without the other.
2. A plan sealed into a queue task is approved by a worker in another process after a delay,
   checked against the store, not the planner's memory: a change by a third process in between
   makes it stale. On the memory store with a fake clock, approving an hour later, past its
   ``expires_in``, raises PlanExpired.
3. Two processes approve one plan at the same moment: one receipt says ``first``, the writes are
   applied once, and both get the same receipt.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import agentlease as al
from agentlease.backends.memory import MemoryBackend
from tests.acceptance._idempotency_child import read_ledger
from tests.acceptance.test_idempotency_processes import Children, of

pytestmark = pytest.mark.xdist_group("processes")


class PlanChildren(Children):
    """Children running tests/acceptance/_plans_child.py."""

    module = "tests.acceptance._plans_child"


@contextmanager
def children(tmp_path: Path) -> Iterator[PlanChildren]:
    kids = PlanChildren(tmp_path)
    try:
        yield kids
    finally:
        kids.reap()


def a_paid_order(url: str) -> tuple[str, al.SharedState]:
    space = f"shop-{uuid.uuid4().hex[:8]}"
    state = al.SharedState.connect(url, space=space)
    assert state.compare_and_set("order", 0, {"status": "paid", "amount": 40}) == 1
    return space, state


# -- 1. a plan that waits for its approval --------------------------------------------------------


@pytest.mark.slow
def test_a_change_while_the_plan_waits_makes_its_approval_stale(url: str, tmp_path: Path) -> None:
    space, state = a_paid_order(url)
    ledger, where = tmp_path / "ledger.jsonl", tmp_path / "files"
    where.mkdir()
    with state, children(tmp_path) as kids:
        planner = kids.spawn("plan", url, space, ledger, where)
        kids.wait_for("the plan", (where / "planned").exists)
        changer = kids.spawn("change", url, space, "order", "status", "cancelled")
        assert kids.finish(changer) == 0, kids.stderr()
        (where / "go").touch()
        assert kids.finish(planner) == 0, kids.stderr()
        (stale,) = of(read_ledger(ledger), "stale")
        assert stale["stale"] == [["record", f"{space}|order", 1, 2]]
        assert state.get("order") == al.Versioned({"status": "cancelled", "amount": 40}, 2)
        assert state.get("ledger").version == 0
        assert state.counter_version("refunds") == (0, 0)


@pytest.mark.slow
def test_an_unchanged_world_gets_every_write_at_once(url: str, tmp_path: Path) -> None:
    space, state = a_paid_order(url)
    ledger, where = tmp_path / "ledger.jsonl", tmp_path / "files"
    where.mkdir()
    with state, children(tmp_path) as kids:
        watcher = kids.spawn("watch", url, space, ledger, where)
        kids.wait_for("the reader", (where / "watching").exists)
        planner = kids.spawn("plan", url, space, ledger, where)
        kids.wait_for("the plan", (where / "planned").exists)
        (where / "go").touch()
        assert kids.finish(planner) == 0, kids.stderr()
        (where / "stop").touch()
        assert kids.finish(watcher) == 0, kids.stderr()
        lines = read_ledger(ledger)
        (receipt,) = of(lines, "receipt")
        assert receipt["first"] is True
        assert receipt["versions"] == [2, 1, 1]
        (watched,) = of(lines, "watched")
        assert watched["reads"] > 0
        assert watched["halves"] == 0, "a reader saw one write of the plan without the other"
        assert state.get("order").value == {"status": "refunded", "amount": 40}
        assert state.get("ledger") == al.Versioned({"refund": 40}, 1)
        assert state.counter("refunds") == 1


# -- 2. a plan in a queue task, approved later by a worker ----------------------------------------


def _plan_into_a_task(url: str, state: al.SharedState, queue: str) -> str:
    with state.plan(step="refund-42", expires_in=3600) as plan:
        state.get("order")
        plan.set_field("order", "status", "refunded")
        plan.add("refunds", 1)
    sealed = plan.seal()
    with al.Queue.connect(url) as q:
        q.enqueue(queue, {"plan": sealed}, id=f"approve-{plan.id}")
    return plan.id


@pytest.mark.slow
@pytest.mark.parametrize("moved", [True, False], ids=["moved", "unchanged"])
def test_a_plan_in_a_task_is_checked_against_the_store_by_a_worker(
    url: str, tmp_path: Path, moved: bool
) -> None:
    space, state = a_paid_order(url)
    ledger, where, queue = tmp_path / "ledger.jsonl", tmp_path / "files", f"approvals-{space}"
    where.mkdir()
    with state, children(tmp_path) as kids:
        plan_id = _plan_into_a_task(url, state, queue)
        worker = kids.spawn("worker", url, ledger, where, queue)
        kids.wait_for("the worker's claim", (where / "claimed").exists)
        if moved:
            changer = kids.spawn("change", url, space, "order", "note", "called the bank")
            assert kids.finish(changer) == 0, kids.stderr()
        (where / "go").touch()
        assert kids.finish(worker) == 0, kids.stderr()
        lines = read_ledger(ledger)
        if moved:
            (stale,) = of(lines, "stale")
            assert stale == {
                **stale,
                "plan": plan_id,
                "stale": [["record", f"{space}|order", 1, 2]],
            }
            assert state.get("order").value["status"] == "paid"
            assert state.counter("refunds") == 0
        else:
            (receipt,) = of(lines, "receipt")
            assert (receipt["plan"], receipt["first"], receipt["by"]) == (plan_id, True, "worker")
            assert state.get("order").value["status"] == "refunded"
            assert state.counter("refunds") == 1


def test_an_approval_an_hour_later_past_expires_in_is_refused_on_the_stores_clock() -> None:
    now = [1_000_000.0]
    backend = MemoryBackend(clock=lambda: now[0])
    state = al.SharedState(backend, space="shop")
    state.compare_and_set("order", 0, {"status": "paid"})
    with state.plan(step="refund-42", expires_in=600) as plan:
        state.get("order")
        plan.set_field("order", "status", "refunded")
    sealed = plan.seal()
    now[0] += 3600  # an hour later, on the store's clock
    with pytest.raises(al.PlanExpired) as info:
        state.act(sealed, approved_by="ada")
    assert (info.value.not_after, info.value.now) == (1_000_600.0, 1_003_600.0)
    assert state.get("order").value == {"status": "paid"}


# -- 3. two approvals at once ---------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_approving_one_plan_at_once_act_once(url: str, tmp_path: Path) -> None:
    _, state = a_paid_order(url)
    ledger, where = tmp_path / "ledger.jsonl", tmp_path / "files"
    where.mkdir()
    with state, children(tmp_path) as kids:
        with state.plan(step="refund-42") as plan:
            state.get("order")
            plan.set_field("order", "status", "refunded")
            plan.add("refunds", 1)
        (where / "plan.json").write_text(plan.seal())
        approvers = [kids.spawn("approve", url, ledger, where, i, 2) for i in range(2)]
        for p in approvers:
            assert kids.finish(p) == 0, kids.stderr()
        receipts = of(read_ledger(ledger), "receipt")
        assert len(receipts) == 2
        assert sorted(r["first"] for r in receipts) == [False, True]
        assert len({(r["by"], tuple(r["versions"])) for r in receipts}) == 1
        assert state.get("order") == al.Versioned({"status": "refunded", "amount": 40}, 2)
        assert state.counter("refunds") == 1
