"""The worker at its edges: re-claimed leases, hung store calls, short progress timeouts, slow
event callbacks, progress during an outage, unknown queues, unreachable and refusing stores.
Both faces."""

from __future__ import annotations

import asyncio
import logging
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import agentlease as al
from agentlease.backends.memory import MemoryBackend
from tests._private_redis import free_port


class Clock:
    """Real time plus an offset the test can jump forward (the store's clock)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def _run(face: str, queue: al.Queue, handler: Callable[..., object], **settings: object) -> None:
    """Run a worker of ``face`` on ``queue`` in burst mode until it is done."""
    ws = al.WorkerSettings(**settings)  # type: ignore[arg-type]
    if face == "sync":
        al.Worker(queue, "q", handler, settings=ws).run(burst=True, handle_signals=False)  # type: ignore[arg-type]
        return

    async def main() -> None:
        aq = al.AsyncQueue(
            queue.backend.open_async(), settings=queue.settings, on_event=queue.events.callback
        )
        try:
            await al.AsyncWorker(aq, "q", handler, settings=ws).run(  # type: ignore[arg-type]
                burst=True, handle_signals=False
            )
        finally:
            await aq.close()

    asyncio.run(main())


@pytest.mark.parametrize("face", ["sync", "async"])
def test_reclaiming_its_own_lost_task_cancels_the_old_run(face: str) -> None:
    clock = Clock()
    backend = MemoryBackend(clock=clock)
    events: list[al.Event] = []
    queue = al.Queue(backend, settings=al.QueueSettings(lease_for=10.0), on_event=events.append)
    queue.enqueue("q", None, id="t1")
    first_started = threading.Event()
    first_cancelled = threading.Event()

    def jump() -> None:
        assert first_started.wait(10)
        clock.offset += 100.0  # the store's clock: attempt 1's lease has run out

    if face == "sync":

        def handler(ctx: al.JobContext) -> al.JSON:
            if ctx.attempt == 1:
                first_started.set()
                if ctx.wait(8):
                    first_cancelled.set()
                return "from attempt 1"
            return "from attempt 2"

    else:

        async def handler(ctx: al.AsyncJobContext) -> al.JSON:  # type: ignore[misc]
            if ctx.attempt == 1:
                first_started.set()
                try:
                    await asyncio.sleep(8)
                except asyncio.CancelledError:
                    first_cancelled.set()
                    raise
                return "from attempt 1"
            return "from attempt 2"

    jumper = threading.Thread(target=jump)
    jumper.start()
    # The heartbeat is slow, so this worker's next claim takes the task back before any beat.
    _run(face, queue, handler, concurrency=2, heartbeat_interval=4.0, poll_interval=0.05)
    jumper.join()
    assert first_cancelled.is_set(), "attempt 1 was never cancelled"
    task = queue.get("t1")
    assert (task.state, task.attempt, task.result) == ("done", 2, "from attempt 2")
    lost = [e for e in events if e.name == "lease_lost"]
    assert [e.attempt for e in lost] == [1]
    assert "claimed the task again" in str(lost[0].fields["reason"])
    completed = [e.attempt for e in events if e.name == "completed"]
    assert completed == [2]


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_hung_heartbeat_call_loses_the_lease_at_its_local_deadline(
    face: str, tmp_path: Path
) -> None:
    """A SQLite writer holds the lock: the extend hangs in its busy timeout, longer than the
    lease. The watchdog must lose the lease (and cancel the handler) on time anyway."""
    path = tmp_path / "tasks.db"
    events: list[al.Event] = []
    queue = al.Queue.connect(
        f"sqlite:///{path}?timeout=30",
        settings=al.QueueSettings(lease_for=1.5),
        on_event=events.append,
    )
    queue.enqueue("q", None, id="t1")
    started = threading.Event()
    lost_after: list[float] = []
    locked_at: list[float] = []

    def hold_the_write_lock() -> None:
        assert started.wait(10)
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        locked_at.append(time.monotonic())
        time.sleep(5.0)
        conn.execute("ROLLBACK")
        conn.close()

    if face == "sync":

        def handler(ctx: al.JobContext) -> al.JSON:
            if ctx.attempt > 1:
                return "run again"  # once the writer let go, the reaped task may run again
            started.set()
            if ctx.wait(15):
                lost_after.append(time.monotonic())
                return "zombie"
            return "never lost"

    else:

        async def handler(ctx: al.AsyncJobContext) -> al.JSON:  # type: ignore[misc]
            if ctx.attempt > 1:
                return "run again"  # once the writer let go, the reaped task may run again
            started.set()
            try:
                await asyncio.sleep(15)
            except asyncio.CancelledError:
                lost_after.append(time.monotonic())
                raise
            return "never lost"

    locker = threading.Thread(target=hold_the_write_lock)
    locker.start()
    _run(face, queue, handler)
    locker.join()
    assert lost_after, "the handler was never told its lease was lost"
    # Lost while the writer still held the lock, within about a lease of the last renewal.
    assert lost_after[0] - locked_at[0] < 4.0
    lost = [e for e in events if e.name == "lease_lost" and e.attempt == 1]
    assert lost
    assert "not renewed within its lease" in str(lost[0].fields["reason"])
    assert not [e for e in events if e.name == "completed" and e.attempt == 1]
    queue.close()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_progress_timeout_shorter_than_a_third_of_the_lease_keeps_a_progressing_task(
    face: str, sqlite_url: str
) -> None:
    events: list[al.Event] = []
    queue = al.Queue.connect(
        sqlite_url,
        settings=al.QueueSettings(lease_for=9.0, progress_timeout=1.5),
        on_event=events.append,
    )
    queue.enqueue("q", None, id="t1")

    if face == "sync":

        def handler(ctx: al.JobContext) -> al.JSON:
            for i in range(20):
                ctx.progress(i)
                time.sleep(0.2)
            return ctx.attempt

    else:

        async def handler(ctx: al.AsyncJobContext) -> al.JSON:  # type: ignore[misc]
            for i in range(20):
                await ctx.progress(i)
                await asyncio.sleep(0.2)
            return ctx.attempt

    _run(face, queue, handler)
    task = queue.get("t1")
    assert (task.state, task.attempt, task.reclaims, task.result) == ("done", 1, 0, 1)
    assert not [e for e in events if e.name == "lease_lost"]
    queue.close()


def test_a_heartbeat_that_cannot_keep_up_with_the_progress_timeout_is_refused() -> None:
    queue = al.Queue(MemoryBackend(), settings=al.QueueSettings(lease_for=30, progress_timeout=2))
    with pytest.raises(al.WorkerError, match="progress_timeout"):
        al.Worker(queue, "q", lambda ctx: None, settings=al.WorkerSettings(heartbeat_interval=5))
    with pytest.raises(al.WorkerError, match="lease_for"):
        al.Worker(
            al.Queue(MemoryBackend(), settings=al.QueueSettings(lease_for=4)),
            "q",
            lambda ctx: None,
            settings=al.WorkerSettings(heartbeat_interval=3),
        )


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_slow_event_callback_never_costs_a_lease(face: str, sqlite_url: str) -> None:
    lease = 1.0
    seen: list[str] = []

    def slow_callback(event: al.Event) -> None:
        seen.append(event.name)
        if event.name == "extended" and seen.count("extended") == 1:
            time.sleep(5 * lease)  # five leases long, on every thread it is called from
        if event.name == "claimed":
            raise RuntimeError("a callback that raises")

    queue = al.Queue.connect(
        sqlite_url, settings=al.QueueSettings(lease_for=lease), on_event=slow_callback
    )
    queue.enqueue("q", None, id="t1")

    if face == "sync":

        def handler(ctx: al.JobContext) -> al.JSON:
            time.sleep(3 * lease)
            return ctx.attempt

    else:

        async def handler(ctx: al.AsyncJobContext) -> al.JSON:  # type: ignore[misc]
            await asyncio.sleep(3 * lease)
            return ctx.attempt

    _run(face, queue, handler)
    task = queue.get("t1")
    assert (task.state, task.attempt, task.reclaims, task.result) == ("done", 1, 0, 1)
    assert "lease_lost" not in seen
    queue.close()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_progress_rides_out_a_short_outage(face: str, tmp_path: Path) -> None:
    """Another writer holds SQLite's lock for longer than the busy timeout: progress writes fail
    with BackendUnavailable meanwhile, and are retried within the lease."""
    path = tmp_path / "tasks.db"
    queue = al.Queue.connect(
        f"sqlite:///{path}?timeout=0.2", settings=al.QueueSettings(lease_for=6.0)
    )
    queue.enqueue("q", None, id="t1")
    locked = threading.Event()
    unlocked = threading.Event()

    def outage() -> None:
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        locked.set()
        time.sleep(1.0)
        conn.execute("ROLLBACK")
        conn.close()
        unlocked.set()

    if face == "sync":

        def handler(ctx: al.JobContext) -> al.JSON:
            threading.Thread(target=outage).start()
            assert locked.wait(5)
            ctx.progress("during the outage", checkpoint={"step": 1})
            return unlocked.is_set()

    else:

        async def handler(ctx: al.AsyncJobContext) -> al.JSON:  # type: ignore[misc]
            threading.Thread(target=outage).start()
            assert await asyncio.to_thread(locked.wait, 5)
            await ctx.progress("during the outage", checkpoint={"step": 1})
            return unlocked.is_set()

    _run(face, queue, handler)
    task = queue.get("t1")
    assert (task.state, task.attempt, task.result) == ("done", 1, True)
    assert task.progress == "during the outage"
    queue.close()


def test_a_worker_on_a_queue_never_used_warns_once_naming_the_known_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = al.Queue(MemoryBackend())
    queue.enqueue("emails", None)
    with caplog.at_level(logging.WARNING, logger="agentlease"):
        al.Worker(queue, "emials", lambda ctx: None).run(burst=True, handle_signals=False)  # type: ignore[arg-type,return-value]
    warnings = [r.getMessage() for r in caplog.records if "never been used" in r.getMessage()]
    assert len(warnings) == 1
    assert "'emials'" in warnings[0]
    assert "'emails'" in warnings[0]
    assert queue.stats("emails").counts == {"queued": 1}


@pytest.mark.parametrize("face", ["sync", "async"])
def test_an_unreachable_store_is_logged_and_ends_a_burst_run_with_an_error(
    face: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0?connect_timeout=0.2&socket_timeout=0.2"
    queue = al.Queue.connect(url, settings=al.QueueSettings(lease_for=1.0))
    started = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger="agentlease"),
        pytest.raises(al.BackendUnavailable),
    ):
        _run(face, queue, lambda ctx: None)
    assert time.monotonic() - started < 30
    messages = [r.getMessage() for r in caplog.records]
    outage = [m for m in messages if "store unreachable" in m]
    assert outage, messages
    assert str(port) in outage[0]
    assert "hunter2" not in "\n".join(messages)
    queue.close()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_permanent_store_error_stops_the_worker_at_once(
    face: str, served_url_postgres: str
) -> None:
    """The worker's schema is dropped under it: every claim is refused for good, so the worker
    must stop with that error instead of idling."""
    import psycopg

    from tests import _services

    queue = al.Queue.connect(served_url_postgres)
    queue.enqueue("q", None)
    schema = served_url_postgres.rsplit("schema=", 1)[1]
    with psycopg.connect(_services.POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    started = time.monotonic()
    try:
        with pytest.raises(al.SchemaNotMigrated):
            _run(face, queue, lambda ctx: None)
    finally:
        queue.close()
    assert time.monotonic() - started < 20


STUBBORN_WORKER = """
import logging, sys, time
import agentlease as al
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
q = al.Queue.connect(sys.argv[1], settings=al.QueueSettings(lease_for=float(sys.argv[3])))
def handler(ctx):
    print("started", ctx.attempt, flush=True)
    time.sleep(60)  # ignores its cancel token
    return "late"
al.Worker(q, "q", handler, settings=al.WorkerSettings(shutdown_grace=float(sys.argv[2]))).run()
print("exited", flush=True)
"""


def _start_stubborn(tmp_path: Path, url: str, grace: float, lease: float) -> subprocess.Popen[str]:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN_WORKER)
    proc = subprocess.Popen(
        [sys.executable, str(script), url, str(grace), str(lease)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().split() == ["started", "1"]
    return proc


def test_shutdown_keeps_the_lease_of_a_sync_handler_that_still_runs(
    sqlite_url: str, tmp_path: Path
) -> None:
    queue = al.Queue.connect(sqlite_url)
    queue.enqueue("q", None, id="t")
    proc = _start_stubborn(tmp_path, sqlite_url, grace=0.5, lease=30)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 10, "a stuck handler thread kept the process alive"
    assert proc.returncode == 0, err
    assert "exited" in out
    task = queue.get("t")
    # Its code may still have been running: never released for someone else to start.
    assert (task.state, task.attempt) == ("leased", 1)
    assert "SIGTERM" in err
    assert "still running at shutdown" in err
    assert "Traceback" not in err
    queue.close()


def test_a_second_signal_ends_the_process_within_a_second(sqlite_url: str, tmp_path: Path) -> None:
    queue = al.Queue.connect(sqlite_url)
    queue.enqueue("q", None, id="t")
    proc = _start_stubborn(tmp_path, sqlite_url, grace=60, lease=30)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert proc.poll() is None, "the grace period is a minute"
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 3.0
    assert proc.returncode == 0, err
    assert err.count("SIGINT") >= 2
    assert "Traceback" not in err
    assert queue.get("t").state == "leased"
    queue.close()


def test_a_cli_worker_waits_for_a_store_that_is_not_up_yet(tmp_path: Path) -> None:
    """A worker may start before its database: it waits (saying so) instead of exiting; with
    --burst it gives up after a lease, with status 2."""
    port = free_port()
    url = f"postgresql://root:hunter2@127.0.0.1:{port}/test?connect_timeout=0.5"
    started = time.monotonic()
    args = ["worker", "json:dumps", "--backend", url, "-q", "q", "--burst", "--lease-for", "3"]
    proc = subprocess.run(
        [sys.executable, "-m", "agentlease", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    assert took >= 3.0, "gave up before a lease had passed"
    assert "store unreachable" in proc.stderr
    assert "hunter2" not in proc.stderr
