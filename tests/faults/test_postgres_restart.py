"""PostgreSQL under faults, on a private server this module starts (never the shared one).

* The server restarts in the middle of a run of real worker processes: they reconnect and carry
  on, no committed task is lost, none is completed twice (an independent ledger that the handlers
  append to is checked against the store), and while the server is down clients get
  BackendUnavailable quickly instead of hanging.
* Eight processes open a fresh schema at once: every one succeeds and each migration is applied
  once.
* A schema without the tables and ``migrate=false``, a wrong password, an unreachable host: each
  is a typed error, quickly.
* Idle workers wake on LISTEN/NOTIFY, also after the listening connection was cut by a restart.

AGENTLEASE_DEEP=1 repeats the restart run with more seeds and both shutdown modes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import agentlease as al
from agentlease.backends._postgres_driver import MIGRATIONS
from agentlease.errors import AuthenticationFailed, BackendError, BackendUnavailable
from tests import _private_postgres
from tests.conftest import unavailable

DEEP = os.environ.get("AGENTLEASE_DEEP") == "1"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server() -> Iterator[_private_postgres.PrivatePostgres]:
    """One private PostgreSQL for the module, stopped and removed afterwards."""
    try:
        pg = _private_postgres.start()
    except _private_postgres.CannotStart as exc:
        unavailable("private postgres", str(exc))
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def url(server: _private_postgres.PrivatePostgres) -> str:
    """A fresh schema on the private server (dropped with the server)."""
    if not server._running:
        server.start()  # a failed test may have left it stopped
    return server.url(schema=f"t{uuid.uuid4().hex[:12]}", pool_timeout="1", connect_timeout="2")


def count_done(server: _private_postgres.PrivatePostgres, url: str) -> int:
    schema = url.split("schema=")[1].split("&", maxsplit=1)[0]
    try:
        with psycopg.connect(server.url(), connect_timeout=2) as conn:
            row = conn.execute(
                f"SELECT count(*) FROM {schema}.agentlease_tasks WHERE state = 'done'".encode()
            ).fetchone()
    except psycopg.Error:
        return -1
    return int(row[0]) if row else 0


# -- the server restarts under real workers ------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import os, sys, time
    import agentlease as al

    url, ledger = sys.argv[1], sys.argv[2]

    def handle(ctx):
        time.sleep(0.04)  # the work; the restart lands in the middle of some of it
        line = f"{ctx.task_id} {ctx.attempt} {os.getpid()}\\n".encode()
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line)  # one small O_APPEND write: atomic between processes
        finally:
            os.close(fd)
        return {"attempt": ctx.attempt}

    queue = al.Queue.connect(url, settings=al.QueueSettings(lease_for=3.0))
    worker = al.Worker(
        queue, "jobs", handle,
        settings=al.WorkerSettings(concurrency=4, poll_interval=0.2, shutdown_grace=5.0),
    )
    worker.run()
    queue.close()
    print(worker.processed)
    """
)


# The same worker on the asyncio face: an AsyncWorker, an async handler that reports progress.
ASYNC_WORKER = textwrap.dedent(
    """
    import asyncio, os, sys
    import agentlease as al

    url, ledger = sys.argv[1], sys.argv[2]

    async def handle(ctx):
        try:
            await ctx.progress({"step": 1})
        except al.AgentLeaseError:
            pass  # the store is down (or the lease lost): the worker's writes will say so
        await asyncio.sleep(0.04)
        line = f"{ctx.task_id} {ctx.attempt} {os.getpid()}\\n".encode()
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return {"attempt": ctx.attempt}

    async def main():
        queue = al.AsyncQueue.connect(url, settings=al.QueueSettings(lease_for=3.0))
        worker = al.AsyncWorker(
            queue, "jobs", handle,
            settings=al.WorkerSettings(concurrency=4, poll_interval=0.2, shutdown_grace=5.0),
        )
        await worker.run()
        await queue.close()
        print(worker.processed)

    asyncio.run(main())
    """
)


def _restart_run(
    server: _private_postgres.PrivatePostgres,
    url: str,
    tmp_path: Path,
    mode: str,
    tasks: int,
    script: str = WORKER,
) -> None:
    ledger = tmp_path / "ledger.txt"
    producer = al.Queue.connect(url)
    ids = [e.task_id for e in producer.enqueue_many("jobs", [{"i": i} for i in range(tasks)])]
    logs = [(tmp_path / f"worker{k}.out", tmp_path / f"worker{k}.err") for k in range(3)]
    with contextlib.ExitStack() as files:
        workers = [
            subprocess.Popen(
                [sys.executable, "-c", script, url, str(ledger)],
                cwd=ROOT,
                # Files, not pipes: a chatty worker must never block on a full pipe.
                stdout=files.enter_context(out.open("w")),
                stderr=files.enter_context(err.open("w")),
            )
            for out, err in logs
        ]
        before = _drive(server, url, workers, producer, mode, tasks, ledger)
    for w, (_, err) in zip(workers, logs, strict=True):
        assert w.returncode == 0, err.read_text()[-3000:]
        assert "Traceback" not in err.read_text(), err.read_text()[-3000:]
    processed = sum(int(out.read_text().split()[-1]) for out, _ in logs)
    assert processed >= tasks
    _check(producer, ids, ledger, before)
    producer.close()


def _drive(
    server: _private_postgres.PrivatePostgres,
    url: str,
    workers: list[subprocess.Popen[bytes]],
    producer: al.Queue,
    mode: str,
    tasks: int,
    ledger: Path,
) -> int:
    """Stop the server once a quarter is done, check clients while it is down, start it again,
    wait for the rest, stop the workers; returns how many handler runs preceded the stop."""
    try:
        deadline = time.monotonic() + 30
        while count_done(server, url) < tasks // 4:
            assert time.monotonic() < deadline, "the workers did not get going"
            assert all(w.poll() is None for w in workers), "a worker died before the restart"
            time.sleep(0.02)

        server.stop_server(mode)
        before = len(ledger.read_text().splitlines())
        assert tasks // 4 <= before < tasks, "the restart must land mid-run"
        # While the server is down: a typed error, quickly, from a pooled client and a new one.
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            producer.stats("jobs")
        with pytest.raises(BackendUnavailable) as info:
            al.connect(url)
        assert isinstance(info.value.__cause__, psycopg.Error)
        assert time.monotonic() - started < 6, "clients hung while the server was down"
        time.sleep(1.0)
        server.start()

        deadline = time.monotonic() + 60
        while count_done(server, url) < tasks:
            assert time.monotonic() < deadline, f"stuck at {count_done(server, url)}/{tasks}"
            assert all(w.poll() is None for w in workers), "a worker died after the restart"
            time.sleep(0.05)
        return before
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=30)


def _check(producer: al.Queue, ids: list[str], ledger: Path, before: int) -> None:
    """Every task done once, by the attempt whose handler run wrote the result."""
    tasks = len(ids)
    stats = producer.stats("jobs")
    assert {s: n for s, n in stats.counts.items() if n} == {"done": tasks}
    runs = [line.split() for line in ledger.read_text().splitlines()]
    assert len(runs) > before, "nothing was done after the restart"
    per_attempt = Counter((task_id, int(attempt)) for task_id, attempt, _ in runs)
    assert max(per_attempt.values()) == 1, "one attempt ran its handler twice"
    for task_id in ids:
        task = producer.get(task_id)
        assert task.state == "done"
        assert task.result == {"attempt": task.attempt}
        assert per_attempt[(task_id, task.attempt)] == 1, f"{task_id}: result not in the ledger"
        # Earlier attempts ran only if their lease was lost (the restart): never a later one.
        assert all(a <= task.attempt for t, a in per_attempt if t == task_id)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "tasks"),
    [("fast", 300)] + ([("immediate", 300), ("fast", 600)] if DEEP else []),
)
def test_workers_survive_a_server_restart(
    server: _private_postgres.PrivatePostgres, url: str, tmp_path: Path, mode: str, tasks: int
) -> None:
    _restart_run(server, url, tmp_path, mode, tasks)


@pytest.mark.slow
def test_asyncio_workers_survive_a_server_restart(
    server: _private_postgres.PrivatePostgres, url: str, tmp_path: Path
) -> None:
    _restart_run(server, url, tmp_path, "fast", 300, ASYNC_WORKER)


# -- migrations ----------------------------------------------------------------------------------

OPENER = textwrap.dedent(
    """
    import sys, time
    import agentlease as al

    url, start_at = sys.argv[1], float(sys.argv[2])
    time.sleep(max(0.0, start_at - time.time()))
    backend = al.connect(url)
    print(backend.queues())
    backend.close()
    """
)


@pytest.mark.slow
def test_many_processes_migrate_a_fresh_schema_at_once(
    server: _private_postgres.PrivatePostgres, url: str
) -> None:
    start_at = time.time() + 2.0  # every child imported and waiting by then
    children = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, url, repr(start_at)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err[-3000:]
        assert out.strip() == "[]"
    schema = url.split("schema=")[1].split("&", maxsplit=1)[0]
    with psycopg.connect(server.url()) as conn:
        rows = conn.execute(
            f"SELECT version, name FROM {schema}.agentlease_migrations ORDER BY version".encode()
        ).fetchall()
    assert rows == [(m.version, m.name) for m in MIGRATIONS]
    # And once more, the fast path: nothing to apply, nothing waits.
    backend = al.connect(url)
    assert backend.queues() == []
    backend.close()


def test_schema_without_tables_and_migrate_false_is_a_clear_error(
    server: _private_postgres.PrivatePostgres, url: str
) -> None:
    off = url + "&migrate=false"
    with pytest.raises(BackendError) as info:
        al.connect(off)
    assert not isinstance(info.value, BackendUnavailable)
    assert "agentlease migrate" in str(info.value)
    schema = url.split("schema=")[1].split("&", maxsplit=1)[0]
    server.sql(f"CREATE SCHEMA {schema}")  # the schema exists, the tables do not
    with pytest.raises(BackendError, match="agentlease migrate"):
        al.connect(off)

    async def first_call() -> None:
        backend = al.connect_async(off)
        try:
            await backend.queues()
        finally:
            await backend.close()

    with pytest.raises(BackendError, match="agentlease migrate"):
        asyncio.run(first_call())

    # Once migrated, migrate=false opens it; tables dropped under a running client: same advice.
    backend = al.connect(url)
    checked = al.connect(off)
    assert checked.queues() == []
    checked.close()
    server.sql(f"DROP TABLE {schema}.agentlease_queues CASCADE")
    with pytest.raises(BackendError, match="agentlease migrate") as dropped:
        backend.queues()
    assert isinstance(dropped.value.__cause__, psycopg.errors.UndefinedTable)
    backend.close()


def test_wrong_password_is_a_typed_error(server: _private_postgres.PrivatePostgres) -> None:
    """A refused login is permanent (AuthenticationFailed), never BackendUnavailable, on both
    faces from the first call."""
    role = _private_postgres.PASSWORD_ROLE
    base = f"127.0.0.1:{server.port}/postgres?schema=pw_{uuid.uuid4().hex[:8]}"
    with pytest.raises(AuthenticationFailed) as info:
        al.connect(f"postgresql://{role}:not-it@{base}")
    message = str(info.value)
    assert "password authentication failed" in message
    assert "not-it" not in message
    assert isinstance(info.value.__cause__, psycopg.OperationalError)
    for url in (f"postgresql://{role}@{base}&password=not-it", f"postgresql://{role}@{base}"):
        with pytest.raises(AuthenticationFailed) as info:
            al.connect(url)
        assert "not-it" not in str(info.value)

    async def first_call() -> None:
        backend = al.connect_async(f"postgresql://{role}:not-it@{base}")
        try:
            await backend.queues()
        finally:
            await backend.close()

    with pytest.raises(AuthenticationFailed):
        asyncio.run(first_call())
    right = al.connect(f"postgresql://{role}:{_private_postgres.PASSWORD}@{base}")
    assert right.queues() == []
    right.close()


@pytest.mark.parametrize(
    "host",
    [
        pytest.param("127.0.0.1:1", id="refused"),
        pytest.param("192.0.2.1:5432", id="black-hole"),  # TEST-NET-1: nothing answers
    ],
)
def test_unreachable_host_is_a_typed_error_quickly(host: str) -> None:
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as info:
        al.connect(f"postgresql://agent@{host}/db?connect_timeout=1")
    assert time.monotonic() - started < 5
    assert isinstance(info.value.__cause__, psycopg.OperationalError)

    async def first_call() -> None:
        backend = al.connect_async(f"postgresql://agent@{host}/db?connect_timeout=1")
        try:
            await backend.queues()
        finally:
            await backend.close()

    started = time.monotonic()
    with pytest.raises(BackendUnavailable):
        asyncio.run(first_call())
    assert time.monotonic() - started < 5


# -- LISTEN/NOTIFY -------------------------------------------------------------------------------


async def _woken_within(backend: al.AsyncBackend, producer: al.Queue, seconds: float) -> float:
    waiting = asyncio.ensure_future(backend.wait_for_work("jobs", seconds))
    await asyncio.sleep(0.5)  # the wait has connected and is listening
    assert not waiting.done()
    sent = time.monotonic()
    await asyncio.to_thread(producer.enqueue, "jobs", "wake up")
    await asyncio.wait_for(waiting, seconds)
    return time.monotonic() - sent


def test_idle_workers_wake_on_notify_also_after_a_restart(
    server: _private_postgres.PrivatePostgres, url: str
) -> None:
    producer = al.Queue.connect(url)

    async def scenario() -> dict[str, float]:
        backend = al.connect_async(url)
        try:
            timings = {"first": await _woken_within(backend, producer, 10.0)}
            started = time.monotonic()
            await backend.wait_for_work("jobs", 0.3)  # nothing sent: waits out the timeout
            timings["timeout"] = time.monotonic() - started
            other = await asyncio.to_thread(producer.queues)
            assert other == ["jobs"]
            await asyncio.to_thread(server.restart, down_for=0.3)
            # The cut listener never raises; it sleeps out this wait and reconnects on the next.
            started = time.monotonic()
            await backend.wait_for_work("jobs", 0.3)
            timings["after_cut"] = time.monotonic() - started
            timings["reconnected"] = await _woken_within(backend, producer, 10.0)
            return timings
        finally:
            await backend.close()

    try:
        timings = asyncio.run(scenario())
    finally:
        producer.close()
    assert timings["first"] < 1.0
    assert 0.25 < timings["timeout"] < 1.0
    assert timings["after_cut"] < 1.0
    assert timings["reconnected"] < 1.0
    print(json.dumps(timings))


def test_an_idle_worker_is_woken_by_an_enqueue_not_by_its_poll_interval(url: str) -> None:
    import threading

    done_at: list[float] = []
    queue = al.Queue.connect(url)
    queue.enqueue("jobs", "warm up")  # the worker claims it at once, then idles

    def handle(ctx: al.JobContext) -> al.JSON:
        done_at.append(time.monotonic())
        return None

    worker = al.Worker(queue, "jobs", handle, settings=al.WorkerSettings(poll_interval=10.0))
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    thread.start()
    try:
        # Idle waits double from 10 ms (with jitter): 5 s in, the next poll is at least ~0.6 s
        # away in all but one run of a thousand, and usually seconds.
        time.sleep(5.0)
        assert len(done_at) == 1
        sent = time.monotonic()
        queue.enqueue("jobs", "wake")
        deadline = sent + 10
        while len(done_at) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(done_at) == 2
        assert done_at[1] - sent < 0.5, "the worker waited for its poll instead of the notify"
    finally:
        worker.stop(force=True)
        thread.join(timeout=30)
        queue.close()
    assert not thread.is_alive()


def test_a_read_only_server_is_unavailable_not_a_permanent_refusal(
    server: _private_postgres.PrivatePostgres, url: str
) -> None:
    """A server that refuses writes as read-only (a standby, a failover under way) is an outage
    that callers and workers wait out, as Redis's READONLY is: BackendUnavailable, not a
    BackendError, which says the call itself failed."""
    producer = al.Queue.connect(url)
    producer.enqueue("jobs", 1)
    role = f"ro_{uuid.uuid4().hex[:8]}"
    schema = url.split("schema=")[1].split("&", maxsplit=1)[0]
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN".encode())
        conn.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on".encode())
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}".encode())
        conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {role}".encode())
        conn.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA {schema} TO {role}".encode())
    reader = al.Queue.connect(url.replace("postgresql://postgres@", f"postgresql://{role}@"))
    try:
        assert reader.stats("jobs").counts == {"queued": 1}  # reads still work
        for call in (lambda: reader.enqueue("jobs", 2), lambda: reader.claim("jobs")):
            with pytest.raises(BackendUnavailable, match="read-only"):
                call()
        assert producer.stats("jobs").counts == {"queued": 1}
    finally:
        reader.close()
        producer.close()
