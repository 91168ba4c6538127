"""``agentlease bench`` on PostgreSQL: the raw baseline, and claim latency / extend cost.

:class:`RawPostgres` is the baseline the issue defines: psycopg (the library's own driver) on one
autocommit connection, running a loop of ONE ``FOR UPDATE SKIP LOCKED`` claim statement and ONE
fenced complete statement per task, with no agentlease in the way, on a plain table of the same
shape (the library's migration applied to a schema of its own, dropped afterwards). Its claim
returns what any worker needs (id, token, attempt, payload); the library returns more.
:class:`PostgresStores` plugs it into :func:`agentlease.bench.command.run_bench`, and
:class:`PostgresTarget` lets spawned bench processes open either side.

:func:`latency_and_extend` measures what the design promises about scale: the claim latency
(p50, p99) with 1,000 and with 1,000,000 tasks queued, and the time of one ``extend`` call for
10,000 live leases. :class:`RawPostgresKeys` is the baseline of the idempotency rows (see
:mod:`agentlease.bench.keys`): one ``INSERT ... ON CONFLICT DO NOTHING`` per key on a pooled
autocommit connection; :class:`RawPostgresGuards` that of the shared-state guard rows (see
:mod:`agentlease.bench.guards`): one version-checked ``UPDATE`` per compare-and-set, one
conditional upsert and one owner-checked ``UPDATE`` per lock cycle. Run them all from a shell::

    python -m agentlease.bench.postgres_rows postgresql://user@host/db [--tasks N] [--latency]
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, LiteralString

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from agentlease._redact import redact_url
from agentlease._sync.queue import Queue
from agentlease.backends import connect
from agentlease.backends._postgres_url import PostgresSettings, parse
from agentlease.backends._sync.postgres_schema import migrate
from agentlease.bench.command import Row, Stores, cases, run_bench
from agentlease.bench.guards import (
    DEFAULT_GUARDS,
    LOCK_TTL,
    GuardRow,
    LibraryGuards,
    run_guards,
)
from agentlease.bench.keys import DEFAULT_CALLS, KeyRow, LibraryKeys, run_keys
from agentlease.bench.loops import Driver, Library, Mode, Target
from agentlease.errors import InvalidURL

__all__ = [
    "PostgresStores",
    "PostgresTarget",
    "RawPostgres",
    "RawPostgresGuards",
    "RawPostgresKeys",
    "compare_guards",
    "compare_keys",
    "latency_and_extend",
]

FILL: LiteralString = """
WITH q AS (INSERT INTO agentlease_queues (name) VALUES (%(queue)s) ON CONFLICT DO NOTHING)
INSERT INTO agentlease_tasks (id, queue, state, priority, seq, payload, max_reclaims,
                              created_at, run_at)
SELECT gen_random_uuid()::text, %(queue)s, 'queued', 0, nextval('agentlease_seq'),
       ('{"n":' || i || '}')::json, 5, clock_timestamp(), clock_timestamp()
FROM generate_series(1, %(count)s) AS i
"""
RAW_CLAIM: LiteralString = """
WITH picked AS MATERIALIZED (
    SELECT id FROM agentlease_tasks
    WHERE queue = %(queue)s AND state = 'queued'
    ORDER BY priority DESC, seq
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
)
UPDATE agentlease_tasks t
SET state = 'leased', token = md5(random()::text), attempt = t.attempt + 1,
    leased_at = clock_timestamp(), expires_at = clock_timestamp() + interval '30 seconds'
FROM picked
WHERE t.id = picked.id
RETURNING t.id, t.token, t.attempt, t.payload
"""
RAW_COMPLETE: LiteralString = """
UPDATE agentlease_tasks
SET state = 'done', finished_at = clock_timestamp(), token = NULL, expires_at = NULL
WHERE id = %(id)s AND token = %(token)s AND state = 'leased' AND expires_at > clock_timestamp()
"""


RAW_COMPLETE_MANY: LiteralString = """
UPDATE agentlease_tasks AS t
SET state = 'done', finished_at = clock_timestamp(), token = NULL, expires_at = NULL
FROM unnest(%(ids)s::text[], %(tokens)s::text[]) AS d(id, token)
WHERE t.id = d.id AND t.token = d.token AND t.state = 'leased'
  AND t.expires_at > clock_timestamp()
"""

RAW_KEY_INSERT: LiteralString = """
INSERT INTO agentlease_keys (key, state, fingerprint, fence, holder, created_at, purge_at)
VALUES (%(key)s, 'done', '', 1, '', clock_timestamp(), clock_timestamp() + interval '1 day')
ON CONFLICT DO NOTHING
"""

RAW_RECORDS: LiteralString = """
CREATE TABLE bench_records (key text PRIMARY KEY, version bigint NOT NULL, value bytea NOT NULL)
"""
RAW_CREATE: LiteralString = """
INSERT INTO bench_records (key, version, value) SELECT k, 1, '{}' FROM unnest(%(keys)s::text[]) k
"""
RAW_CAS: LiteralString = """
UPDATE bench_records SET version = version + 1, value = %(value)s
WHERE key = %(key)s AND version = %(version)s
"""
RAW_ACQUIRE: LiteralString = """
INSERT INTO agentlease_locks AS l (name, owner, expires_at, fence)
VALUES (%(name)s, %(owner)s, clock_timestamp() + make_interval(secs => %(ttl)s), 1)
ON CONFLICT (name) DO UPDATE
SET owner = excluded.owner, expires_at = excluded.expires_at, fence = l.fence + 1
WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
RETURNING l.fence
"""
RAW_RELEASE: LiteralString = """
UPDATE agentlease_locks SET owner = NULL, expires_at = NULL
WHERE name = %(name)s AND owner = %(owner)s AND expires_at > clock_timestamp()
"""


def _connect(settings: PostgresSettings) -> psycopg.Connection[Any]:
    return psycopg.connect(settings.conninfo, **settings.connect_kwargs())


def _fresh_schema(settings: PostgresSettings, prefix: str) -> PostgresSettings:
    """A new schema on the same server with the library's tables in it."""
    fresh = settings.with_schema(f"{prefix}_{uuid.uuid4().hex[:10]}")
    migrate(fresh, apply=True)
    return fresh


def _drop(settings: PostgresSettings) -> None:
    with _connect(settings) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(settings.schema))
        )


def fill(settings: PostgresSettings, queue: str, count: int) -> None:
    """Insert ``count`` small queued tasks in one statement (generate_series: fast, untimed)."""
    with _connect(settings) as conn:
        conn.execute(FILL, {"queue": queue, "count": count})


class RawPostgres:
    """The raw baseline: one claim statement and one complete statement per task, via psycopg.

    Use :meth:`create` for the owner (it makes the schema and drops it on :meth:`close`) and
    :meth:`open` in other processes.
    """

    def __init__(self, settings: PostgresSettings, *, owner: bool) -> None:
        self.settings = settings
        self.owner = owner
        self.conn = _connect(settings)

    @classmethod
    def create(cls, url: str) -> RawPostgres:
        """A fresh raw schema next to ``url``'s, with a table of the library's shape."""
        return cls(_fresh_schema(parse(url), "agentlease_raw"), owner=True)

    @classmethod
    def open(cls, url: str) -> RawPostgres:
        """Another connection to an existing raw schema (``url`` names it)."""
        return cls(parse(url), owner=False)

    @property
    def url(self) -> str:
        """The URL that names this raw schema."""
        return self.settings.url

    def fill(self, queue: str, count: int) -> None:
        fill(self.settings, queue, count)

    def drain(self, queue: str, batch: int, mode: Mode) -> int:
        conn = self.conn
        done = 0
        while rows := conn.execute(RAW_CLAIM, {"queue": queue, "n": batch}).fetchall():
            done += len(rows)
            if mode == "claim_only":
                continue
            if batch == 1:
                task_id, token, _attempt, _payload = rows[0]
                cur = conn.execute(RAW_COMPLETE, {"id": task_id, "token": token})
            else:  # the same fenced update for the whole batch, in one statement
                ids = [r[0] for r in rows]
                cur = conn.execute(RAW_COMPLETE_MANY, {"ids": ids, "tokens": [r[1] for r in rows]})
            if cur.rowcount != len(rows):
                raise RuntimeError("a raw complete was refused")
        return done

    def close(self) -> None:
        self.conn.close()
        if self.owner:
            _drop(self.settings)


class PostgresTarget(Target):
    """How a spawned bench process opens its side: the library on the URL, or the raw schema."""

    __slots__ = ()

    def open(self) -> Driver:
        if self.kind == "library":
            return Library(connect(self.url))
        return RawPostgres.open(self.url)


class PostgresStores(Stores):
    """The bench's two stores on PostgreSQL: the ``--backend`` URL and a fresh raw schema."""

    def _raw(self, url: str, scratch: Path) -> Driver:
        if self.kind not in ("postgresql", "postgres"):
            raise InvalidURL(f"not a PostgreSQL URL: {redact_url(url)!r}")
        raw = RawPostgres.create(url)
        self.targets = (PostgresTarget("library", url), PostgresTarget("raw", raw.url))
        return raw


def compare(url: str, tasks: int, processes: int = 4, batch: int = 50) -> list[Row]:
    """Run the bench rows on a fresh library schema next to ``url``'s (both dropped after)."""
    library = _fresh_schema(parse(url), "agentlease_bench")
    try:
        stores = PostgresStores(library.url, Path("."))
        try:
            return run_bench(stores, cases(processes, batch, "postgresql"), tasks)
        finally:
            stores.close()
    finally:
        _drop(library)


def _raw_pool(url: str) -> tuple[PostgresSettings, ConnectionPool[psycopg.Connection[Any]]]:
    """A fresh raw schema next to ``url``'s with the library's tables, and an open pool of one
    autocommit connection to it."""
    settings = _fresh_schema(parse(url), "agentlease_raw")
    pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
        settings.conninfo,
        kwargs=settings.connect_kwargs(),
        min_size=1,
        max_size=1,
        open=False,
        name="agentlease-bench-raw",
    )
    try:
        pool.open(wait=True)
    except BaseException:
        _drop(settings)
        raise
    return settings, pool


class RawPostgresKeys:
    """The baseline of the idempotency rows: one ``INSERT ... ON CONFLICT DO NOTHING`` per key
    into ``agentlease_keys`` of a fresh schema (the library's migrations, dropped on close), on
    an autocommit connection taken from a psycopg pool for each call, as the library does."""

    operation = "INSERT ... ON CONFLICT DO NOTHING"

    def __init__(self, url: str) -> None:
        self.settings, self.pool = _raw_pool(url)

    def put(self, keys: Sequence[str]) -> int:
        pool = self.pool
        new = 0
        for key in keys:
            conn = pool.getconn()
            try:
                new += conn.execute(RAW_KEY_INSERT, {"key": key}).rowcount
            finally:
                pool.putconn(conn)
        return new

    def close(self) -> None:
        try:
            self.pool.close()
        finally:
            _drop(self.settings)


def compare_keys(url: str, calls: int) -> list[KeyRow]:
    """The idempotency rows: ``@idempotent`` around a no-op on a fresh library schema next to
    ``url``'s, beside the raw insert in another fresh schema (both dropped afterwards)."""
    library_settings = _fresh_schema(parse(url), "agentlease_bench")
    try:
        library = LibraryKeys(connect(library_settings.url))
        try:
            raw = RawPostgresKeys(url)
            try:
                return run_keys("postgresql", library, raw, calls)
            finally:
                raw.close()
        finally:
            library.close()
    finally:
        _drop(library_settings)


class RawPostgresGuards:
    """The raw side of the guard rows, in a fresh schema with the library's tables (dropped on
    close), each statement on an autocommit connection taken from a psycopg pool, as the
    library does: ``UPDATE ... WHERE key = $1 AND version = $2`` on a table of (key, version,
    value); for a lock, a conditional upsert into ``agentlease_locks`` (owner, expiry, fence + 1
    where the lock is free), then an ``UPDATE`` that frees it where the owner matches."""

    cas_operation = "UPDATE ... WHERE key = $1 AND version = $2"
    lock_operation = "INSERT ... ON CONFLICT DO UPDATE WHERE free, UPDATE ... WHERE owner = $2"

    def __init__(self, url: str) -> None:
        self.settings, self.pool = _raw_pool(url)
        with self.pool.connection() as conn:
            conn.execute(RAW_RECORDS)

    def create(self, keys: Sequence[str]) -> None:
        with self.pool.connection() as conn:
            conn.execute(RAW_CREATE, {"keys": list(keys)})

    def compare_and_set(self, keys: Sequence[str], values: Sequence[bytes]) -> int:
        pool = self.pool
        written = 0
        for key, value in zip(keys, values, strict=True):
            conn = pool.getconn()
            try:
                params = {"key": key, "version": 1, "value": value}
                written += conn.execute(RAW_CAS, params).rowcount
            finally:
                pool.putconn(conn)
        return written

    def lock_cycles(self, name: str, owner: str, count: int) -> int:
        pool, params = self.pool, {"name": name, "owner": owner, "ttl": LOCK_TTL}
        acquired = 0
        for _ in range(count):
            conn = pool.getconn()
            try:
                acquired += conn.execute(RAW_ACQUIRE, params).rowcount
            finally:
                pool.putconn(conn)
            conn = pool.getconn()
            try:
                conn.execute(RAW_RELEASE, params)
            finally:
                pool.putconn(conn)
        return acquired

    def close(self) -> None:
        try:
            self.pool.close()
        finally:
            _drop(self.settings)


def compare_guards(url: str, calls: int) -> list[GuardRow]:
    """The guard rows: :class:`~agentlease.SharedState` on a fresh library schema next to
    ``url``'s, beside the raw statements in another fresh schema (both dropped afterwards)."""
    library_settings = _fresh_schema(parse(url), "agentlease_bench")
    try:
        library = LibraryGuards(connect(library_settings.url))
        try:
            raw = RawPostgresGuards(url)
            try:
                return run_guards("postgresql", library, raw, calls)
            finally:
                raw.close()
        finally:
            library.close()
    finally:
        _drop(library_settings)


def _claim_latencies(q: Queue, queues: tuple[str, str], samples: int) -> list[list[float]]:
    """Time ``samples`` claims of one task from each queue, alternating between them, so that
    whatever else the machine does (autovacuum, checkpoints) lands on both alike."""
    out: list[list[float]] = [[] for _ in queues]
    for i in range(20 + samples):  # the first 20 warm up prepared statements and caches
        for k, queue in enumerate(queues):
            started = time.perf_counter()
            (job,) = q.claim(queue)
            elapsed = time.perf_counter() - started
            q.complete(job.lease)
            if i >= 20:
                out[k].append(elapsed)
    return out


def _percentiles(values: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[98] * 1000


def _vacuum(settings: PostgresSettings) -> None:
    with _connect(settings) as conn:
        conn.execute("VACUUM ANALYZE agentlease_tasks")


def latency_and_extend(
    url: str,
    *,
    shallow: int = 1_000,
    deep: int = 1_000_000,
    samples: int = 1_000,
    leases: int = 10_000,
) -> dict[str, float]:
    """Claim latency at two queue depths, and one extend of many leases, through the library.

    On a fresh schema next to ``url``'s (dropped afterwards), one table holds a queue of
    ``shallow`` tasks and one of ``deep`` tasks (each filled by one ``generate_series``
    statement, topped up by ``samples`` so the depths hold); ``samples`` claims of one task are
    timed on each, alternating (each completed, untimed). Then ``leases`` tasks are claimed and
    one ``extend`` of all of them is timed (median of 5).

    Returns:
        Milliseconds: ``p50_shallow``, ``p99_shallow``, ``p50_deep``, ``p99_deep``, the ratios
        ``p50_ratio`` and ``p99_ratio`` (deep over shallow), and ``extend_ms``.
    """
    settings = _fresh_schema(parse(url), "agentlease_latency")
    q = Queue(connect(settings.url))
    try:
        fill(settings, "shallow", shallow + samples + 20)
        fill(settings, "deep", deep + samples + 20)
        _vacuum(settings)
        timings = _claim_latencies(q, ("shallow", "deep"), samples)
        p50_shallow, p99_shallow = _percentiles(timings[0])
        p50_deep, p99_deep = _percentiles(timings[1])
        fill(settings, "leases", leases)
        held = [job.lease for job in q.claim("leases", leases)]
        assert len(held) == leases
        times = []
        for _ in range(5):
            started = time.perf_counter()
            renewed = q.extend(held)
            times.append(time.perf_counter() - started)
            assert all(lease is not None for lease in renewed)
    finally:
        q.close()
        _drop(settings)
    return {
        "queued_shallow": shallow,
        "queued_deep": deep,
        "p50_shallow": p50_shallow,
        "p99_shallow": p99_shallow,
        "p50_deep": p50_deep,
        "p99_deep": p99_deep,
        "p50_ratio": p50_deep / p50_shallow,
        "p99_ratio": p99_deep / p99_shallow,
        "extend_leases": leases,
        "extend_ms": statistics.median(times) * 1000,
    }


def main(argv: list[str]) -> int:
    """``python -m agentlease.bench.postgres_rows URL [--tasks N] [--latency]``."""
    if not argv:
        print(__doc__)
        return 2
    url = argv[0]
    tasks = int(argv[argv.index("--tasks") + 1]) if "--tasks" in argv else 30_000
    from agentlease.bench.command import _table
    from agentlease.cli._app import console

    rows = compare(url, tasks)
    console.print(_table(rows, redact_url(url)))
    for row in rows:
        print(row.as_json())
    for key_row in compare_keys(url, DEFAULT_CALLS):
        print(key_row.as_json())
    for guard_row in compare_guards(url, DEFAULT_GUARDS):
        print(guard_row.as_json())
    if "--latency" in argv:
        print(latency_and_extend(url))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
