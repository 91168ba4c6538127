"""Approval gates through the public API (both faces), on every store: a plan records what it
read, declares what it writes, is sealed as JSON and acted on only in an unchanged world."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Iterator

import orjson
import pytest

import agentlease as al
from agentlease import PlanExpired, PlanRefused, StalePlan
from agentlease.errors import InvalidInput, LimitReached, TransitionRefused
from tests.conftest import Store

ORDERS = al.StateMachine(
    "status", {"paid": ["refunded", "cancelled"], "refunded": [], "cancelled": []}, initial=["paid"]
)


@pytest.fixture
def state(store: Store) -> Iterator[al.SharedState]:
    s = al.SharedState(store.backend(), space=f"sp-{uuid.uuid4().hex[:10]}")
    yield s
    if store.kind != "memory":
        s.close()


def _close(store: Store, *states: al.SharedState) -> None:
    """Close what a test opened beside the fixture's state (memory shares one backend)."""
    if store.kind != "memory":
        for s in states:
            s.close()


def _async_backend(store: Store) -> al.AsyncBackend:
    memory = store._memory
    return al.connect_async(store.url) if memory is None else memory.open_async()


def test_a_plan_acts_on_an_unchanged_world_and_once(state: al.SharedState) -> None:
    state.compare_and_set("order", 0, {"status": "paid", "amount": 40})
    with state.plan(step="refund-42") as plan:
        assert state.get("order").value["status"] == "paid"
        assert state.counter("refunds") == 0
        plan.set_field("order", "status", "refunded", machine=ORDERS)
        plan.compare_and_set("ledger", {"refund": 40})
        plan.reserve("refunds", 1, limit=10)
    assert state.get("order").version == 1, "a declared write waits for the approval"
    sealed = plan.seal()
    receipt = state.act(sealed, approved_by="ada")
    assert (receipt.first, receipt.approved_by, receipt.plan_id) == (True, "ada", plan.id)
    assert state.get("order").value == {"status": "refunded", "amount": 40}
    assert state.get("ledger") == al.Versioned({"refund": 40}, 1)
    assert state.counter_version("refunds")[0] == 1
    again = plan.act("bob")
    assert (again.first, again.approved_by, again.versions) == (False, "ada", receipt.versions)
    assert state.counter("refunds") == 1


def test_a_moved_record_or_counter_refuses_the_plan_naming_both_versions(
    state: al.SharedState,
) -> None:
    state.compare_and_set("order", 0, {"status": "paid"})
    state.add("refunds", 1)
    with state.plan(step="refund") as plan:
        state.get("order")
        state.counter_version("refunds")
        plan.set_field("order", "status", "refunded")
        plan.add("refunds", 1)
    sealed = plan.seal()
    state.set_field("order", "status", "cancelled")
    state.add("refunds", 1)
    state.add("refunds", -1)  # back to the value the plan read, at a new version (no ABA)
    with pytest.raises(StalePlan) as info:
        state.act(sealed, approved_by="ada")
    stale = {(s.kind, s.key): (s.read_version, s.current_version) for s in info.value.stale}
    assert stale[("record", f"{state.space}|order")] == (1, 2)
    assert stale[("counter", f"{state.space}|refunds")] == (1, 3)
    assert "order" in str(info.value)
    assert state.get("order").value == {"status": "cancelled"}
    assert state.counter("refunds") == 1


def test_a_write_to_a_record_not_read_reads_it_first(state: al.SharedState) -> None:
    state.compare_and_set("order", 0, {"status": "paid"})
    with state.plan(step="s") as plan:
        plan.delete("order")  # never read: the plan reads it now, at version 1
    sealed = plan.seal()
    assert orjson.loads(sealed)["reads"] == [{"kind": "record", "key": "order", "version": 1}]
    state.set_field("order", "note", "x")
    with pytest.raises(StalePlan):
        state.act(sealed, approved_by="ada")


def test_a_second_read_at_another_version_is_stale_at_once(
    store: Store, state: al.SharedState
) -> None:
    other = al.SharedState(store.backend(), space=state.space)
    try:
        with state.plan(step="s") as plan:
            state.get("order")
            other.compare_and_set("order", 0, {"a": 1})  # another client, not in the plan
            with pytest.raises(StalePlan) as info:
                state.get("order")
    finally:
        _close(store, other)
    assert [(s.read_version, s.current_version) for s in info.value.stale] == [(0, 1)]
    assert plan.id == info.value.plan_id


def test_a_declared_write_refused_by_its_guard_writes_nothing(state: al.SharedState) -> None:
    state.compare_and_set("order", 0, {"status": "cancelled"})
    with state.plan(step="s") as plan:
        plan.add("refunds", 1)
        plan.set_field("order", "status", "refunded", machine=ORDERS)
    with pytest.raises(TransitionRefused):
        plan.act("ada")
    assert state.counter("refunds") == 0
    with state.plan(step="t") as plan:
        plan.take("seats", 1, minimum=0)
    with pytest.raises(LimitReached):
        plan.act("ada")


def test_an_expired_plan_is_refused(state: al.SharedState) -> None:
    with state.plan(step="s", expires_in=0.001) as plan:
        plan.add("n", 1)
    sealed = plan.seal()
    assert orjson.loads(sealed)["not_after"] is not None
    deadline = orjson.loads(sealed)["not_after"]
    for _ in range(500):  # bounded: until the store's clock passes not_after
        if state.backend.now() > deadline:
            break
        time.sleep(0.002)
    with pytest.raises(PlanExpired):
        state.act(sealed, approved_by="ada")
    assert state.counter("n") == 0


def test_reads_outside_the_block_or_of_another_state_are_not_recorded(
    store: Store, state: al.SharedState
) -> None:
    other = al.SharedState(store.backend(), space=state.space)
    try:
        with state.plan(step="s") as plan:
            other.get("x")
            other.counter("c")
    finally:
        _close(store, other)
    state.get("y")
    body = orjson.loads(plan.seal())
    assert body["reads"] == []
    assert body["space"] == state.space


def test_spaces_keep_names_apart(store: Store, state: al.SharedState) -> None:
    plain = al.SharedState(store.backend())
    try:
        state.compare_and_set("order", 0, {"a": 1})
        assert plain.get("order").version == 0
        assert plain.get(f"{state.space}|order".replace("|", "-")).version == 0
        with pytest.raises(al.InvalidName):
            plain.get(f"{state.space}|order")  # '|' is never in a name: no collision possible
        assert plain.backend.get_record(f"{state.space}|order") is not None
        with pytest.raises(al.InvalidName):
            al.SharedState(plain.backend, space="a|b")
    finally:
        _close(store, plain)


def test_approved_by_is_required_and_bounded(state: al.SharedState) -> None:
    with state.plan(step="s") as plan:
        plan.add("n", 1)
    for who in ["", "   ", "x" * 201, None]:
        with pytest.raises(PlanRefused):
            state.act(plan.seal(), approved_by=who)  # type: ignore[arg-type]
    assert state.counter("n") == 0


def test_a_sealed_plan_cannot_change(state: al.SharedState) -> None:
    with state.plan(step="s") as plan:
        plan.add("n", 1)
    sealed = plan.seal()
    with pytest.raises(PlanRefused):
        plan.add("n", 2)
    assert plan.seal() == sealed
    with pytest.raises(InvalidInput):
        state.plan(step="")


def test_pins_are_refused_where_the_store_cannot_check_them(
    store: Store, state: al.SharedState
) -> None:
    with state.plan(step="s") as plan:
        if state.backend.plan_pins:
            with pytest.raises(PlanRefused):
                plan.pin("orders; drop", {"id": 1}, 1)
            return
        with pytest.raises(PlanRefused):
            plan.pin("orders", {"id": 1}, 1)


def test_pins_on_sqlite_check_the_users_own_row(store: Store) -> None:
    if store.kind != "sqlite":
        return  # PostgreSQL proves its pins with a table of its own database
    path = store.url.removeprefix("sqlite:///")
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT, version INTEGER)")
    db.execute("INSERT INTO orders VALUES (1, 'paid', 3)")
    db.commit()
    state = al.SharedState.connect(store.url, space="shop")
    try:
        with state.plan(step="s") as plan:
            plan.pin("orders", {"id": 1}, 3)
            plan.pin("orders", {"id": 2}, 0)  # no such row: version 0
            plan.add("refunds", 1)
        sealed = plan.seal()
        db.execute("UPDATE orders SET status = 'cancelled', version = 4 WHERE id = 1")
        db.commit()
        with pytest.raises(StalePlan) as info:
            state.act(sealed, approved_by="ada")
        (moved,) = info.value.stale
        assert (moved.kind, moved.read_version, moved.current_version) == ("pin", 3, 4)
        assert orjson.loads(moved.key) == {
            "column": "version",
            "table": "orders",
            "where": {"id": 1},
        }
        assert state.counter("refunds") == 0
        with state.plan(step="t") as plan:
            plan.pin("orders", {"id": 1}, 4)
            plan.add("refunds", 1)
        assert plan.act("ada").first
        assert state.counter("refunds") == 1
        with state.plan(step="u") as plan:
            plan.pin("no_such_table", {"id": 1}, 1)
        with pytest.raises(PlanRefused):
            plan.act("ada")
    finally:
        state.close()
        db.close()


# -- the asyncio face --------------------------------------------------------------------------


async def test_the_asyncio_face_plans_and_acts(store: Store) -> None:
    state = al.AsyncSharedState(_async_backend(store), space=f"sp-{uuid.uuid4().hex[:10]}")
    try:
        await state.compare_and_set("order", 0, {"status": "paid"})
        async with state.plan(step="refund") as plan:
            await state.get("order")
            assert await state.counter_version("refunds") == (0, 0)
            await plan.set_field("order", "status", "refunded", machine=ORDERS)
            await plan.add("refunds", 1)
        sealed = await plan.seal()
        receipt = await state.act(sealed, approved_by="ada")
        assert receipt.first
        assert (await state.get("order")).value == {"status": "refunded"}
        assert not (await plan.act("ada")).first
        assert await state.counter("refunds") == 1
    finally:
        await state.close()


async def test_concurrent_tasks_do_not_mix_their_plans(store: Store) -> None:
    state = al.AsyncSharedState(_async_backend(store), space=f"sp-{uuid.uuid4().hex[:10]}")
    both_open = asyncio.Barrier(2)

    async def planner(mine: str) -> al.AsyncPlan:
        async with state.plan(step=mine) as plan:
            await both_open.wait()
            await state.get(mine)
            await both_open.wait()
            await plan.add(f"{mine}-n", 1)
        return plan

    try:
        a, b = await asyncio.gather(planner("a"), planner("b"))
        for plan, mine in ((a, "a"), (b, "b")):
            body = orjson.loads(await plan.seal())
            assert [r["key"] for r in body["reads"]] == [mine]
    finally:
        await state.close()
