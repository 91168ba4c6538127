# Generated from agentlease/backends/_async/postgres_backend.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""The PostgreSQL backend: many machines, one table, transactional with the user's own data.

Atomicity: every primitive is ONE SQL statement (named in ``sql/postgres.sql``) on a pooled
connection in autocommit mode, so each is its own transaction and one round trip:

* ``claim`` calls ``agentlease_claim_holder()`` (``sql/postgres_migrations``), which in one
  transaction promotes due tasks, reaps expired leases, picks up to ``n`` ready tasks (``FOR
  UPDATE SKIP LOCKED`` + ``LIMIT``) and leases them with one ``UPDATE ... RETURNING``; each step
  sees the one before, so the task a claim reaps goes to the front and this same claim may lease
  it. The jobs come back with their rank in pick order and are put in that order here (sorting
  them in the server copied every row, payload and all).
* every holder write (complete, fail, release, progress, extend) compares the token (which
  exists only while the task is leased) and ``expires_at > clock_timestamp()`` in its single
  ``UPDATE``; when no row matched, a second read says why, for
  :class:`~agentlease.errors.LeaseLost`. ``extend`` renews many leases in one call of
  ``agentlease_extend()`` (two arrays: ids and tokens), one transaction at one clock reading.
* ``enqueue`` inserts the whole batch in one statement (all or nothing); writes that make work
  ready send ``pg_notify`` in that same statement, delivered only if it commits.
* partitions (migration ``0004_partitions``, whose comments give the reasoning): a batch with
  partitions is one call of ``agentlease_enqueue_context()``, which, like ``requeue_dead``,
  parks a task of a busy partition; a trigger starts the next one inside the statement that
  makes a task done or dead. Whoever decides whether a partition is busy takes its advisory
  lock first.
* cancellation (migration ``0009_cancel``): ``cancel`` is one call of ``agentlease_cancel()``; a
  live lease gets ``cancel_reason``, which every holder write requires to be NULL, and
  ``agentlease_extend`` (the holder's next heartbeat) or ``agentlease_reap`` ends it cancelled;
  ``delete_queue`` is one call of ``agentlease_delete_queue()`` per bounded batch.
* task contexts (migration ``0008_task_context``): a ``context`` JSON column written by enqueue
  only, returned by claim (in each job), get, dead and fail.
* retention: ``purge_tasks`` is one ``DELETE`` of the oldest done (or dead) tasks of a queue
  through the partial indexes ``agentlease_tasks_done`` and ``agentlease_tasks_dead`` on
  ``(queue, finished_at)``, which exist since the first migration: tasks finished before
  purging existed are indexed like any other, and no migration was needed.
* lease holders, attempt histories and live workers (migration ``0011_workers``): the claim
  writes its holder into each leased row; a trigger records an attempt that ends otherwise than
  done (fail, release, a reap, a cancel) inside the statement that ends it, in
  ``agentlease_attempts`` (the last 20 per task; ``get`` reads them with the task's row, which
  gives the running attempt and a done task's last one). A worker's
  entry is one row of ``agentlease_workers``, written (with a sweep of lapsed rows) by one
  statement.
* idempotency keys (migration ``0002_keys``) are one function call or statement each, in
  :mod:`.postgres_keys`; results and errors are ``bytea``, kept as the client's bytes.
* versioned records, bounded counters and lock sets (migration ``0003_state``) are one function
  call or statement each, in :mod:`.postgres_state`.
* plans (migration ``0012_plans``): acting on one is one call of ``agentlease_act_plan()``, in
  :mod:`.postgres_state`; counters carry a version.

Concurrent claims never wait on each other (SKIP LOCKED); a holder's write and a reaper meet on
the row lock, and the loser re-checks the row and finds it has moved on. All times come from
``clock_timestamp()``: the client's clock never decides a lease.

Connections: a psycopg pool per backend object (``pool_min``/``pool_max``), every connection with
``search_path`` set to the URL's schema; a connection the server closed while it sat idle (a
restart) is dropped before use. A backend migrates (or checks) its schema on first use.

Durability: an acknowledged claim, and so its attempt number, survives a server crash only if
its commit was flushed: keep ``synchronous_commit`` on (PostgreSQL's default). With it off, a
crash can forget acknowledged claims and hand the same attempt number out twice.

Written once for asyncio; ``backends/_sync/postgres_backend.py`` is generated from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, LiteralString

import psycopg
from psycopg import Connection
from psycopg_pool import ConnectionPool

from agentlease import _cursor
from agentlease._cursor import Key
from agentlease._policy.lease import lost_reason
from agentlease._records import (
    STATES,
    Cancellation,
    Enqueued,
    FinishedState,
    Job,
    Lease,
    LeaseInfo,
    LeaseTerms,
    ListedState,
    NewTask,
    QueueStats,
    Reaped,
    Task,
    WorkerInfo,
    reason_of,
    renewed_leases,
)
from agentlease.backends import _postgres_driver as pg
from agentlease.backends._postgres_driver import (
    AsyncFace,
    Q,
    async_face,
    channel,
    configure,
    stale,
    sync_face,
    task,
    translate,
)
from agentlease.backends._postgres_url import PostgresSettings
from agentlease.backends.base import Backend
from agentlease.errors import (
    BackendUnavailable,
    LeaseLost,
    QueueInUse,
    TaskCancelled,
    UnknownQueue,
    UnknownTask,
)

from .postgres_keys import PostgresKeys
from .postgres_listener import Listener
from .postgres_schema import migrate
from .postgres_state import PostgresState

__all__ = ["PostgresBackend"]

Row = tuple[Any, ...]


def _rank(ranked: tuple[int, Job]) -> int:
    return ranked[0]


def _configure(conn: Connection[Any]) -> None:
    configure(conn)


_LISTINGS: dict[tuple[str, bool], str] = {
    ("queued", False): "list_queued",
    ("queued", True): "list_queued_after",
    ("leased", False): "list_leased",
    ("leased", True): "list_leased_after",
    ("done", False): "list_done",
    ("done", True): "list_done_after",
    ("dead", False): "list_dead",
    ("dead", True): "list_dead_after",
    ("cancelled", False): "list_cancelled",
    ("cancelled", True): "list_cancelled_after",
}
"""The named query of each listing: (state, from a cursor)."""


class PostgresBackend(PostgresKeys, PostgresState):
    """Tasks in one PostgreSQL schema, shared by every process that opens the same URL.

    Args:
        settings: the parsed URL (see :mod:`agentlease.backends._postgres_url`).
        migrated: the schema is known to be up to date (a twin of an opened backend).
    """

    def __init__(self, settings: PostgresSettings, *, migrated: bool = False) -> None:
        self.url = settings.display  # never the password
        self.settings = settings
        self._migrated = migrated
        self._pool: ConnectionPool[Connection[Any]] | None = None
        self._lock = pg.sync_lock()
        self._closed = False
        self._listener = Listener(settings)

    # -- connections ----------------------------------------------------------------------------

    def open(self) -> None:
        """Migrate (or check) the schema and open the pool now instead of at the first call.

        Raises:
            BackendUnavailable: the server cannot be reached (transient).
            BackendRefused: permanent: the login was refused (:class:`AuthenticationFailed`),
                the schema lacks the tables and the URL says ``migrate=false``
                (:class:`SchemaNotMigrated`), or a newer agentlease migrated it
                (:class:`SchemaTooNew`).
        """
        self._ready()

    def _ready(self) -> ConnectionPool[Connection[Any]]:
        with self._lock:
            if self._pool is not None:
                return self._pool
            if self._closed:
                raise BackendUnavailable(f"PostgreSQL {self.settings.display}: backend closed")
            settings = self.settings
            if not self._migrated:
                migrate(settings, apply=settings.migrate)
                self._migrated = True
            pool: ConnectionPool[Connection[Any]] = ConnectionPool(
                settings.conninfo,
                kwargs=settings.connect_kwargs(),
                min_size=settings.pool_min,
                max_size=settings.pool_max,
                open=False,
                configure=_configure,
                timeout=settings.pool_timeout,
                name=f"agentlease:{settings.schema}",
                num_workers=2,
            )
            try:
                pool.open(wait=False)
            except psycopg.Error as exc:
                raise translate(settings, exc) from exc
            self._pool = pool
            return pool

    def _conn(self, pool: ConnectionPool[Connection[Any]]) -> Connection[Any]:
        conn = pool.getconn()
        while stale(conn):  # killed while idle (a server restart): replace it, don't fail
            conn.close()
            pool.putconn(conn)
            conn = pool.getconn()
        return conn

    def _fetch(
        self,
        query: LiteralString,
        params: Mapping[str, Any] | None = None,
    ) -> list[Row]:
        """Run one statement and return its rows; psycopg errors are translated here."""
        pool = self._pool or self._ready()
        try:
            conn = self._conn(pool)
            try:
                cur = conn.execute(query, params)
                return cur.fetchall()
            finally:
                pool.putconn(conn)
        except psycopg.Error as exc:
            raise translate(self.settings, exc) from exc

    def _write(self, query: LiteralString, params: Mapping[str, Any]) -> int:
        """Run one statement that returns no rows; how many rows it changed."""
        pool = self._pool or self._ready()
        try:
            conn = self._conn(pool)
            try:
                cur = conn.execute(query, params)
                return cur.rowcount
            finally:
                pool.putconn(conn)
        except psycopg.Error as exc:
            raise translate(self.settings, exc) from exc

    def _channel(self, queue: str) -> str:
        return channel(self.settings.schema, queue)

    def _lost(self, lease: Lease) -> LeaseLost | UnknownTask:
        rows = self._fetch(Q["fence_state"], {"id": lease.task_id})
        if not rows:
            return UnknownTask(lease.task_id)
        attempt, state, token, live, cancel_reason = rows[0]
        if cancel_reason is not None and state in ("leased", "cancelled"):
            return TaskCancelled(
                lease.task_id, cancel_reason, attempt=lease.attempt, current_attempt=attempt
            )
        reason = lost_reason(state, token == lease.token, bool(live))
        return LeaseLost(lease.task_id, lease.attempt, attempt, state, reason=reason)

    @staticmethod
    def _fence(lease: Lease) -> dict[str, Any]:
        return {"id": lease.task_id, "token": lease.token}

    # -- primitives -----------------------------------------------------------------------------

    def now(self) -> float:
        ((now,),) = self._fetch(Q["now"])
        return float(now)

    def enqueue(self, tasks: Sequence[NewTask]) -> list[Enqueued]:
        if not tasks:
            return []
        names = sorted({t.queue for t in tasks})
        batch = {
            "id": [t.id for t in tasks],
            "queue": [t.queue for t in tasks],
            "priority": [t.priority for t in tasks],
            "payload": [t.payload_json for t in tasks],
            "dedup_key": [t.dedup_key for t in tasks],
            "max_reclaims": [t.max_reclaims for t in tasks],
            "delay": [float(t.delay) for t in tasks],
            "partition": [t.partition for t in tasks],
            "context": [t.context_json for t in tasks],
            "queue_names": names,
            "channels": [self._channel(name) for name in names],
        }
        parted = any(t.partition is not None for t in tasks)
        query = Q["enqueue_partitioned" if parted else "enqueue"]
        ((ids, queues, keys, *_),) = self._fetch(query, batch)
        created = list(zip(ids, queues, keys, strict=True))
        if len(created) == len(tasks):
            return [Enqueued(spec.id, True) for spec in tasks]
        return self._resolve(tasks, created)

    def _resolve(
        self, tasks: Sequence[NewTask], created: list[tuple[str, str, str | None]]
    ) -> list[Enqueued]:
        """Name, for each spec in batch order, whether it was created or which task it met.

        As if the batch were enqueued one spec at a time: a spec that was skipped met a task
        that existed before the batch or was created by an earlier spec (same id first, then
        same dedup key in its queue). Created rows are told apart by (id, queue, dedup key),
        since a spec skipped for its dedup key may share its id with a later one that was not.
        """
        fresh = set(created)
        rows = self._fetch(
            Q["find_existing"],
            {
                "id": [spec.id for spec in tasks],
                "queue": [spec.queue for spec in tasks if spec.dedup_key is not None],
                "dedup_key": [spec.dedup_key for spec in tasks if spec.dedup_key is not None],
            },
        )
        made = {task_id for task_id, _, _ in created}
        by_id = {task_id for task_id, _, _ in rows if task_id not in made}
        by_key = {
            (q, k): task_id for task_id, q, k in rows if k is not None and task_id not in made
        }
        out: list[Enqueued] = []
        for spec in tasks:
            key = (spec.id, spec.queue, spec.dedup_key)
            if key in fresh:
                fresh.discard(key)
                out.append(Enqueued(spec.id, True))
                by_id.add(spec.id)
                if spec.dedup_key is not None:
                    by_key[(spec.queue, spec.dedup_key)] = spec.id
            elif spec.id in by_id:
                out.append(Enqueued(spec.id, False))
            else:
                found = by_key.get((spec.queue, spec.dedup_key or ""), spec.id)
                out.append(Enqueued(found, False))
        return out

    def claim(self, queue: str, n: int, terms: LeaseTerms) -> tuple[list[Job], list[Reaped]]:
        return _claimed(queue, self._fetch(Q["claim"], _claim_params(queue, n, terms)))

    def extend(self, leases: Sequence[Lease], lease_for: float) -> list[Lease | None]:
        if not leases:
            return []
        rows = self._fetch(
            Q["extend"],
            {
                "id": [lease.task_id for lease in leases],
                "token": [lease.token for lease in leases],
                "lease_for": lease_for,
            },
        )
        return renewed_leases(leases, rows)

    def complete(self, lease: Lease, result_json: bytes | None) -> None:
        params = self._fence(lease)
        params["result"] = result_json
        if self._write(Q["complete"], params) != 1:
            raise self._lost(lease)

    def complete_many(
        self, items: Sequence[tuple[Lease, bytes | None]]
    ) -> list[LeaseLost | UnknownTask | None]:
        if not items:
            return []
        # One statement: each row is fenced on its own (token, expiry) and updated or not.
        done = {(i, t) for i, t in self._fetch(Q["complete_many"], _completions(items))}
        return self._refusals(items, done)

    def complete_and_claim(
        self, items: Sequence[tuple[Lease, bytes | None]], queue: str, n: int, terms: LeaseTerms
    ) -> tuple[list[LeaseLost | UnknownTask | None], list[Job], list[Reaped]]:
        if not items:
            jobs, reaped = self.claim(queue, n, terms)
            return [], jobs, reaped
        # Both statements in one transaction: one commit (one WAL flush) instead of two. A
        # connection interrupted inside it (a timeout, a cancelled task) is closed, never
        # returned to the pool with a transaction or results pending.
        pool = self._pool or self._ready()
        try:
            conn = self._conn(pool)
            try:
                with conn.transaction():
                    cur = conn.execute(Q["complete_many"], _completions(items))
                    done = {(i, t) for i, t in cur.fetchall()}
                    cur = conn.execute(Q["claim"], _claim_params(queue, n, terms))
                    rows = cur.fetchall()
            except BaseException:
                conn.close()
                raise
            finally:
                pool.putconn(conn)
        except psycopg.Error as exc:
            raise translate(self.settings, exc) from exc
        jobs, reaped = _claimed(queue, rows)
        return self._refusals(items, done), jobs, reaped

    def _refusals(
        self, items: Sequence[tuple[Lease, bytes | None]], done: set[tuple[str, str]]
    ) -> list[LeaseLost | UnknownTask | None]:
        out: list[LeaseLost | UnknownTask | None] = []
        for lease, _ in items:
            accepted = (lease.task_id, lease.token) in done
            out.append(None if accepted else self._lost(lease))
        return out

    def fail(self, lease: Lease, error_json: bytes, retry_in: float | None) -> Task:
        params = self._fence(lease)
        params["error"] = error_json
        if retry_in is None:
            rows = self._fetch(Q["fail_dead"], params)
        else:
            params["retry_in"] = float(retry_in)
            params["channel"] = self._channel(lease.queue)
            rows = self._fetch(Q["fail_retry"], params)
        if not rows:
            raise self._lost(lease)
        return task(rows[0][:21])  # fail_retry's 22nd column is its notification

    def release(self, lease: Lease, front: bool) -> None:
        params = self._fence(lease)
        params["front"] = front
        params["channel"] = self._channel(lease.queue)
        ((released,),) = self._fetch(Q["release"], params)
        if released != 1:
            raise self._lost(lease)

    def progress(
        self, lease: Lease, progress_json: bytes | None, checkpoint_json: bytes | None
    ) -> None:
        params = self._fence(lease)
        params["progress"] = progress_json
        params["checkpoint"] = checkpoint_json
        if self._write(Q["progress"], params) != 1:
            raise self._lost(lease)

    def reap(self, queue: str, front: bool) -> list[Reaped]:
        rows = self._fetch(Q["reap"], {"queue": queue, "front": front})
        return [Reaped(task_id, queue, attempt, outcome) for task_id, attempt, outcome in rows]

    def get(self, task_id: str) -> Task:
        rows = self._fetch(Q["get"], {"id": task_id})
        if not rows:
            raise UnknownTask(task_id)
        return task(rows[0])

    def stats(self, queue: str) -> QueueStats:
        rows = self._fetch(Q["stats"], {"queue": queue})
        ((exists, now, *numbers, oldest, hot_names, hot_counts),) = rows
        if not exists:
            raise UnknownQueue(queue)
        counts: dict[str, int] = {s: n for s, n in zip(STATES, numbers, strict=True) if n}
        hot = tuple(zip(hot_names, hot_counts, strict=True))
        return QueueStats(queue, counts, oldest, now, hot)

    def queues(self) -> list[str]:
        return [name for (name,) in self._fetch(Q["queues"])]

    def cancel(self, task_id: str, reason: str, error_json: bytes) -> Cancellation:
        params = {"id": task_id, "reason": reason, "error": error_json}
        rows = self._fetch(Q["cancel"], params)
        if not rows:
            raise UnknownTask(task_id)
        ((outcome, state, error),) = rows
        return Cancellation(task_id, outcome, state, reason_of(error))

    def delete_queue(self, queue: str, limit: int, force: bool) -> tuple[int, bool]:
        params = {"queue": queue, "limit": limit, "force": force}
        ((deleted, gone, leased),) = self._fetch(Q["delete_queue"], params)
        if leased:
            raise QueueInUse(queue, leased)
        return deleted, gone

    def inspect(self, queue: str, limit: int) -> list[LeaseInfo]:
        rows = self._fetch(Q["inspect"], {"queue": queue, "limit": limit})
        if not rows:
            raise UnknownQueue(queue)
        return [
            LeaseInfo(task_id, attempt, now - leased_at, expires_at - now, reclaims, failures, who)
            for now, task_id, attempt, leased_at, expires_at, reclaims, failures, who in rows
            if task_id is not None
        ]

    def dead(self, queue: str, limit: int) -> list[Task]:
        rows = self._fetch(Q["dead"], {"queue": queue, "limit": limit})
        if not rows:
            raise UnknownQueue(queue)
        return [task(row) for row in rows if row[0] is not None]

    def requeue_dead(self, queue: str, task_ids: Sequence[str] | None, front: bool) -> int:
        params = {
            "queue": queue,
            "all": task_ids is None,
            "ids": [] if task_ids is None else list(task_ids),
            "front": front,
            "channel": self._channel(queue),
        }
        ((exists, requeued),) = self._fetch(Q["requeue_dead"], params)
        if not exists:
            raise UnknownQueue(queue)
        return int(requeued)

    def purge_tasks(
        self,
        queue: str,
        state: FinishedState,
        older_than: float,
        limit: int,
    ) -> int:
        query = Q[f"purge_{state}"]
        return self._write(query, {"queue": queue, "older_than": older_than, "limit": limit})

    def list_tasks(
        self,
        queue: str,
        state: ListedState,
        limit: int,
        after: Key | None,
    ) -> tuple[list[Task], Key | None]:
        params: dict[str, Any] = {"queue": queue, "limit": limit + 1}
        if state == "queued":
            start = _cursor.key(after, int, int, str)
            if start is not None:
                params.update(p=start[0], s=start[1])
        else:
            start = _cursor.key(after, int, str)  # the index's time in microseconds, the id
            if start is not None:
                params.update(us=start[0], id=start[1])
        rows = self._fetch(Q[_LISTINGS[state, start is not None]], params)
        page = [task((*r[:21], r[23])) for r in rows[:limit]]  # and its cancel reason
        if len(rows) <= limit:
            return page, None
        last = rows[limit - 1]
        key: Key = [last[3], last[21], last[0]] if state == "queued" else [last[22], last[0]]
        return page, key

    def register_worker(self, worker_id: str, info_json: bytes, ttl: float) -> float:
        params = {"id": worker_id, "info": info_json, "ttl": ttl}
        ((expires_at,),) = self._fetch(Q["worker_register"], params)
        return float(expires_at)

    def workers(self) -> list[WorkerInfo]:
        rows = self._fetch(Q["workers"])
        return [WorkerInfo(w, bytes(info), beat, until) for w, info, beat, until in rows]

    def unregister_worker(self, worker_id: str) -> bool:
        return self._write(Q["worker_unregister"], {"id": worker_id}) == 1

    def wait_for_work(self, queue: str, timeout: float) -> None:
        """Return when ``queue`` is notified (LISTEN/NOTIFY) or after ``timeout`` seconds."""
        self._listener.wait(queue, timeout)

    def close(self) -> None:
        """Close the pool and the listening connection; later calls raise BackendUnavailable."""
        self._closed = True
        self._listener.close()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            try:
                pool.close()
            except psycopg.Error as exc:
                raise translate(self.settings, exc) from exc

    # -- twins ----------------------------------------------------------------------------------

    def open_sync(self, *, call_timeout: float | None = None) -> Backend:
        """A synchronous backend on the same database, with its own pool (opened on first use);
        each statement on it is bounded by ``call_timeout``."""
        return sync_face(self.settings.bounded(call_timeout), migrated=self._migrated)

    def open_async(self) -> AsyncFace:
        """An asyncio backend on the same database, with its own pool (opened on first use)."""
        return async_face(self.settings, migrated=self._migrated)


def _completions(items: Sequence[tuple[Lease, bytes | None]]) -> dict[str, Any]:
    """The parameters of the complete_many statement."""
    return {
        "ids": [lease.task_id for lease, _ in items],
        "tokens": [lease.token for lease, _ in items],
        "results": [None if r is None else r.decode() for _, r in items],
    }


def _claim_params(queue: str, n: int, terms: LeaseTerms) -> dict[str, Any]:
    """The parameters of the claim statement."""
    return {
        "queue": queue,
        "n": n,
        "lease_for": terms.lease_for,
        "max_total": terms.max_total,
        "progress_timeout": terms.progress_timeout,
        "front": terms.reap_front,
        "holder": terms.holder,
    }


def _claimed(queue: str, rows: Sequence[Any]) -> tuple[list[Job], list[Reaped]]:
    """The jobs and reaped tasks of the claim statement's rows."""
    ranked: list[tuple[int, Job]] = []
    reaped: list[Reaped] = []
    for task_id, outcome, token, attempt, payload, checkpoint, *rest in rows:
        if outcome is None:
            priority, failures, reclaims, leased_at, expires_at, rank, context, run_at = rest
            lease = Lease(task_id, queue, token, attempt, leased_at, expires_at)
            job = Job(lease, payload, checkpoint, priority, failures, reclaims, context, run_at)
            ranked.append((rank, job))
        else:
            reaped.append(Reaped(task_id, queue, attempt, outcome))
    ranked.sort(key=_rank)  # the rows come in no order; the jobs go in pick order
    return [job for _, job in ranked], reaped
