"""Plans on PostgreSQL beyond the common contract: pins on the user's own table in the store's
database, the placeholder that makes a read of an absent record hold until the plan commits,
counter versions with holds that ran out, the asyncio face, and a schema upgraded from
migration 11.

A pin names a table by itself (looked up by the connections' search_path: the store's schema
alone) or as ``schema.table``; its row is read ``FOR SHARE`` in the plan's transaction.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import agentlease as al
from agentlease import ConflictError, InvalidName, PlanRefused, TransitionRefused
from agentlease._records import PlanRead, PlanReceipt, PlanWrite, RecordWrite, StaleRead
from agentlease.backends._postgres_url import parse
from agentlease.backends._sync.postgres_backend import PostgresBackend

KEEP = 3600.0


def pin_key(table: str, where: dict[str, Any], column: str = "version") -> str:
    return json.dumps(
        {"column": column, "table": table, "where": where}, sort_keys=True, separators=(",", ":")
    )


def write(key: str, **fields: bytes) -> PlanWrite:
    return PlanWrite("record", key, record=RecordWrite(dict(fields)))


def plan_id() -> str:
    return f"plan-{uuid.uuid4().hex}"


@pytest.fixture
def url(served_url_postgres: str) -> str:
    return served_url_postgres


@pytest.fixture
def backend(url: str) -> Iterator[al.Backend]:
    b = al.connect(url)
    b.get_counter("warm-up")  # migrates the schema
    yield b
    b.close()


@pytest.fixture
def db(url: str, backend: al.Backend) -> Iterator[psycopg.Connection[Any]]:
    """A plain connection to the store's schema, with the user's table ``orders``."""
    settings = parse(url)
    with psycopg.connect(settings.conninfo, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {settings.schema}".encode())
        conn.execute(
            "CREATE TABLE orders (id integer PRIMARY KEY, status text NOT NULL,"
            " version bigint NOT NULL)"
        )
        conn.execute("INSERT INTO orders VALUES (1, 'paid', 1), (2, 'paid', 1), (3, 'paid', 1)")
        yield conn


# -- pins ------------------------------------------------------------------------------------


def test_an_unmoved_pin_acts_and_a_moved_one_is_stale(
    backend: al.Backend, db: psycopg.Connection[Any]
) -> None:
    assert backend.plan_pins
    pin = pin_key("orders", {"id": 1})
    ok = backend.act_plan(
        plan_id(), [PlanRead("pin", pin, 1)], [write("a", x=b"1")], "ada", KEEP, None
    )
    assert isinstance(ok, PlanReceipt)
    assert ok.first

    db.execute("UPDATE orders SET status = 'cancelled', version = version + 1 WHERE id = 1")
    moved = backend.act_plan(
        plan_id(), [PlanRead("pin", pin, 1)], [write("b", x=b"1")], "ada", KEEP, None
    )
    assert moved == [StaleRead("pin", pin, 1, 2)]
    assert backend.get_record("b") is None


def test_a_pin_of_an_absent_row_reads_version_0_and_text_values_match(
    backend: al.Backend, db: psycopg.Connection[Any], url: str
) -> None:
    absent = pin_key("orders", {"id": 99})
    by_status = pin_key("orders", {"id": 2, "status": "paid"})
    qualified = pin_key(f"{parse(url).schema}.orders", {"id": 3})
    reads = [
        PlanRead("pin", absent, 0),
        PlanRead("pin", by_status, 1),
        PlanRead("pin", qualified, 1),
    ]
    ok = backend.act_plan(plan_id(), reads, [write("c", x=b"1")], "ada", KEEP, None)
    assert isinstance(ok, PlanReceipt)
    db.execute("INSERT INTO orders VALUES (99, 'new', 1)")
    assert backend.act_plan(plan_id(), reads[:1], [], "ada", KEEP, None) == [
        StaleRead("pin", absent, 0, 1)
    ]


def _unreachable() -> PostgresBackend:
    """A backend on a port where no server listens: any I/O would raise BackendUnavailable."""
    return PostgresBackend(parse("postgresql://root@127.0.0.1:1/test?connect_timeout=1"))


@pytest.mark.parametrize(
    "key",
    [
        pin_key("orders; DROP TABLE orders", {"id": 1}),
        pin_key("orders", {"id = 1 OR true --": 1}),
        pin_key("orders", {"id": 1}, column='version" FROM orders --'),
        pin_key("a.b.c", {"id": 1}),
    ],
)
def test_a_bad_identifier_is_refused_before_any_io(key: str) -> None:
    unreachable = _unreachable()
    try:
        with pytest.raises(InvalidName):
            unreachable.act_plan(plan_id(), [PlanRead("pin", key, 1)], [], "ada", KEEP, None)
    finally:
        unreachable.close()


@pytest.mark.parametrize(
    "key",
    [
        "not json",
        json.dumps({"table": "orders", "where": {}, "column": "version"}),
        json.dumps({"table": "orders", "where": {"id": [1]}, "column": "version"}),
        json.dumps({"table": "orders", "where": {"id": 1}}),
    ],
)
def test_a_malformed_pin_is_refused_before_any_io(key: str) -> None:
    unreachable = _unreachable()
    try:
        with pytest.raises(PlanRefused):
            unreachable.act_plan(plan_id(), [PlanRead("pin", key, 1)], [], "ada", KEEP, None)
    finally:
        unreachable.close()


@pytest.mark.parametrize(
    ("key", "why"),
    [
        (pin_key("no_such_table", {"id": 1}), "no_such_table"),
        (pin_key("orders", {"no_such_column": 1}), "no_such_column"),
        (pin_key("orders", {"id": "not a number"}), "not a number"),
        (pin_key("orders", {"status": "paid"}), "more than one row"),
        (pin_key("orders", {"id": 1}, column="status"), "status"),
    ],
)
def test_a_pin_the_store_cannot_read_refuses_the_plan_and_writes_nothing(
    backend: al.Backend, db: psycopg.Connection[Any], key: str, why: str
) -> None:
    pid = plan_id()
    with pytest.raises(PlanRefused) as info:
        backend.act_plan(pid, [PlanRead("pin", key, 1)], [write("d", x=b"1")], "ada", KEEP, None)
    assert why in str(info.value)
    assert info.value.plan_id == pid
    assert backend.get_record("d") is None


# -- absent records, refusals, placeholders ----------------------------------------------------


def _waiting(db: psycopg.Connection[Any], pid: int) -> bool:
    """Whether some session waits for a lock that session ``pid`` holds."""
    row = db.execute(
        "SELECT count(*) FROM pg_locks l"
        " WHERE NOT l.granted AND %s = ANY (pg_blocking_pids(l.pid))",
        (pid,),
    ).fetchone()
    return row is not None and row[0] > 0


def test_a_record_created_while_the_plan_checks_it_is_stale(
    backend: al.Backend, db: psycopg.Connection[Any], url: str
) -> None:
    """A first write of a record, uncommitted when the plan looks: the plan waits for it (the
    placeholder's insert meets it), then finds it created."""
    key = f"race-{uuid.uuid4().hex[:8]}"
    settings = parse(url)
    with psycopg.connect(settings.conninfo) as other:  # a transaction left open
        other.execute(f"SET search_path TO {settings.schema}".encode())
        other.execute(
            "SELECT agentlease_write_record(%s, ARRAY['a'], ARRAY['1'::bytea], false, 0, NULL,"
            " '{}', false, NULL)",
            (key,),
        )
        outcome: list[object] = []
        acting = threading.Thread(
            target=lambda: outcome.append(
                backend.act_plan(plan_id(), [PlanRead("record", key, 0)], [], "ada", KEEP, None)
            )
        )
        acting.start()
        for _ in range(200):  # until the plan waits on the uncommitted row
            if _waiting(db, other.info.backend_pid):
                break
            time.sleep(0.025)
        else:
            pytest.fail("the plan did not wait for the record's first write")
        other.commit()
    acting.join(30)
    assert outcome == [[StaleRead("record", key, 0, 1)]]


def test_a_read_of_an_absent_record_leaves_no_row_behind(
    backend: al.Backend, db: psycopg.Connection[Any]
) -> None:
    key = f"ghost-{uuid.uuid4().hex[:8]}"
    ok = backend.act_plan(plan_id(), [PlanRead("record", key, 0)], [], "ada", KEEP, None)
    assert isinstance(ok, PlanReceipt)
    assert backend.get_record(key) is None
    row = db.execute("SELECT count(*) FROM agentlease_records WHERE key = %s", (key,)).fetchone()
    assert row == (0,)


def test_a_guarded_write_of_a_plan_raises_its_own_refusal(backend: al.Backend) -> None:
    key, fresh = f"g-{uuid.uuid4().hex[:8]}", f"f-{uuid.uuid4().hex[:8]}"
    backend.write_record(key, RecordWrite({"status": b'"paid"'}))
    conflict = PlanWrite("record", key, record=RecordWrite({"status": b'"x"'}, expected_version=5))
    with pytest.raises(ConflictError) as info:
        backend.act_plan(plan_id(), [], [write(fresh, a=b"1"), conflict], "ada", KEEP, None)
    assert info.value.current_version == 1
    guarded = PlanWrite(
        "record",
        fresh,
        record=RecordWrite(
            {"status": b'"refunded"'}, guard_field="status", allowed_from=(b'"paid"',)
        ),
    )
    with pytest.raises(TransitionRefused):  # absent, and absence is not allowed
        backend.act_plan(plan_id(), [PlanRead("record", fresh, 0)], [guarded], "ada", KEEP, None)
    assert backend.get_record(fresh) is None


# -- counters --------------------------------------------------------------------------------


def test_a_hold_that_ran_out_moves_the_version_before_and_after_its_sweep(
    backend: al.Backend,
) -> None:
    c = f"c-{uuid.uuid4().hex[:8]}"
    backend.hold_counter(c, "t1", 2, 10, 0.2)
    backend.hold_counter(c, "t2", 3, 10, 0.2)
    assert backend.get_counter_version(c) == (5, 2)
    time.sleep(0.4)  # both holds run out on the store's clock
    assert backend.get_counter_version(c) == (0, 4), "read before any sweep"
    backend.add_counter(c, 0, None, None)  # sweeps; adds nothing
    assert backend.get_counter_version(c) == (0, 4), "the sweep lands where the read said"
    backend.add_counter(c, 1, None, None)
    assert backend.get_counter_version(c) == (1, 5)
    backend.hold_counter(c, "t3", 1, 10, 30.0)
    assert backend.commit_hold(c, "t3", 4)  # settled at another number of units
    assert backend.get_counter_version(c) == (5, 7)
    backend.hold_counter(c, "t4", 1, 10, 30.0)
    assert backend.commit_hold(c, "t4")  # kept as held: the value does not move
    assert backend.get_counter_version(c) == (6, 8)


# -- the asyncio face ------------------------------------------------------------------------


def test_the_asyncio_face_acts_on_plans_and_shares_the_secret(
    url: str, backend: al.Backend
) -> None:
    key, c = f"k-{uuid.uuid4().hex[:8]}", f"c-{uuid.uuid4().hex[:8]}"
    pid = plan_id()

    async def run() -> tuple[bytes, object, object, tuple[int, int]]:
        ab = al.connect_async(url)
        try:
            secret = await ab.plan_secret()
            reads = [PlanRead("record", key, 0), PlanRead("counter", c, 0)]
            writes = [write(key, n=b"1"), PlanWrite("counter", c, delta=2, high=5)]
            first = await ab.act_plan(pid, reads, writes, "ada", KEEP, None)
            again = await ab.act_plan(pid, reads, writes, "bob", KEEP, None)
            return secret, first, again, await ab.get_counter_version(c)
        finally:
            await ab.close()

    secret, first, again, counter = asyncio.run(run())
    assert secret == backend.plan_secret()
    assert isinstance(first, PlanReceipt)
    assert isinstance(again, PlanReceipt)
    assert (first.first, again.first, again.approved_by) == (True, False, "ada")
    assert first.versions == (1, 1)
    assert counter == (2, 1)


# -- upgrading a schema of migration 11 --------------------------------------------------------


def test_a_schema_of_migration_11_keeps_its_counters_at_version_0(
    served_url_postgres: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentlease.backends._postgres_driver import MIGRATIONS
    from agentlease.backends._sync import postgres_schema

    assert [m.version for m in MIGRATIONS][11:12] == [12]
    with monkeypatch.context() as patch:  # this agentlease, as it was at migration 11
        patch.setattr(postgres_schema, "MIGRATIONS", MIGRATIONS[:11])
        old = al.connect(served_url_postgres)
        try:
            old.add_counter("spent", 7, None, None)
            old.hold_counter("seats", "t1", 2, 10, 3600.0)
            old.add_counter("seats", 1, None, None)
            old.write_record("order", RecordWrite({"status": b'"paid"'}))
        finally:
            old.close()
    new = al.connect(served_url_postgres)
    try:
        assert new.get_counter_version("spent") == (7, 0)
        assert new.get_counter_version("seats") == (3, 0)
        assert new.release_hold("seats", "t1")
        assert new.get_counter_version("seats") == (1, 1)
        reads = [PlanRead("counter", "spent", 0), PlanRead("record", "order", 1)]
        done = new.act_plan(
            plan_id(), reads, [PlanWrite("counter", "spent", delta=1)], "ada", KEEP, None
        )
        assert isinstance(done, PlanReceipt)
        assert new.get_counter_version("spent") == (8, 1)
    finally:
        new.close()
