"""Stores made before cancellation (SQLite schema 7, PostgreSQL migration 8) are upgraded in
place: their tasks can be cancelled, and a cancel frees a partition (the new trigger)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

import agentlease as al
from agentlease.backends._postgres_driver import MIGRATIONS, Q
from agentlease.backends._postgres_url import parse
from agentlease.backends.sqlite import SCHEMA_VERSION

OLD_TRIGGER = """
CREATE TRIGGER agentlease_unpark
AFTER UPDATE OF state ON agentlease_tasks
WHEN NEW.partition IS NOT NULL AND NEW.state IN ('done', 'dead')
     AND OLD.state NOT IN ('done', 'dead')
BEGIN
    UPDATE agentlease_tasks SET state = 'queued'
    WHERE id = (SELECT id FROM agentlease_tasks
                WHERE queue = NEW.queue AND partition = NEW.partition AND state = 'parked'
                ORDER BY seq LIMIT 1);
END
"""


def _check(q: al.Queue) -> None:
    assert q.get("first").cancel_reason is None
    assert q.get("second").state == "parked"
    assert q.cancel("first", "upgraded").outcome == "cancelled"
    assert q.get("second").state == "queued"  # the cancel freed the partition
    (job,) = q.claim("jobs", lease_for=30)
    assert q.cancel("second", "stop").outcome == "requested"
    assert q.extend([job.lease]) == [None]
    assert q.get("second").state == "cancelled"
    assert q.stats("jobs").counts["cancelled"] == 2


def test_a_sqlite_database_of_version_7_gains_cancellation(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with al.Queue.connect(f"sqlite:///{path}") as q:
        q.enqueue("jobs", {}, id="first", partition="p")
        q.enqueue("jobs", {}, id="second", partition="p")
    db = sqlite3.connect(path)  # back to version 7: no cancel column, the old trigger
    db.execute("ALTER TABLE agentlease_tasks DROP COLUMN cancel_reason")
    db.execute("DROP TRIGGER agentlease_unpark")
    db.execute(OLD_TRIGGER)
    db.execute("PRAGMA user_version = 7")
    db.commit()
    db.close()
    with al.Queue.connect(f"sqlite:///{path}") as q:
        _check(q)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    db.close()


def test_a_postgres_schema_at_migration_8_gains_cancellation(served_url_postgres: str) -> None:
    settings = parse(served_url_postgres)
    before = [m for m in MIGRATIONS if m.version < 9]
    assert [m.version for m in MIGRATIONS if m.version >= 9][:1] == [9]
    with psycopg.connect(settings.conninfo, autocommit=True) as conn, conn.transaction():
        conn.execute(f"CREATE SCHEMA {settings.schema}".encode())
        conn.execute(f"SET LOCAL search_path TO {settings.schema}".encode())
        conn.execute(Q["migrations_table"])
        for m in before:
            conn.execute(m.sql)
            conn.execute(Q["record_migration"], {"version": m.version, "name": m.name})
        conn.execute(
            "INSERT INTO agentlease_queues (name) VALUES ('jobs');"
            "INSERT INTO agentlease_tasks (id, queue, state, priority, seq, payload,"
            " max_reclaims, created_at, run_at, partition) VALUES"
            " ('first', 'jobs', 'queued', 0, nextval('agentlease_seq'), '{}', 5, now(), now(),"
            " 'p'),"
            " ('second', 'jobs', 'parked', 0, nextval('agentlease_seq'), '{}', 5, now(), now(),"
            " 'p')"
        )
    with al.Queue.connect(served_url_postgres) as q:
        _check(q)
