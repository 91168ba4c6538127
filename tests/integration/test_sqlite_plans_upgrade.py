"""A SQLite database of schema version 10 (before plans) is brought to version 11 when opened:
its counters keep their values and gain a version (0, then raised by every change), and the
plan receipts and the store's plan secret are there to use."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import agentlease as al
from agentlease._records import PlanRead, PlanReceipt, PlanWrite, StaleRead
from agentlease.backends.sqlite import SCHEMA_VERSION

WITHOUT_VERSION_11 = (
    "DROP TABLE agentlease_plan_receipts",
    "DROP TABLE agentlease_plan_secret",
    "ALTER TABLE agentlease_counters DROP COLUMN version",
)


def test_a_version_10_database_gains_counter_versions_receipts_and_a_secret(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    with al.SharedState.connect(url) as state:
        state.add("seats", 3)
        state.compare_and_set("order", 0, {"status": "paid"})
    db = sqlite3.connect(path)  # back to version 10, with a counter and a record in it
    for statement in WITHOUT_VERSION_11:
        db.execute(statement)
    db.execute("PRAGMA user_version = 10")
    db.commit()
    db.close()

    backend = al.connect(url)
    try:
        assert backend.get_counter_version("seats") == (3, 0)
        secret = backend.plan_secret()
        assert len(secret) == 32
        reads = [PlanRead("counter", "seats", 0), PlanRead("record", "order", 1)]
        writes = [PlanWrite("counter", "seats", delta=-1, low=0)]
        receipt = backend.act_plan("p-1", reads, writes, "ada", 60.0, None)
        assert isinstance(receipt, PlanReceipt)
        assert receipt.versions == (1,)
        assert backend.get_counter_version("seats") == (2, 1)
        assert backend.act_plan("p-2", reads, writes, "ada", 60.0, None) == [
            StaleRead("counter", "seats", 0, 1)
        ]
    finally:
        backend.close()
    backend = al.connect(url)
    try:
        assert backend.plan_secret() == secret, "the secret is kept in the file"
    finally:
        backend.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (11,)
    db.close()
