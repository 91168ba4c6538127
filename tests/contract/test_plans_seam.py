"""The contract of plans (approval gates) at the storage seam, on every backend.

``act_plan`` checks every version a plan read and applies its declared writes in one atomic
step, all or nothing, and keeps a receipt under the plan's id so that approving twice acts once;
counters carry a version that every change of their value raises. The names of one test live in
one state space (``"<space>|<name>"``), as a plan's names must on a Redis Cluster.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

import agentlease as al
from agentlease import LimitReached, PlanExpired, PlanRefused
from agentlease._records import PlanRead, PlanReceipt, PlanWrite, RecordWrite, StaleRead
from agentlease.errors import FencedOff
from tests.conftest import Store

KEEP = 3600.0


@pytest.fixture
def backend(store: Store) -> Iterator[al.Backend]:
    b = store.backend()
    yield b
    if store.kind != "memory":
        b.close()


@pytest.fixture
def space() -> str:
    return f"sp-{uuid.uuid4().hex[:10]}"


def name(space: str, prefix: str = "r") -> str:
    return f"{space}|{prefix}-{uuid.uuid4().hex[:8]}"


def plan_id() -> str:
    return f"plan-{uuid.uuid4().hex}"


def record(key: str, **fields: bytes) -> PlanWrite:
    return PlanWrite("record", key, record=RecordWrite(dict(fields)))


def counter(key: str, delta: int, low: int | None = None, high: int | None = None) -> PlanWrite:
    return PlanWrite("counter", key, delta=delta, low=low, high=high)


def version(backend: al.Backend, key: str) -> int:
    rec = backend.get_record(key)
    return 0 if rec is None else rec.version


# -- counters gain a version -----------------------------------------------------------------


def test_a_counter_version_rises_with_every_change_and_only_then(
    backend: al.Backend, space: str
) -> None:
    c = name(space, "c")
    assert backend.get_counter_version(c) == (0, 0)
    backend.add_counter(c, 1, None, None)
    assert backend.get_counter_version(c) == (1, 1)
    backend.add_counter(c, -1, None, None)
    value, ver = backend.get_counter_version(c)
    assert (value, ver) == (0, 2), "the same value at a new version: no ABA"
    with pytest.raises(LimitReached):
        backend.add_counter(c, 5, None, 3)
    assert backend.get_counter_version(c) == (0, 2), "a refused step changes nothing"
    assert backend.get_counter(c) == 0


def test_holds_move_a_counter_version(backend: al.Backend, space: str) -> None:
    c = name(space, "c")
    backend.hold_counter(c, "tok-1", 2, 10, 30.0)
    value, v1 = backend.get_counter_version(c)
    assert value == 2
    assert v1 >= 1
    assert backend.release_hold(c, "tok-1")
    value, v2 = backend.get_counter_version(c)
    assert value == 0
    assert v2 > v1


# -- the store's secret ----------------------------------------------------------------------


def test_the_plan_secret_is_made_once_and_shared_by_every_client(store: Store) -> None:
    first, second = store.backend(), store.backend()
    try:
        secret = first.plan_secret()
        assert isinstance(secret, bytes)
        assert len(secret) == 32
        assert second.plan_secret() == secret
        assert first.plan_secret() == secret
    finally:
        if store.kind != "memory":
            first.close()
            second.close()


def test_racing_clients_agree_on_one_secret(store: Store) -> None:
    clients = [store.backend() for _ in range(4)]
    seen: list[bytes] = []
    gate = threading.Barrier(len(clients))

    def take(b: al.Backend) -> None:
        gate.wait()
        seen.append(b.plan_secret())

    threads = [threading.Thread(target=take, args=(b,)) for b in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert len(seen) == len(clients)
        assert len(set(seen)) == 1
    finally:
        if store.kind != "memory":
            for b in clients:
                b.close()


# -- acting on a plan ------------------------------------------------------------------------


def test_an_unchanged_world_gets_every_write_at_once(backend: al.Backend, space: str) -> None:
    order, ledger, refunds = name(space, "order"), name(space, "ledger"), name(space, "c")
    backend.write_record(order, RecordWrite({"status": b'"paid"'}, expected_version=0))
    backend.add_counter(refunds, 3, None, None)
    reads = [
        PlanRead("record", order, 1),
        PlanRead("record", ledger, 0),
        PlanRead("counter", refunds, 1),
    ]
    writes = [
        record(order, status=b'"refunded"'),
        record(ledger, amount=b"40"),
        counter(refunds, 1, None, 10),
    ]
    pid = plan_id()
    receipt = backend.act_plan(pid, reads, writes, "ada", KEEP, None)
    assert isinstance(receipt, PlanReceipt)
    assert receipt.first is True
    assert receipt.plan_id == pid
    assert receipt.approved_by == "ada"
    assert abs(receipt.approved_at - time.time()) < 60
    assert receipt.versions[:2] == (2, 1)
    assert len(receipt.versions) == 3
    got = backend.get_record(order)
    assert got is not None
    assert got.value == {"status": "refunded"}
    assert got.version == 2
    assert backend.get_record(ledger) is not None
    assert backend.get_counter_version(refunds) == (4, receipt.versions[2])


def test_a_moved_read_refuses_the_whole_plan_and_names_every_moved_key(
    backend: al.Backend, space: str
) -> None:
    order, other, c = name(space, "order"), name(space, "other"), name(space, "c")
    backend.write_record(order, RecordWrite({"status": b'"paid"'}, expected_version=0))
    backend.write_record(other, RecordWrite({"x": b"1"}, expected_version=0))
    backend.add_counter(c, 1, None, None)
    reads = [
        PlanRead("record", order, 1),
        PlanRead("record", other, 1),
        PlanRead("counter", c, 1),
    ]
    # Meanwhile: the order is cancelled, and the counter moves away and back (ABA).
    backend.write_record(order, RecordWrite({"status": b'"cancelled"'}))
    backend.add_counter(c, 1, None, None)
    backend.add_counter(c, -1, None, None)
    writes = [record(order, status=b'"refunded"'), record(other, x=b"2"), counter(c, 5)]
    outcome = backend.act_plan(plan_id(), reads, writes, "ada", KEEP, None)
    assert outcome == [
        StaleRead("record", order, 1, 2),
        StaleRead("counter", c, 1, 3),
    ]
    got = backend.get_record(order)
    assert got is not None
    assert got.value == {"status": "cancelled"}
    other_now = backend.get_record(other)
    assert other_now is not None
    assert other_now.value == {"x": 1}
    assert other_now.version == 1
    assert backend.get_counter_version(c) == (1, 3)


def test_a_record_created_since_it_was_read_absent_is_stale(
    backend: al.Backend, space: str
) -> None:
    key = name(space)
    reads = [PlanRead("record", key, 0)]
    backend.write_record(key, RecordWrite({"a": b"1"}, expected_version=0))
    outcome = backend.act_plan(plan_id(), reads, [record(key, a=b"2")], "ada", KEEP, None)
    assert outcome == [StaleRead("record", key, 0, 1)]


def test_approving_twice_acts_once_and_replays_the_receipt(backend: al.Backend, space: str) -> None:
    key, c = name(space), name(space, "c")
    pid = plan_id()
    reads = [PlanRead("record", key, 0)]
    writes = [record(key, n=b"1"), counter(c, 1)]
    first = backend.act_plan(pid, reads, writes, "ada", KEEP, None)
    assert isinstance(first, PlanReceipt)
    assert first.first
    # The world has moved (the plan's own writes, and another writer): the id still answers.
    backend.write_record(key, RecordWrite({"n": b"7"}))
    again = backend.act_plan(pid, reads, writes, "bob", KEEP, None)
    assert isinstance(again, PlanReceipt)
    assert again.first is False
    assert (again.approved_by, again.versions) == ("ada", first.versions)
    assert again.approved_at == pytest.approx(first.approved_at, abs=1e-3)
    assert backend.get_counter(c) == 1, "the writes were applied once"
    got = backend.get_record(key)
    assert got is not None
    assert got.value == {"n": 7}


def test_concurrent_approvals_of_one_plan_act_once(store: Store, space: str) -> None:
    key, c = name(space), name(space, "c")
    pid = plan_id()
    reads = [PlanRead("record", key, 0)]
    writes = [record(key, n=b"1"), counter(c, 1)]
    clients = [store.backend() for _ in range(4)]
    gate = threading.Barrier(len(clients))
    outcomes: list[object] = []

    def approve(b: al.Backend, who: str) -> None:
        gate.wait()
        outcomes.append(b.act_plan(pid, reads, writes, who, KEEP, None))

    threads = [
        threading.Thread(target=approve, args=(b, f"approver-{i}")) for i, b in enumerate(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert len(outcomes) == len(clients)
        receipts = [o for o in outcomes if isinstance(o, PlanReceipt)]
        assert len(receipts) == len(clients), outcomes
        assert sum(r.first for r in receipts) == 1
        assert len({(r.approved_by, r.versions) for r in receipts}) == 1
        assert clients[0].get_counter(c) == 1
    finally:
        if store.kind != "memory":
            for b in clients:
                b.close()


def test_a_plan_past_its_deadline_is_refused_and_writes_nothing(
    backend: al.Backend, space: str
) -> None:
    key = name(space)
    pid = plan_id()
    with pytest.raises(PlanExpired) as info:
        backend.act_plan(pid, [], [record(key, a=b"1")], "ada", KEEP, time.time() - 5)
    assert info.value.plan_id == pid
    assert info.value.now >= info.value.not_after
    assert backend.get_record(key) is None
    ok = backend.act_plan(pid, [], [record(key, a=b"1")], "ada", KEEP, time.time() + 60)
    assert isinstance(ok, PlanReceipt)
    assert ok.first


def test_a_refused_write_leaves_every_write_of_the_plan_unwritten(
    backend: al.Backend, space: str
) -> None:
    key, c, fenced = name(space), name(space, "c"), name(space, "f")
    backend.add_counter(c, 9, None, None)
    backend.write_record(fenced, RecordWrite({"a": b"1"}, fence=5))
    pid = plan_id()
    over = [record(key, a=b"1"), counter(c, 5, None, 10)]
    with pytest.raises(LimitReached):
        backend.act_plan(pid, [], over, "ada", KEEP, None)
    assert backend.get_record(key) is None
    assert backend.get_counter_version(c) == (9, 1)
    stale_fence = [
        record(key, a=b"1"),
        PlanWrite("record", fenced, record=RecordWrite({"a": b"2"}, fence=3)),
    ]
    with pytest.raises(FencedOff):
        backend.act_plan(pid, [], stale_fence, "ada", KEEP, None)
    assert backend.get_record(key) is None
    # Nothing was kept under the id: the plan can still be acted on once it can succeed.
    ok = backend.act_plan(pid, [], [record(key, a=b"1")], "ada", KEEP, None)
    assert isinstance(ok, PlanReceipt)
    assert ok.first


def test_a_receipt_past_keep_for_is_purged_and_the_plan_is_then_stale(
    backend: al.Backend, space: str
) -> None:
    key = name(space)
    pid = plan_id()
    reads = [PlanRead("record", key, 0)]
    first = backend.act_plan(pid, reads, [record(key, a=b"1")], "ada", 0.2, None)
    assert isinstance(first, PlanReceipt)
    assert first.first
    time.sleep(0.5)
    for _ in range(5):
        backend.purge_state(1000)
    # Its receipt is gone, but what it read has moved (its own write): acting again is stale.
    again = backend.act_plan(pid, reads, [record(key, a=b"1")], "ada", 0.2, None)
    assert again == [StaleRead("record", key, 0, 1)]


def test_pins_are_checked_on_sqlite_and_postgres_and_refused_elsewhere(
    store: Store, backend: al.Backend, space: str
) -> None:
    assert backend.plan_pins == (store.kind in {"sqlite", "postgres"})
    if backend.plan_pins:
        return  # each of those stores proves its pins against a table of its own database
    pin = PlanRead("pin", '{"column":"version","table":"orders","where":{"id":1}}', 1)
    key = name(space)
    with pytest.raises(PlanRefused):
        backend.act_plan(plan_id(), [pin], [record(key, a=b"1")], "ada", KEEP, None)
    assert backend.get_record(key) is None
