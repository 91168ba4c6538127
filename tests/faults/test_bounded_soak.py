"""Stores stay bounded: N tasks go through enqueue, claim, complete (one in fifty fails for good)
with purging on (retention 0: ``purge(older_than=0)``, the primitive's test setting, after every
batch), idempotency keys with a short window are purged too, and each store ends about the size
it started, however large N is:

* memory: the backend's tables and heaps are back to their sizes after the warm-up;
* SQLite: the pages in use (``page_count - freelist_count``) are back within a few pages;
* Redis (a private ``redis-server``): ``INFO memory`` ``used_memory`` is back within 512 KiB
  (measured: about +110 KiB after 20,000 tasks, +210 KiB after 80,000: allocator slack and client
  buffers, not data: no key of a task is left);
* PostgreSQL (a private schema): the tables hold the rows they held before, and the schema's
  ``pg_total_relation_size`` stays within a bound that depends on the batch, not on N. The test
  runs a plain ``VACUUM`` every 10 batches, as autovacuum would: PostgreSQL reuses the space of
  deleted rows only after one.

The fast profile runs 20,000 tasks per store (each batch also cancels a task, and every claim
names a holder, so attempt histories and cancelled tasks are churned and purged too);
``AGENTLEASE_DEEP=1`` runs 1,000,000. The sizes measured are printed (``-s``) as ``soak <store>:
<before> -> <after>``. Measured on a 2-core machine (20,000 tasks): SQLite 35 -> 35 pages in use
(88 -> 89 in the file); Redis used_memory 1.73 -> 1.95 MB; PostgreSQL 0 -> 0 rows, relations
0.84 -> 4.1 MB (the space of 10 batches between two vacuums).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import agentlease as al
from agentlease._records import TaskSpec
from agentlease.backends.memory import MemoryBackend
from tests import _services
from tests._private_redis import CannotStart, PrivateRedis
from tests.conftest import unavailable

DEEP = os.environ.get("AGENTLEASE_DEEP") == "1"
N = 1_000_000 if DEEP else 20_000
BATCH = 500
Q = "soak"
WARM = 2 * BATCH
# The deep profile runs for minutes per store (a million tasks); the fast one well under one.
pytestmark = pytest.mark.timeout(4 * 3600 if DEEP else 300)


def churn(q: al.Queue, start: int, n: int, every: Callable[[int], None] | None = None) -> None:
    """Run ``n`` tasks through the queue in batches, purging everything finished after each."""
    backend = q.backend
    for first in range(start, start + n, BATCH):
        specs = [
            TaskSpec(payload={"i": i, "pad": "x" * 40}, dedup_key=f"d{i}")
            for i in range(first, first + BATCH)
        ]
        q.enqueue_many(Q, specs)
        jobs = q.claim(Q, BATCH, lease_for=60, holder="soak")  # attempts are kept per task
        assert len(jobs) == BATCH
        q.cancel(q.enqueue(Q, {"i": first}, dedup_key=f"c{first}").task_id, "not needed")
        q.fail(jobs[0].lease, "poison", retry_in=None)
        q.complete_many([(job.lease, {"ok": job.task_id}) for job in jobs[1:]])
        hold = backend.reserve_key(f"key{first}", "fp", "soak", 30, 0.001)
        assert isinstance(hold, al._records.KeyHold)
        backend.complete_key(hold, b"1", 0.001)
        while q.purge(Q, older_than=0, limit=1000) == 1000:
            pass
        assert q.purge(Q, state="dead", older_than=0, limit=1000) == 1
        assert q.purge(Q, state="cancelled", older_than=0, limit=1000) == 1
        backend.purge_keys(1000)
        if every is not None:
            every(first // BATCH)
    counts = q.stats(Q).counts
    assert not counts, counts


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    try:
        server = PrivateRedis(tmp_path / "redis").start()
    except CannotStart as exc:
        unavailable("redis-server", exc.reason)
    yield server
    server.stop()


class Clock:
    """The memory store's clock: a little time passes per call."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        self.now += 0.0001
        return self.now


def test_memory_stays_bounded() -> None:
    clock = Clock()
    backend = MemoryBackend(clock=clock)
    q = al.Queue(backend)

    def sizes() -> dict[str, int]:
        lane = backend._lanes[Q]
        return {
            "rows": len(backend._rows),
            "dedup": len(backend._dedup),
            "ended": sum(len(h) for h in backend._ended.values()),
            "heaps": len(lane.ready) + len(lane.waiting) + len(lane.leased),
            "ids": len(lane.ids),
            "holders": len(backend._holders),
            "keys": len(backend._keys._keys),
        }

    def past_leases() -> None:
        # A lease's heap entry outlives the lease until its expiry passes; the next claim drops
        # it. So the heaps hold at most the leases of one lease_for, whatever N is.
        clock.now += 61
        assert q.claim(Q) == []
        backend.purge_keys(1000)  # the last batch's key, past its window now

    churn(q, 0, WARM)
    past_leases()
    before = sizes()
    churn(q, WARM, N)
    past_leases()
    after = sizes()
    print(f"soak memory: {before} -> {after}")
    assert after == before
    assert set(after.values()) == {0}


def test_sqlite_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "soak.db"
    q = al.Queue.connect(f"sqlite:///{path}")
    try:

        def used() -> tuple[int, int]:
            db = q.backend._db  # type: ignore[attr-defined]
            (pages,) = db.execute("PRAGMA page_count").fetchone()
            (free,) = db.execute("PRAGMA freelist_count").fetchone()
            return pages - free, pages

        churn(q, 0, WARM)
        before = used()
        churn(q, WARM, N)
        after = used()
    finally:
        q.close()
    print(f"soak sqlite (pages in use, pages in file): {before} -> {after}")
    assert after[0] <= before[0] + 8
    assert after[1] <= before[1] + 64  # the file grows no more than one batch's pages


def test_redis_stays_bounded(private_redis: PrivateRedis) -> None:
    import redis

    raw = redis.Redis(port=private_redis.port)
    q = al.Queue.connect(private_redis.url + "?prefix=soak")
    try:

        def used() -> int:
            info: dict[str, Any] = raw.info("memory")
            return int(info["used_memory"])

        churn(q, 0, WARM)
        before = used()
        churn(q, WARM, N)
        after = used()
        keys = sorted(k.decode() for k in raw.keys("*"))
    finally:
        q.close()
        raw.close()
    print(f"soak redis (used_memory): {before} -> {after}; keys: {keys}")
    assert after <= before + 512 * 1024
    assert len(keys) <= 12  # the queue's counters and indexes, the id index, queues, layout


def test_postgres_stays_bounded() -> None:
    problem = _services.postgres_problem()
    if problem:
        unavailable("postgres", problem)
    import psycopg

    schema = _services.namespace()
    url = _services.with_option(_services.POSTGRES_URL, "schema", schema)
    admin = psycopg.connect(_services.POSTGRES_URL, autocommit=True)
    q = al.Queue.connect(url)
    tables = ("agentlease_tasks", "agentlease_attempts", "agentlease_keys", "agentlease_queues")
    try:

        def vacuum(batch: int = 0) -> None:
            if batch % 10 == 9:
                for table in tables:
                    admin.execute(f'VACUUM "{schema}".{table}')

        def measure() -> tuple[dict[str, int], int]:
            vacuum(9)
            rows = {
                t: admin.execute(f'SELECT count(*) FROM "{schema}".{t}').fetchone()[0]  # type: ignore[index]
                for t in tables
            }
            (size,) = admin.execute(
                "SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'r'",
                (schema,),
            ).fetchone()  # type: ignore[misc]
            return rows, int(size)

        churn(q, 0, WARM, vacuum)
        before = measure()
        churn(q, WARM, N, vacuum)
        after = measure()
    finally:
        q.close()
        admin.close()
        _services.drop_postgres_schema(schema)
    print(f"soak postgres (rows, bytes): {before} -> {after}")
    assert after[0] == before[0]
    assert after[1] <= before[1] + 6 * 1024 * 1024  # a few batches' worth, whatever N is
