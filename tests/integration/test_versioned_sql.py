"""versioned_update on the user's own tables: SQLite and PostgreSQL connections they hold."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentlease as al
from agentlease import ConflictError, InvalidInput, InvalidName
from tests import _services
from tests.conftest import unavailable


@pytest.fixture
def sqlite_conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(tmp_path / "app.db", isolation_level=None)
    conn.execute("CREATE TABLE tickets (id INTEGER PRIMARY KEY, title TEXT, version INTEGER)")
    conn.execute("INSERT INTO tickets VALUES (7, 'printer', 1)")
    yield conn
    conn.close()


def test_sqlite_update_checks_the_version(sqlite_conn: sqlite3.Connection) -> None:
    v = al.versioned_update(sqlite_conn, "tickets", {"id": 7}, 1, {"title": "printer fire"})
    assert v == 2
    with pytest.raises(ConflictError) as info:
        al.versioned_update(sqlite_conn, "tickets", {"id": 7}, 1, {"title": "stale"})
    assert info.value.current_version == 2
    assert info.value.current_value == {"id": 7, "title": "printer fire", "version": 2}
    with pytest.raises(ConflictError) as gone:
        al.versioned_update(sqlite_conn, "tickets", {"id": 8}, 1, {"title": "x"})
    assert gone.value.current_version == 0
    assert gone.value.current_value is None
    assert sqlite_conn.execute("SELECT title, version FROM tickets").fetchall() == [
        ("printer fire", 2)
    ]


def test_bad_identifiers_and_empty_updates_are_refused(sqlite_conn: sqlite3.Connection) -> None:
    with pytest.raises(InvalidName):
        al.versioned_update(sqlite_conn, "tickets; DROP TABLE x", {"id": 7}, 1, {"title": "x"})
    with pytest.raises(InvalidName):
        al.versioned_update(sqlite_conn, "tickets", {"id": 7}, 1, {'title"': "x"})
    with pytest.raises(InvalidInput):
        al.versioned_update(sqlite_conn, "tickets", {"id": 7}, 1, {})
    with pytest.raises(InvalidInput):
        al.versioned_update(sqlite_conn, "tickets", {"id": 7}, 1, {"version": 9})
    with pytest.raises(InvalidInput):
        al.versioned_update(object(), "tickets", {"id": 7}, 1, {"title": "x"})


def test_racing_sqlite_writers_never_lose_an_update(tmp_path: Path) -> None:
    path = tmp_path / "race.db"
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("CREATE TABLE counters (id INTEGER PRIMARY KEY, n INTEGER, version INTEGER)")
    setup.execute("INSERT INTO counters VALUES (1, 0, 0)")
    setup.close()

    def bump() -> None:
        conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        for _ in range(25):
            while True:
                n, version = conn.execute("SELECT n, version FROM counters").fetchone()
                try:
                    al.versioned_update(conn, "counters", {"id": 1}, version, {"n": n + 1})
                    break
                except ConflictError:
                    continue
        conn.close()

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check = sqlite3.connect(path)
    assert check.execute("SELECT n, version FROM counters").fetchone() == (100, 100)
    check.close()


def test_postgres_update_checks_the_version() -> None:
    problem = _services.postgres_problem()
    if problem:
        unavailable("postgres", problem)
    import psycopg

    conn = psycopg.connect(_services.POSTGRES_URL, autocommit=True, connect_timeout=5)
    schema = f"vu_{uuid.uuid4().hex[:10]}"
    try:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.docs (id int PRIMARY KEY, body text, version int)")
        conn.execute(f"INSERT INTO {schema}.docs VALUES (1, 'a', 3)")
        assert al.versioned_update(conn, f"{schema}.docs", {"id": 1}, 3, {"body": "b"}) == 4
        with pytest.raises(ConflictError) as info:
            al.versioned_update(conn, f"{schema}.docs", {"id": 1}, 3, {"body": "c"})
        assert info.value.current_version == 4
        assert info.value.current_value == {"id": 1, "body": "b", "version": 4}
    finally:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.close()
