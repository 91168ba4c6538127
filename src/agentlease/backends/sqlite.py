"""The SQLite backend: the embedded default for one machine and many processes, no server.

The database runs in WAL mode. Every primitive is one atomic step: a single statement in
autocommit mode (complete, fail, release, progress, extend) or one ``BEGIN IMMEDIATE``
transaction (enqueue, claim, reap, requeue), which takes the write lock before reading so no two
processes can pick the same task. The clock is this machine's, read inside that step; every
process on the machine shares it. SQL lives in ``sql/sqlite.sql``.

Idempotency keys (``_sqlite_keys.py``) and the shared-state guards (``_sqlite_state.py``) are
bases of the backend class, on the same connection and the same kind of atomic step.

Partitions (schema version 4): ``enqueue`` and ``requeue_dead`` park a task whose partition is
busy, checked per row inside their one transaction (so an earlier task of the same call counts);
the trigger ``agentlease_unpark`` starts a partition's next task inside whichever statement
finishes its last busy task (complete, fail, a reap past max_reclaims), so that step stays one.

Attempt history (schema version 10): the claim writes its holder into the task's row (for
``inspect`` and the history); the trigger ``agentlease_attempt_close`` records an attempt that
ends otherwise than done (table ``agentlease_attempts``, the last 20) inside the statement that
ends it, whatever the path. The running attempt and a done task's last one are read from the
task's row, so a claim and a completion write nothing more. Live workers are rows of
``agentlease_workers``.

Cancellation (schema version 8): ``cancel`` ends a waiting task at once; on a live lease it
sets ``cancel_reason``, which every holder write's statement requires to be NULL, so the
holder's writes are refused (:class:`~agentlease.errors.TaskCancelled`) and change nothing. The
holder's next ``extend`` ends the task cancelled (a second, conditional statement after the
renewal, matched on the lease's token), and so does the reaper if the holder is gone.
``delete_queue`` deletes a bounded batch of a queue's tasks per ``BEGIN IMMEDIATE``.

Versions: ``PRAGMA user_version`` is the schema's version (:data:`SCHEMA_VERSION`). An older
database is upgraded when opened; a newer one (written by a newer agentlease) is refused with
:class:`~agentlease.errors.SchemaTooNew` before anything is written to it.

Durability: with ``synchronous=NORMAL`` (the default here) a committed write survives the crash
of any process; a power loss may lose the last transactions. ``?synchronous=FULL`` keeps those too.
"""

from __future__ import annotations

import random
import re
import sqlite3
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import orjson

from agentlease import _cursor
from agentlease._cursor import Key
from agentlease._policy.lease import (
    FRONT_OFFSET,
    front_seq,
    lease_expiry,
    lost_reason,
    reap_outcome,
)
from agentlease._records import (
    FINISHED,
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
    renewed_leases,
    task_from_row,
)
from agentlease.backends._sqlfile import queries
from agentlease.backends._sqlite_keys import SQLiteKeys
from agentlease.backends._sqlite_state import SQLiteState
from agentlease.backends._threaded import ThreadedAsyncBackend
from agentlease.backends.base import AsyncBackend
from agentlease.errors import (
    BackendError,
    BackendUnavailable,
    LeaseLost,
    QueueInUse,
    SchemaTooNew,
    TaskCancelled,
    UnknownQueue,
    UnknownTask,
)

__all__ = ["SQLiteBackend"]

Q = queries("agentlease.backends.sql", "sqlite.sql")
# 1: tasks and queues; 2: idempotency keys; 3: records, counters and locks; 4: partitions; 5:
# counter holds; 6: retry budgets and circuit breakers; 7: a task's context (its root task and
# deadline); 8: cancellation (a task's cancel reason; the unpark trigger fires on cancelled).
# The schema is all "IF NOT EXISTS", so a database at an older version is brought up
# to date by running it again, after the upgrade_to_<version> steps that change tables it already
# has (versions 5 and 6 only add tables: they need none; version 7 adds a column, NULL for the
# tasks already there; version 8 adds one and drops the trigger, which the schema recreates).
# 10: the holder of each lease (a column), the attempt history and live workers (tables), and the
# triggers that write the history. Version 9 adds the index of done tasks by finished time,
# which the schema creates over the rows already there (it needs no step of its own), and
# indexes of budgets and breakers by expiry; listings read the partial indexes of their state.
# 11: plans: each counter's version (a column, 0 for the counters already there), the receipts of
# plans acted on and the store's plan secret (tables).
SCHEMA_VERSION = 11


_ADD_COLUMN = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (\w+)")


def _translate(path: str, exc: sqlite3.Error) -> BackendError:
    """The one place where sqlite3 errors become agentlease errors (keep the original as cause)."""
    if isinstance(exc, sqlite3.OperationalError):
        return BackendUnavailable(f"SQLite database {path!r}: {exc}")
    return BackendError(f"SQLite database {path!r}: {exc}")


_SPINS = 30  # tries of BEGIN IMMEDIATE with short sleeps before SQLite's own busy handler


def _begin_immediate(db: sqlite3.Connection, timeout: float) -> None:
    """``BEGIN IMMEDIATE``, waiting for the write lock in short jittered sleeps (50 us, doubling
    up to 2 ms) for about the first 40 ms, then with SQLite's busy handler up to ``timeout``.

    SQLite's busy handler sleeps 1, 2, 5, 10 ... ms between tries: when several worker processes
    take the write lock for a few hundred microseconds each, thousands of times a second, those
    sleeps leave the lock free most of the time.
    """
    db.execute("PRAGMA busy_timeout = 0")
    try:
        delay = 0.00005
        for _ in range(_SPINS):
            try:
                db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                    raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.002)
    finally:
        db.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    db.execute("BEGIN IMMEDIATE")


class _Step:
    """One primitive: the connection's lock, error translation and, for writes, one
    ``BEGIN IMMEDIATE`` transaction committed on success and rolled back on any error.

    A class rather than a generator-based context manager: it sits on every hot path.
    """

    __slots__ = ("_backend", "_write")

    def __init__(self, backend: SQLiteBackend, write: bool) -> None:
        self._backend = backend
        self._write = write

    def __enter__(self) -> sqlite3.Connection:
        backend = self._backend
        backend._lock.acquire()
        if self._write:
            try:
                _begin_immediate(backend._db, backend._timeout)
            except sqlite3.Error as exc:
                backend._lock.release()
                raise _translate(backend.path, exc) from exc
            except BaseException:
                backend._lock.release()
                raise
        return backend._db

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        backend = self._backend
        try:
            if self._write:
                backend._db.execute("COMMIT" if exc is None else "ROLLBACK")
        except sqlite3.Error as error:
            if exc is None:
                raise _translate(backend.path, error) from error
        finally:
            backend._lock.release()
        if isinstance(exc, sqlite3.Error):
            raise _translate(backend.path, exc) from exc


class SQLiteBackend(SQLiteKeys, SQLiteState):
    """Tasks in one SQLite database file, shared by every process on the machine.

    Args:
        path: the database file (created with its schema if missing).
        timeout: seconds to wait for the write lock before failing with BackendUnavailable.
        synchronous: SQLite's ``synchronous`` setting: ``NORMAL`` or ``FULL``.
        url: how the backend is named in messages.
    """

    def __init__(
        self,
        path: str,
        *,
        timeout: float = 30.0,
        synchronous: str = "NORMAL",
        url: str | None = None,
    ) -> None:
        self.path = path
        self.url = url or f"sqlite:///{path}"
        self._timeout = timeout
        self._synchronous = synchronous
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(
                path,
                timeout=timeout,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=64,
            )
            self._refuse_newer(self._version())  # first: a refused client changes nothing
            self._wal()
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._migrate()
        except sqlite3.Error as exc:
            raise _translate(path, exc) from exc
        except SchemaTooNew:
            self._db.close()
            raise

    def _wal(self) -> None:
        """Switch the file to WAL. Switching needs the file to itself, and SQLite answers
        "locked" at once, without its busy timeout, while another process opening the same new
        file holds it: so many processes starting together retry, up to the timeout."""
        give_up = time.monotonic() + self._timeout
        pause = 0.005
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= give_up:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.1)

    def _version(self) -> int:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        return int(version)

    def _refuse_newer(self, version: int) -> None:
        """A database a newer agentlease wrote (a higher ``user_version``) is refused and left
        as it was: this version would misread or damage its tables."""
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(f"SQLite database {self.path!r}", "schema", version, SCHEMA_VERSION)

    def _migrate(self) -> None:
        db = self._db
        if self._version() == SCHEMA_VERSION:
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            version = self._version()
            self._refuse_newer(version)  # a newer agentlease may have migrated it meanwhile
            if version < SCHEMA_VERSION:
                # Version 0 is a new file: the schema creates everything. An older database
                # first gets the changes to the tables it has, one version after another.
                steps = range(version + 1, SCHEMA_VERSION + 1) if version else ()
                for script in [Q[f"upgrade_to_{v}"] for v in steps if f"upgrade_to_{v}" in Q]:
                    for statement in script.split(";"):
                        if statement.strip() and not self._has_column(statement):
                            db.execute(statement)
                for statement in Q["schema"].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(Q["unpark_trigger"])
                db.execute(Q["attempt_close_trigger"])
                db.execute(Q["attempt_forget_trigger"])
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _has_column(self, statement: str) -> bool:
        """Whether ``statement`` adds a column the table already has (an upgrade step run on a
        database that has it, as a copy rolled back by hand may), or a column of a table the
        database does not have yet (the schema creates it whole): it is skipped then."""
        added = _ADD_COLUMN.search(statement)
        if added is None:
            return False
        table, column = added.groups()
        columns = self._db.execute(f"PRAGMA table_info({table})").fetchall()
        return not columns or any(row[1] == column for row in columns)

    def _step(self, *, write: bool) -> _Step:
        return _Step(self, write)

    def _lost(self, db: sqlite3.Connection, lease: Lease, now: float) -> LeaseLost | UnknownTask:
        row = db.execute(Q["fence_state"], {"id": lease.task_id}).fetchone()
        if row is None:
            return UnknownTask(lease.task_id)
        attempt, state, token, expires_at, cancel_reason = row
        if cancel_reason is not None and state in ("leased", "cancelled"):
            return TaskCancelled(
                lease.task_id, cancel_reason, attempt=lease.attempt, current_attempt=attempt
            )
        live = expires_at is not None and expires_at > now
        reason = lost_reason(state, token == lease.token, live)
        return LeaseLost(lease.task_id, lease.attempt, attempt, state, reason=reason)

    def _fenced(self, name: str, lease: Lease, params: dict[str, Any]) -> None:
        with self._step(write=False) as db:
            now = time.time()
            params.update(id=lease.task_id, token=lease.token, now=now)
            if db.execute(Q[name], params).rowcount != 1:
                raise self._lost(db, lease, now)

    def _next_seq(self, db: sqlite3.Connection, queue: str, count: int = 1) -> int:
        (last,) = db.execute(Q["bump_seq"], {"queue": queue, "count": count}).fetchone()
        return int(last) - count + 1

    def _require_queue(self, db: sqlite3.Connection, queue: str) -> None:
        if db.execute(Q["queue_exists"], {"queue": queue}).fetchone() is None:
            raise UnknownQueue(queue)

    def _reap(self, db: sqlite3.Connection, queue: str, now: float, front: bool) -> list[Reaped]:
        reaped: list[Reaped] = []
        for task_id, attempt, before, max_reclaims, seq, cancel_reason in db.execute(
            Q["expired"], {"queue": queue, "now": now}
        ).fetchall():
            if cancel_reason is not None:  # its holder is gone: the cancel is carried out
                db.execute(Q["reap_cancel"], {"id": task_id, "now": now})
                reaped.append(Reaped(task_id, queue, attempt, "cancelled"))
                continue
            reclaims = before + 1
            outcome = reap_outcome(reclaims, max_reclaims)
            if outcome == "dead":
                error = orjson.dumps(
                    {"type": "LeaseExpired", "message": f"lease expired {reclaims} times"}
                )
                db.execute(
                    Q["reap_dead"],
                    {"id": task_id, "reclaims": reclaims, "now": now, "error": error},
                )
            else:
                new_seq = front_seq(seq) if front else self._next_seq(db, queue)
                db.execute(Q["reap_requeue"], {"id": task_id, "reclaims": reclaims, "seq": new_seq})
            reaped.append(Reaped(task_id, queue, attempt, outcome))
        return reaped

    # -- primitives -----------------------------------------------------------------------------

    def now(self) -> float:
        return time.time()

    def enqueue(self, tasks: Sequence[NewTask]) -> list[Enqueued]:
        per_queue: dict[str, int] = {}
        for spec in tasks:
            per_queue[spec.queue] = per_queue.get(spec.queue, 0) + 1
        with self._step(write=True) as db:
            now = time.time()
            next_seq = {q: self._next_seq(db, q, c) for q, c in per_queue.items()}
            out: list[Enqueued] = []
            for spec in tasks:
                seq = next_seq[spec.queue]
                next_seq[spec.queue] = seq + 1
                cursor = db.execute(
                    Q["insert_task" if spec.partition is None else "insert_partitioned"],
                    {
                        "id": spec.id,
                        "queue": spec.queue,
                        "state": "scheduled" if spec.delay > 0 else "queued",
                        "priority": spec.priority,
                        "seq": seq,
                        "payload": spec.payload_json,
                        "dedup_key": spec.dedup_key,
                        "max_reclaims": spec.max_reclaims,
                        "now": now,
                        "run_at": now + spec.delay,
                        "partition": spec.partition,
                        "context": spec.context_json,
                    },
                )
                if cursor.rowcount == 1:
                    out.append(Enqueued(spec.id, True))
                    continue
                (existing,) = db.execute(
                    Q["find_existing"],
                    {"id": spec.id, "queue": spec.queue, "dedup_key": spec.dedup_key},
                ).fetchone()
                out.append(Enqueued(existing, False))
            return out

    def claim(self, queue: str, n: int, terms: LeaseTerms) -> tuple[list[Job], list[Reaped]]:
        # A read-only probe first: idle workers polling an empty queue never take the write lock.
        with self._step(write=False) as db:
            (work,) = db.execute(Q["probe"], {"queue": queue, "now": time.time()}).fetchone()
        if not work:
            return [], []
        with self._step(write=True) as db:
            return self._claim(db, queue, n, terms, time.time())

    def _claim(
        self, db: sqlite3.Connection, queue: str, n: int, terms: LeaseTerms, now: float
    ) -> tuple[list[Job], list[Reaped]]:
        db.execute(Q["promote"], {"queue": queue, "now": now})
        reaped = self._reap(db, queue, now, terms.reap_front)
        deadline = now + terms.max_total
        expires = lease_expiry(now, terms.lease_for, deadline, now, terms.progress_timeout)
        rows = db.execute(
            Q["claim"],
            {
                "queue": queue,
                "n": n,
                "now": now,
                "expires_at": expires,
                "deadline": deadline,
                "progress_timeout": terms.progress_timeout,
                "holder": terms.holder,
            },
        ).fetchall()
        rows.sort(key=lambda r: (-r[5], r[8]))
        jobs = [
            Job(
                Lease(r[0], queue, r[1], r[2], now, expires),
                r[3],
                r[4],
                r[5],
                r[6],
                r[7],
                r[9],
                r[10],
            )
            for r in rows
        ]
        return jobs, reaped

    def extend(self, leases: Sequence[Lease], lease_for: float) -> list[Lease | None]:
        if not leases:
            return []
        payload = orjson.dumps([[lease.task_id, lease.token] for lease in leases])
        with self._step(write=False) as db:
            now = time.time()
            rows = db.execute(
                Q["extend"], {"leases": payload, "now": now, "lease_for": lease_for}
            ).fetchall()
            if len(rows) < len(leases):  # a cancel asked for meanwhile is carried out now
                db.execute(Q["cancel_held"], {"leases": payload, "now": now})
        return renewed_leases(leases, rows)

    def complete(self, lease: Lease, result_json: bytes | None) -> None:
        self._fenced("complete", lease, {"result": result_json})

    def complete_many(
        self, items: Sequence[tuple[Lease, bytes | None]]
    ) -> list[LeaseLost | UnknownTask | None]:
        out: list[LeaseLost | UnknownTask | None] = []
        if not items:
            return out
        with self._step(write=True) as db:  # one transaction: one commit for the batch
            return self._complete_many(db, items, time.time())

    def complete_and_claim(
        self, items: Sequence[tuple[Lease, bytes | None]], queue: str, n: int, terms: LeaseTerms
    ) -> tuple[list[LeaseLost | UnknownTask | None], list[Job], list[Reaped]]:
        with self._step(write=True) as db:  # one transaction: one commit for both
            now = time.time()
            outcomes = self._complete_many(db, items, now)
            jobs, reaped = self._claim(db, queue, n, terms, now)
        return outcomes, jobs, reaped

    def _complete_many(
        self, db: sqlite3.Connection, items: Sequence[tuple[Lease, bytes | None]], now: float
    ) -> list[LeaseLost | UnknownTask | None]:
        out: list[LeaseLost | UnknownTask | None] = []
        sql = Q["complete"]
        for lease, result_json in items:
            params = {"id": lease.task_id, "token": lease.token, "now": now, "result": result_json}
            if db.execute(sql, params).rowcount == 1:
                out.append(None)
            else:
                out.append(self._lost(db, lease, now))
        return out

    def fail(self, lease: Lease, error_json: bytes, retry_in: float | None) -> Task:
        name = "fail_dead" if retry_in is None else "fail_retry"
        with self._step(write=False) as db:  # one statement: fenced write and the new row
            now = time.time()
            params = {"id": lease.task_id, "token": lease.token, "now": now, "error": error_json}
            params["retry_in"] = retry_in
            rows = db.execute(Q[name], params).fetchall()  # all: the statement must finish
            if not rows:
                raise self._lost(db, lease, now)
        return task_from_row(rows[0])

    def release(self, lease: Lease, front: bool) -> None:
        with self._step(write=True) as db:
            now = time.time()
            seq = 0 if front else self._next_seq(db, lease.queue)
            params = {
                "id": lease.task_id,
                "token": lease.token,
                "now": now,
                "front": front,
                "offset": FRONT_OFFSET,
                "seq": seq,
            }
            if db.execute(Q["release"], params).rowcount != 1:
                raise self._lost(db, lease, now)

    def progress(
        self, lease: Lease, progress_json: bytes | None, checkpoint_json: bytes | None
    ) -> None:
        self._fenced("progress", lease, {"progress": progress_json, "checkpoint": checkpoint_json})

    def reap(self, queue: str, front: bool) -> list[Reaped]:
        with self._step(write=True) as db:
            return self._reap(db, queue, time.time(), front)

    def get(self, task_id: str) -> Task:
        with self._step(write=False) as db:
            row = db.execute(Q["get"], {"id": task_id}).fetchone()
        if row is None:
            raise UnknownTask(task_id)
        return task_from_row(row)

    def stats(self, queue: str) -> QueueStats:
        with self._step(write=False) as db:
            db.execute("BEGIN")  # one read snapshot for every count
            try:
                self._require_queue(db, queue)
                now = time.time()
                counts = dict(db.execute(Q["counts"], {"queue": queue}))
                (oldest,) = db.execute(Q["oldest_queued"], {"queue": queue}).fetchone()
                hot = tuple(db.execute(Q["hot_partitions"], {"queue": queue}))
            finally:
                db.execute("COMMIT")
        return QueueStats(queue, counts, None if oldest is None else now - oldest, now, hot)

    def queues(self) -> list[str]:
        with self._step(write=False) as db:
            return [name for (name,) in db.execute(Q["queues"])]

    def inspect(self, queue: str, limit: int) -> list[LeaseInfo]:
        with self._step(write=False) as db:
            self._require_queue(db, queue)
            now = time.time()
            rows = db.execute(Q["inspect"], {"queue": queue, "now": now, "limit": limit}).fetchall()
        return [
            LeaseInfo(task_id, attempt, now - leased_at, expires_at - now, reclaims, failures, who)
            for task_id, attempt, leased_at, expires_at, reclaims, failures, who in rows
        ]

    def dead(self, queue: str, limit: int) -> list[Task]:
        with self._step(write=False) as db:
            self._require_queue(db, queue)
            rows = db.execute(Q["dead"], {"queue": queue, "limit": limit}).fetchall()
        return [task_from_row(r) for r in rows]

    def requeue_dead(self, queue: str, task_ids: Sequence[str] | None, front: bool) -> int:
        with self._step(write=True) as db:
            self._require_queue(db, queue)
            now = time.time()
            rows = db.execute(Q["dead_ids"], {"queue": queue}).fetchall()
            wanted = None if task_ids is None else set(task_ids)
            chosen = [(i, s) for i, s in rows if wanted is None or i in wanted]
            for task_id, seq in chosen:  # oldest first: the first of a partition may run
                new_seq = front_seq(seq) if front else self._next_seq(db, queue)
                db.execute(Q["requeue_dead"], {"id": task_id, "seq": new_seq, "now": now})
            return len(chosen)

    def purge_tasks(self, queue: str, state: FinishedState, older_than: float, limit: int) -> int:
        name = f"purge_{state}"
        with self._step(write=False) as db:  # one statement: one atomic step
            params = {"queue": queue, "cutoff": time.time() - older_than, "limit": limit}
            return int(db.execute(Q[name], params).rowcount)

    def list_tasks(
        self, queue: str, state: ListedState, limit: int, after: Key | None
    ) -> tuple[list[Task], Key | None]:
        params: dict[str, Any] = {"queue": queue, "limit": limit + 1}
        if state == "queued":
            start = _cursor.key(after, int, int, str)
            if start is not None:
                params.update(p=start[0], s=start[1])
        else:
            start = _cursor.key(after, float, str)
            if start is not None:
                params.update(at=start[0], id=start[1])
        name = f"list_{state}" if start is None else f"list_{state}_after"
        with self._step(write=False) as db:
            rows = db.execute(Q[name], params).fetchall()
        page = rows[:limit]
        if len(rows) <= limit:
            return [task_from_row((*r[:21], r[22])) for r in page], None
        last = page[-1]
        key: Key
        if state == "queued":
            key = [last[3], last[21], last[0]]
        else:
            key = [last[13] if state == "leased" else last[14], last[0]]
        return [task_from_row((*r[:21], r[22])) for r in page], key

    def register_worker(self, worker_id: str, info_json: bytes, ttl: float) -> float:
        with self._step(write=True) as db:
            now = time.time()
            db.execute(Q["worker_sweep"], {"now": now})
            params = {"id": worker_id, "info": info_json, "now": now, "expires_at": now + ttl}
            db.execute(Q["worker_register"], params)
        return now + ttl

    def workers(self) -> list[WorkerInfo]:
        with self._step(write=False) as db:
            rows = db.execute(Q["workers"], {"now": time.time()}).fetchall()
        return [WorkerInfo(w, bytes(info), beat, until) for w, info, beat, until in rows]

    def unregister_worker(self, worker_id: str) -> bool:
        with self._step(write=False) as db:
            return bool(db.execute(Q["worker_unregister"], {"id": worker_id}).rowcount)

    def cancel(self, task_id: str, reason: str, error_json: bytes) -> Cancellation:
        with self._step(write=True) as db:
            now = time.time()
            row = db.execute(Q["cancel_state"], {"id": task_id}).fetchone()
            if row is None:
                raise UnknownTask(task_id)
            state, expires_at, current = row
            if state in FINISHED:
                return Cancellation(task_id, "finished", state, current)
            if state == "leased" and expires_at is not None and expires_at > now:
                if current is None:
                    params = {"id": task_id, "reason": reason, "error": error_json}
                    db.execute(Q["cancel_request"], params)
                return Cancellation(task_id, "requested", "leased", current or reason)
            db.execute(
                Q["cancel_now"], {"id": task_id, "reason": reason, "error": error_json, "now": now}
            )
            return Cancellation(task_id, "cancelled", "cancelled", current or reason)

    def delete_queue(self, queue: str, limit: int, force: bool) -> tuple[int, bool]:
        with self._step(write=True) as db:
            if not force:
                (leased,) = db.execute(
                    Q["leased_live"], {"queue": queue, "now": time.time()}
                ).fetchone()
                if leased:
                    raise QueueInUse(queue, leased)
            deleted = db.execute(Q["delete_tasks"], {"queue": queue, "limit": limit}).rowcount
            if deleted < limit:  # none is left: the queue goes too
                db.execute(Q["delete_queue"], {"queue": queue})
                return deleted, True
            return deleted, False

    def close(self) -> None:
        with self._lock:
            try:
                self._db.close()
            except sqlite3.Error as exc:
                raise _translate(self.path, exc) from exc

    def twin(self, timeout: float | None = None) -> SQLiteBackend:
        """Another connection to the same database (waiting at most ``timeout`` seconds for the
        write lock, if that is shorter than this one's)."""
        wait = self._timeout if timeout is None else min(self._timeout, timeout)
        return SQLiteBackend(self.path, timeout=wait, synchronous=self._synchronous, url=self.url)

    def open_async(self) -> AsyncBackend:
        return ThreadedAsyncBackend(self.twin(), sync_factory=self.twin)
