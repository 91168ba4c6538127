"""Partitions on the SQL stores: races across connections, and databases made before them.

The race runs threads that each hold their own connection (SQLite) or pool (PostgreSQL):
enqueuers add tasks of a few partitions, alone and in mixed batches, while workers claim,
complete (alone and in batches), retry and abandon them, so enqueues keep meeting the
completion of their partition's last busy task. A monitor reads the table in one statement
at a time and must never see two busy tasks of one partition; at the end every task must have
finished (none left parked) and none may have run twice.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

import agentlease as al
from agentlease import QueueSettings, TaskSpec
from agentlease.backends._postgres_driver import MIGRATIONS, Q, channel, configure
from agentlease.backends._postgres_url import parse
from agentlease.backends.sqlite import SCHEMA_VERSION
from tests.conftest import Store

QUEUE = "race"
PARTITIONS = ("acct-0", "acct-1", "acct-2")
BUSY_TWICE = """
SELECT partition, count(*) FROM agentlease_tasks
WHERE partition IS NOT NULL AND state IN ('scheduled', 'queued', 'leased', 'failed')
GROUP BY partition HAVING count(*) > 1
"""


@pytest.fixture(params=["sqlite", "postgres"])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The SQLite and PostgreSQL stores, each fresh."""
    if request.param == "sqlite":
        store = Store("sqlite", f"sqlite:///{tmp_path / 'tasks.db'}")
    else:
        store = Store("postgres", request.getfixturevalue("served_url_postgres"))
    yield store
    store.close()


@contextmanager
def _reader(store: Store) -> Iterator[Callable[[str], list[tuple[Any, ...]]]]:
    """A connection of the test's own that runs one read-only statement at a time."""
    if store.kind == "sqlite":
        db = sqlite3.connect(store.url.removeprefix("sqlite:///"), check_same_thread=False)
        with closing(db):
            yield lambda sql: db.execute(sql).fetchall()
        return
    settings = parse(store.url)
    with psycopg.connect(settings.conninfo, **settings.connect_kwargs()) as conn:
        yield lambda sql: conn.execute(sql.encode()).fetchall()


def test_racing_enqueues_and_completions_never_run_a_partition_twice(sql_store: Store) -> None:
    settings = QueueSettings(max_reclaims=0)  # an abandoned lease is dead-lettered when reaped
    sql_store.queue(settings).enqueue(QUEUE, {"warm": True})  # the schema exists before the race
    enqueued: list[str] = []
    finished: Counter[str] = Counter()
    running: dict[str, int] = defaultdict(int)
    overlaps: list[str] = []
    monitor_saw: list[Any] = []
    lock = threading.Lock()
    producing = threading.Event()
    producing.set()
    stop = threading.Event()

    def produce(seed: int) -> None:
        rand = random.Random(seed)
        q = sql_store.queue(settings)
        for i in range(25):
            if rand.random() < 0.4:  # a batch: partitions in a random order, one maybe twice
                parts = rand.choices(PARTITIONS, k=rand.randint(2, 4))
                specs = [
                    TaskSpec(payload={"p": p}, id=f"s{seed}-{i}-{k}", partition=p)
                    for k, p in enumerate(parts)
                ]
                q.enqueue_many(QUEUE, specs)
                with lock:
                    enqueued.extend(s.id for s in specs if s.id is not None)
            else:
                p = rand.choice(PARTITIONS)
                task_id = f"s{seed}-{i}"
                q.enqueue(QUEUE, {"p": p}, id=task_id, partition=p)
                with lock:
                    enqueued.append(task_id)
            time.sleep(rand.uniform(0, 0.004))

    def work(seed: int) -> None:
        rand = random.Random(seed)
        q = sql_store.queue(settings)
        while not stop.is_set():
            abandon = rand.random() < 0.04  # a worker that dies: its leases run out, and a
            lease_for = 0.05 if abandon else 5.0  # later claim's reap dead-letters them
            jobs = q.claim(QUEUE, n=rand.randint(1, 3), lease_for=lease_for)
            if not jobs:
                time.sleep(0.002)
                continue
            if abandon:
                continue
            done: list[al.Job] = []
            for job in jobs:
                payload = job.payload
                assert isinstance(payload, dict)
                if "p" not in payload:
                    done.append(job)
                    continue
                p = str(payload["p"])
                with lock:
                    running[p] += 1
                    if running[p] > 1:
                        overlaps.append(p)
                time.sleep(rand.uniform(0, 0.002))
                with lock:
                    running[p] -= 1
                roll = rand.random()
                if roll < 0.05:
                    q.release(job.lease, front=True)  # still busy: queued again
                elif roll < 0.12:
                    q.fail(job.lease, ValueError("retry"), retry_in=0.005)  # still busy
                else:
                    done.append(job)
            if len(done) > 1:
                assert q.complete_many([(j.lease, None) for j in done]) == [None] * len(done)
            elif done:
                q.complete(done[0].lease, None)
            with lock:
                finished.update(j.task_id for j in done)

    def monitor() -> None:
        with _reader(sql_store) as read:
            while not stop.is_set():
                rows = read(BUSY_TWICE)
                if rows:
                    monitor_saw.append(rows)
                time.sleep(0.001)

    producers = [threading.Thread(target=produce, args=(i,)) for i in range(3)]
    workers = [threading.Thread(target=work, args=(100 + i,)) for i in range(4)]
    watcher = threading.Thread(target=monitor)
    threads = [*producers, *workers, watcher]
    for t in threads:
        t.start()
    for t in producers:
        t.join(60)
    deadline = time.monotonic() + 60
    q = sql_store.queue(settings)
    while time.monotonic() < deadline:
        counts = q.stats(QUEUE).counts
        if set(counts) <= {"done", "dead"}:
            break
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(60)

    assert monitor_saw == []
    assert overlaps == []
    counts = {state: n for state, n in q.stats(QUEUE).counts.items() if n}
    assert set(counts) <= {"done", "dead"}, counts  # nothing left parked, or anywhere else
    assert sum(counts.values()) == len(enqueued) + 1
    assert max(finished.values()) == 1  # every completion accepted once
    assert q.stats(QUEUE).hot_partitions == ()


def test_a_reaped_dead_task_starts_the_next_across_connections(sql_store: Store) -> None:
    producer = sql_store.queue(QueueSettings(max_reclaims=0))
    worker = sql_store.queue(QueueSettings(max_reclaims=0))
    producer.enqueue_many(QUEUE, [TaskSpec(id=f"r{i}", partition="p") for i in range(3)])
    (first,) = worker.claim(QUEUE, n=5, lease_for=0.2)
    time.sleep(0.4)
    assert [r.outcome for r in producer.reap(QUEUE)] == ["dead"]
    (second,) = worker.claim(QUEUE, n=5, lease_for=5.0)
    assert (first.task_id, second.task_id) == ("r0", "r1")
    assert producer.get("r2").state == "parked"


# -- PostgreSQL: the two races, held open ------------------------------------------------------
#
# A step of the queue is one statement in autocommit mode, so the windows these races need last
# microseconds. Here the first step runs inside a transaction the test holds open (the trigger
# fires for any session's UPDATE, and the functions are plain SQL), so the second step meets it
# while it is uncommitted, every time.


@contextmanager
def _open_transaction(url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection of the backend's kind with a transaction left open until the block ends."""
    settings = parse(url)
    kwargs = settings.connect_kwargs() | {"autocommit": False}
    with psycopg.connect(settings.conninfo, **kwargs) as conn:
        configure(conn)
        yield conn
        conn.commit()


def _enqueue_sql(url: str, task_id: str, partition: str) -> dict[str, Any]:
    """The parameters of the backend's ``enqueue_partitioned`` statement for one task."""
    return {
        "id": [task_id],
        "queue": [QUEUE],
        "priority": [0],
        "payload": [b"{}"],
        "dedup_key": [None],
        "max_reclaims": [5],
        "delay": [0.0],
        "partition": [partition],
        "queue_names": [QUEUE],
        "channels": [channel(parse(url).schema, QUEUE)],
        "context": [None],
    }


def _blocked(target: Callable[[], object]) -> threading.Thread:
    """Run ``target`` in a thread and check that it is still waiting a moment later."""
    thread = threading.Thread(target=target)
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive(), "the second step did not wait for the first one's lock"
    return thread


def test_postgres_enqueue_meets_an_uncommitted_completion(served_url_postgres: str) -> None:
    q = al.Queue(al.connect(served_url_postgres))
    try:
        q.enqueue(QUEUE, {}, id="a", partition="p")
        (a,) = q.claim(QUEUE, n=1, lease_for=30.0)
        with _open_transaction(served_url_postgres) as conn:
            params = {"id": a.lease.task_id, "token": a.lease.token, "result": None}
            assert conn.execute(Q["complete"], params).rowcount == 1
            # The partition's last busy task is done but not committed: the enqueue waits for
            # the lock the completion's trigger holds, then sees the partition idle.
            thread = _blocked(lambda: q.enqueue(QUEUE, {}, id="b", partition="p"))
        thread.join(30)
        assert q.get("b").state == "queued"
    finally:
        q.close()


def test_postgres_completion_meets_an_uncommitted_enqueue(served_url_postgres: str) -> None:
    q = al.Queue(al.connect(served_url_postgres))
    try:
        q.enqueue(QUEUE, {}, id="a", partition="p")
        (a,) = q.claim(QUEUE, n=1, lease_for=30.0)
        with _open_transaction(served_url_postgres) as conn:
            conn.execute(Q["enqueue_partitioned"], _enqueue_sql(served_url_postgres, "b", "p"))
            # b is parked behind a (uncommitted): the completion of a waits in its trigger for
            # the enqueue's lock, then sees b parked and starts it.
            thread = _blocked(lambda: q.complete(a.lease, None))
        thread.join(30)
        assert q.get("b").state == "queued"
    finally:
        q.close()


def test_postgres_enqueues_into_an_idle_partition_meet(served_url_postgres: str) -> None:
    q = al.Queue(al.connect(served_url_postgres))
    try:
        q.enqueue(QUEUE, {}, id="warm")
        with _open_transaction(served_url_postgres) as conn:
            conn.execute(Q["enqueue_partitioned"], _enqueue_sql(served_url_postgres, "a", "p"))
            thread = _blocked(lambda: q.enqueue(QUEUE, {}, id="b", partition="p"))
        thread.join(30)
        assert (q.get("a").state, q.get("b").state) == ("queued", "parked")
    finally:
        q.close()


# -- databases made before partitions -----------------------------------------------------------

SQLITE_V3_TASKS = """
CREATE TABLE agentlease_queues (name TEXT PRIMARY KEY, seq INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE agentlease_tasks (
    id TEXT PRIMARY KEY, queue TEXT NOT NULL, state TEXT NOT NULL, priority INTEGER NOT NULL,
    seq INTEGER NOT NULL, payload BLOB NOT NULL, dedup_key TEXT,
    attempt INTEGER NOT NULL DEFAULT 0, reclaims INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0, max_reclaims INTEGER NOT NULL,
    created_at REAL NOT NULL, run_at REAL NOT NULL, token TEXT, leased_at REAL,
    expires_at REAL, lease_deadline REAL, progress_timeout REAL, progressed_at REAL,
    finished_at REAL, progress BLOB, checkpoint BLOB, result BLOB, error BLOB
);
CREATE INDEX agentlease_ready
    ON agentlease_tasks (queue, priority DESC, seq) WHERE state = 'queued';
INSERT INTO agentlease_queues VALUES ('race', 1);
INSERT INTO agentlease_tasks (id, queue, state, priority, seq, payload, max_reclaims,
                              created_at, run_at)
VALUES ('old', 'race', 'queued', 0, 1, '{"made": "before"}', 5, 0, 0);
PRAGMA user_version = 3;
"""


def _check_upgraded(q: al.Queue) -> al.Job:
    """A store upgraded with an old task in it: the old task and partitions both work. Returns
    the leased job of the partition's second task."""
    assert q.get("old").partition is None
    assert q.get("old").context_json is None  # no context: its own root, no deadline
    assert q.get("old").root_id == "old"
    q.enqueue_many(QUEUE, [TaskSpec(id=f"n{i}", partition="p") for i in range(2)])
    assert q.stats(QUEUE).hot_partitions == (("p", 1),)
    jobs = q.claim(QUEUE, n=5, lease_for=5.0)
    assert sorted(j.task_id for j in jobs) == ["n0", "old"]
    assert jobs[[j.task_id for j in jobs].index("old")].payload == {"made": "before"}
    for job in jobs:
        q.complete(job.lease, None)
    (n1,) = q.claim(QUEUE, n=5, lease_for=5.0)
    assert n1.task_id == "n1"
    return n1


def test_a_sqlite_database_at_version_3_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(SQLITE_V3_TASKS)
    db.close()
    q = al.Queue(al.connect(f"sqlite:///{path}"))
    try:
        _check_upgraded(q)
        assert q.enqueue_many("other", [TaskSpec(id="k")])[0].created  # the v4 schema is whole
    finally:
        q.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    names = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    assert {"agentlease_busy", "agentlease_parked", "agentlease_unpark", "agentlease_keys"} <= names
    assert {"agentlease_counter_holds", "agentlease_budgets", "agentlease_breakers"} <= names
    db.close()


def test_a_postgres_schema_at_version_3_is_upgraded(served_url_postgres: str) -> None:
    settings = parse(served_url_postgres)
    with psycopg.connect(settings.conninfo, autocommit=True) as conn, conn.transaction():
        conn.execute(f"CREATE SCHEMA {settings.schema}".encode())
        conn.execute(f"SET LOCAL search_path TO {settings.schema}".encode())
        conn.execute(Q["migrations_table"])
        for m in MIGRATIONS[:3]:
            conn.execute(m.sql)
            conn.execute(Q["record_migration"], {"version": m.version, "name": m.name})
        conn.execute(
            "INSERT INTO agentlease_queues (name) VALUES ('race');"
            "INSERT INTO agentlease_tasks (id, queue, state, priority, seq, payload,"
            " max_reclaims, created_at, run_at) VALUES ('old', 'race', 'queued', 0,"
            " nextval('agentlease_seq'), '{\"made\": \"before\"}', 5, now(), now())"
        )
    q = al.Queue(al.connect(served_url_postgres))
    waiter = al.connect(served_url_postgres)
    try:
        n1 = _check_upgraded(q)
        # The queue made before version 4 learnt its channel at the first enqueue with a
        # partition: a completion that starts a parked task wakes idle workers.
        q.enqueue(QUEUE, {}, id="n2", partition="p")
        woke: list[float] = []
        thread = threading.Thread(
            target=lambda: (waiter.wait_for_work(QUEUE, 20.0), woke.append(time.monotonic()))
        )
        thread.start()
        time.sleep(1.0)  # the waiter is listening by now
        completed_at = time.monotonic()
        q.complete(n1.lease, None)
        thread.join(30)
        assert woke, "the waiter never woke"
        assert woke[0] - completed_at < 5.0
        assert q.get("n2").state == "queued"
    finally:
        q.close()
        waiter.close()
