"""The measured loops of ``agentlease bench``: through the library, and raw on the same store.

A *driver* fills a queue (untimed) and then drains it with one loop shape: claim ``batch`` tasks,
complete each, until a claim comes back empty (or claim only). :class:`Library` goes through
:class:`agentlease.Queue`; :class:`RawSQLite` issues the SQLite backend's own statements (read from
``backends/sql/sqlite.sql``) straight through :mod:`sqlite3`; :class:`RawMemory` calls the
:class:`~agentlease.MemoryBackend` primitives without the client layer. The raw loops are the
baselines: what the same store and driver do with no library in the way.

:func:`drain_together` runs several drivers on one queue at once behind a start barrier: in
processes (spawned, so each has its own interpreter and connection) for SQLite, in threads for
memory, whose store lives in one process.
"""

from __future__ import annotations

import multiprocessing
import queue as stdlib_queue
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import parse_qsl, urlsplit

import click
import orjson

from agentlease._codec import JSON
from agentlease._records import LeaseTerms, NewTask, TaskSpec
from agentlease._sync.queue import Queue
from agentlease.backends import connect
from agentlease.backends._sqlfile import queries
from agentlease.backends.base import Backend
from agentlease.backends.memory import MemoryBackend

__all__ = [
    "ROUNDS",
    "Driver",
    "Library",
    "RawMemory",
    "RawSQLite",
    "Target",
    "drain_together",
    "split",
    "sqlite_synchronous",
]

Mode = Literal["claim_complete", "claim_only"]
ROUNDS = 3
LEASE_FOR = 30.0  # QueueSettings' defaults, which the library rows run with
MAX_LEASE = 3600.0
FILL_CHUNK = 1000


class Driver(Protocol):
    """Fills a queue, then drains it in one timed loop."""

    def fill(self, queue: str, count: int) -> None:
        """Enqueue ``count`` small tasks (not timed)."""
        ...

    def drain(self, queue: str, batch: int, mode: Mode) -> int:
        """Claim ``batch`` at a time (completing each, unless ``claim_only``) until empty;
        returns how many tasks were claimed."""
        ...

    def close(self) -> None:
        """Release the store."""
        ...


def split(tasks: int, rounds: int) -> tuple[int, ...]:
    """``tasks`` split into at most ``rounds`` near-equal, non-empty rounds."""
    rounds = max(1, min(rounds, tasks))
    return tuple(tasks // rounds + (1 if i < tasks % rounds else 0) for i in range(rounds))


def sqlite_synchronous(url: str) -> str:
    """The ``synchronous`` PRAGMA a SQLite URL asks for (the backend's default: NORMAL)."""
    return dict(parse_qsl(urlsplit(url).query)).get("synchronous", "NORMAL").upper()


def _payload(i: int) -> dict[str, JSON]:
    return {"n": i}


class Library:
    """The loops through the library's synchronous client."""

    def __init__(self, backend: Backend) -> None:
        self.q = Queue(backend)

    def fill(self, queue: str, count: int) -> None:
        for start in range(0, count, FILL_CHUNK):
            stop = min(count, start + FILL_CHUNK)
            self.q.enqueue_many(queue, [TaskSpec(payload=_payload(i)) for i in range(start, stop)])

    def drain(self, queue: str, batch: int, mode: Mode) -> int:
        q = self.q
        done = 0
        if mode == "claim_only":
            while jobs := q.claim(queue, batch):
                done += len(jobs)
            return done
        while jobs := q.claim(queue, batch):
            if batch == 1:
                q.complete(jobs[0].lease)
            elif any(q.complete_many([(job.lease, None) for job in jobs])):
                raise click.ClickException("a completion was refused")
            done += len(jobs)
        return done

    def close(self) -> None:
        self.q.close()


class RawSQLite:
    """The SQLite backend's statements, issued straight through :mod:`sqlite3`.

    Args:
        path: a database file; created with the backend's schema and PRAGMAs.
        synchronous: the ``synchronous`` PRAGMA, as the library's URL sets it.
    """

    def __init__(self, path: str, synchronous: str = "NORMAL") -> None:
        self.q = queries("agentlease.backends.sql", "sqlite.sql")
        self.db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.execute("BEGIN IMMEDIATE")
        for statement in self.q["schema"].split(";"):
            if statement.strip():
                self.db.execute(statement)
        self.db.execute("COMMIT")

    def fill(self, queue: str, count: int) -> None:
        db, q = self.db, self.q
        for start in range(0, count, FILL_CHUNK):
            size = min(count, start + FILL_CHUNK) - start
            db.execute("BEGIN IMMEDIATE")
            (last,) = db.execute(q["bump_seq"], {"queue": queue, "count": size}).fetchone()
            now = time.time()
            for i in range(size):
                db.execute(
                    q["insert_task"],
                    {
                        "id": uuid.uuid4().hex,
                        "queue": queue,
                        "state": "queued",
                        "priority": 0,
                        "seq": last - size + 1 + i,
                        "payload": orjson.dumps(_payload(start + i)),
                        "dedup_key": None,
                        "max_reclaims": 5,
                        "now": now,
                        "run_at": now,
                        "context": None,
                    },
                )
            db.execute("COMMIT")

    def drain(self, queue: str, batch: int, mode: Mode) -> int:
        db = self.db
        probe, promote, expired = self.q["probe"], self.q["promote"], self.q["expired"]
        claim, complete = self.q["claim"], self.q["complete"]
        done = 0
        while True:
            (work,) = db.execute(probe, {"queue": queue, "now": time.time()}).fetchone()
            if not work:
                return done
            db.execute("BEGIN IMMEDIATE")
            now = time.time()
            db.execute(promote, {"queue": queue, "now": now})
            db.execute(expired, {"queue": queue, "now": now}).fetchall()
            rows = db.execute(
                claim,
                {
                    "queue": queue,
                    "n": batch,
                    "now": now,
                    "expires_at": now + LEASE_FOR,
                    "deadline": now + MAX_LEASE,
                    "progress_timeout": None,
                    "holder": None,
                },
            ).fetchall()
            db.execute("COMMIT")
            if not rows:
                return done
            done += len(rows)
            if mode == "claim_only":
                continue
            if batch > 1:
                db.execute("BEGIN IMMEDIATE")  # a batch of completions commits once
            for row in rows:
                params = {"id": row[0], "token": row[1], "now": time.time(), "result": None}
                if db.execute(complete, params).rowcount != 1:
                    raise click.ClickException(f"raw complete of {row[0]} was refused")
            if batch > 1:
                db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()


class RawMemory:
    """The :class:`MemoryBackend` primitives, called without the client layer."""

    def __init__(self, backend: MemoryBackend) -> None:
        self.backend = backend
        self.terms = LeaseTerms(lease_for=LEASE_FOR, max_total=MAX_LEASE)

    def fill(self, queue: str, count: int) -> None:
        for start in range(0, count, FILL_CHUNK):
            stop = min(count, start + FILL_CHUNK)
            self.backend.enqueue(
                [
                    NewTask(uuid.uuid4().hex, queue, orjson.dumps(_payload(i)))
                    for i in range(start, stop)
                ]
            )

    def drain(self, queue: str, batch: int, mode: Mode) -> int:
        backend, terms = self.backend, self.terms
        done = 0
        while True:
            jobs, _ = backend.claim(queue, batch, terms)
            if not jobs:
                return done
            done += len(jobs)
            if mode == "claim_only":
                continue
            if batch == 1:
                backend.complete(jobs[0].lease, None)
            elif any(backend.complete_many([(job.lease, None) for job in jobs])):
                raise click.ClickException("a raw completion was refused")

    def close(self) -> None:
        """The store is shared; nothing to release."""


@dataclass(frozen=True, slots=True)
class Target:
    """How a worker (thread or spawned process) opens its own driver on the shared store.

    Attributes:
        kind: ``library`` or ``raw``.
        url: the library's URL; for ``raw``, the raw database file (SQLite).
        synchronous: the raw database's ``synchronous`` PRAGMA.
    """

    kind: Literal["library", "raw"]
    url: str
    synchronous: str = "NORMAL"

    def open(self) -> Driver:
        """A fresh driver (its own connection) on the target's store."""
        if self.kind == "library":
            return Library(connect(self.url))
        return RawSQLite(self.url, self.synchronous)


def _drain_in_child(target: Target, queue: str, barrier: Any, out: Any) -> None:
    """A spawned process: open, wait for the start signal, drain, report (n, start, end)."""
    try:
        driver = target.open()
    except BaseException as exc:
        barrier.abort()
        out.put(("error", f"{type(exc).__name__}: {exc}"))
        return
    try:
        barrier.wait(timeout=120)
        start = time.time()
        n = driver.drain(queue, 1, "claim_complete")
        out.put((n, start, time.time()))
    except BaseException as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        driver.close()


def drain_together(
    workers: int, queue: str, *, target: Target | None = None, shared: Driver | None = None
) -> tuple[int, float]:
    """Drain ``queue`` with ``workers`` one-task loops started together.

    Pass ``target`` for spawned processes that each open their own connection, or ``shared``
    for threads that drive one in-process store (memory).

    Returns:
        The tasks claimed by all of them, and the wall time from the start signal to the end of
        the last loop.
    """
    if shared is not None:
        return _threads(workers, queue, shared)
    assert target is not None
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_drain_in_child, args=(target, queue, barrier, out), daemon=True)
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    results: list[tuple[Any, ...]] = []
    try:
        while len(results) < workers:
            try:
                results.append(out.get(timeout=1.0))
            except stdlib_queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise click.ClickException("a bench worker process died") from None
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        out.close()
        out.join_thread()
    errors = [r[1] for r in results if r[0] == "error"]
    if errors:
        raise click.ClickException(f"a bench worker process failed: {errors[0]}")
    return sum(r[0] for r in results), max(r[2] for r in results) - min(r[1] for r in results)


def _threads(workers: int, queue: str, shared: Driver) -> tuple[int, float]:
    barrier = threading.Barrier(workers)
    results: list[tuple[int, float, float]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(timeout=60)
            start = time.time()
            n = shared.drain(queue, 1, "claim_complete")
            results.append((n, start, time.time()))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, name=f"bench-{i}") for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        failure = errors[0]
        raise click.ClickException(f"a bench worker thread failed: {failure!r}") from failure
    return sum(r[0] for r in results), max(r[2] for r in results) - min(r[1] for r in results)
