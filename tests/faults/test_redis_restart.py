"""Redis faults: the server killed and restarted under real worker processes, lost replies,
crashes between the two steps of an enqueue, unreachable hosts, refused input.

Tests that break a server start their own (``tests._private_redis``: a free port, a temporary
directory, ``appendonly yes`` and ``appendfsync always``); the shared Redis on 6379 is only used,
under a fresh prefix, by tests that do not break it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from redis import exceptions as rx

import agentlease as al
from agentlease import BackendUnavailable, InvalidName, LeaseLost, PayloadTooLarge, QueueSettings
from agentlease._demo.ledger import read_ledgers
from agentlease._demo.scenario import DemoConfig, run_demo
from tests._private_redis import free_port

DURABLE = {"appendonly": "yes", "appendfsync": "always"}
SEEDS = list(range(4)) if os.environ.get("AGENTLEASE_DEEP") == "1" else [0]
FAST = 2.5  # seconds: the longest a call may take to fail while the server is down

_WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import agentlease as al
    from agentlease._demo.ledger import Ledger

    url, queue, ledger_path = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    ledger = Ledger(ledger_path)

    def on_event(event):
        ledger.write(event.name, task=event.task_id, attempt=event.attempt, t=time.time())

    def handler(ctx):
        ledger.write("ran", task=ctx.task_id, attempt=ctx.attempt, t=time.time())
        try:
            ctx.progress({"step": 1})
        except al.AgentLeaseError:
            pass  # the store is down (or the lease lost): the worker's writes will say so
        except Exception as exc:
            ledger.write("untyped", error=repr(exc), t=time.time())
            raise
        time.sleep(ctx.payload["work"])
        return {"attempt": ctx.attempt}

    client = al.Queue.connect(url, settings=al.QueueSettings(lease_for=3.0), on_event=on_event)
    worker = al.Worker(
        client,
        queue,
        handler,
        settings=al.WorkerSettings(concurrency=2, poll_interval=0.05, shutdown_grace=5.0),
    )
    ledger.write("ready", t=time.time())
    worker.run()
    ledger.write("exit", t=time.time())
    client.close()
    """
)

# The same worker on the asyncio face: an AsyncWorker, an async handler, AsyncQueue's writes.
_ASYNC_WORKER = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    import agentlease as al
    from agentlease._demo.ledger import Ledger

    url, queue, ledger_path = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    ledger = Ledger(ledger_path)

    def on_event(event):
        ledger.write(event.name, task=event.task_id, attempt=event.attempt, t=time.time())

    async def handler(ctx):
        ledger.write("ran", task=ctx.task_id, attempt=ctx.attempt, t=time.time())
        try:
            await ctx.progress({"step": 1})
        except al.AgentLeaseError:
            pass
        except Exception as exc:
            ledger.write("untyped", error=repr(exc), t=time.time())
            raise
        await asyncio.sleep(ctx.payload["work"])
        return {"attempt": ctx.attempt}

    async def main():
        client = al.AsyncQueue.connect(
            url, settings=al.QueueSettings(lease_for=3.0), on_event=on_event
        )
        worker = al.AsyncWorker(
            client,
            queue,
            handler,
            settings=al.WorkerSettings(concurrency=4, poll_interval=0.05, shutdown_grace=5.0),
        )
        ledger.write("ready", t=time.time())
        await worker.run()
        ledger.write("exit", t=time.time())
        await client.close()

    asyncio.run(main())
    """
)
WORKERS = {"sync": _WORKER, "async": _ASYNC_WORKER}


def _timed(call: Callable[[], object]) -> tuple[BaseException | None, float]:
    start = time.monotonic()
    try:
        call()
    except BaseException as exc:
        return exc, time.monotonic() - start
    return None, time.monotonic() - start


def _wait_all_done(q: al.Queue, queue: str, at_least: int, timeout: float) -> al.QueueStats:
    deadline = time.monotonic() + timeout
    while True:
        try:
            stats = q.stats(queue)
            counts = {s: n for s, n in stats.counts.items() if n}
            if set(counts) == {"done"} and counts["done"] >= at_least:
                return stats
        except BackendUnavailable:
            pass
        assert time.monotonic() < deadline, f"not all done after {timeout}s: {counts}"
        time.sleep(0.1)


# -- the server dies under running workers --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("face", ["sync", "async"])
def test_workers_ride_through_a_redis_restart(private_redis, tmp_path: Path, face: str) -> None:
    server = private_redis(**DURABLE)
    url = f"{server.url}?prefix=restart&connect_timeout=1&socket_timeout=2"
    queue = "jobs"
    producer = al.Queue.connect(url)
    acked = [e.task_id for e in producer.enqueue_many(queue, [{"work": 0.03}] * 120)]
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKERS[face], url, queue, str(ledgers / f"w{k}.jsonl")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(3)
    ]
    stop = threading.Event()
    refused: list[tuple[BaseException, float]] = []

    def produce() -> None:  # keeps enqueueing through the outage; only acknowledged ids count
        client = al.Queue.connect(url)
        while not stop.is_set():
            exc, took = _timed(lambda: acked.append(client.enqueue(queue, {"work": 0.01}).task_id))
            if exc is not None:
                refused.append((exc, took))
            time.sleep(0.01)
        client.close()

    thread = threading.Thread(target=produce)
    try:
        deadline = time.monotonic() + 30
        while producer.stats(queue).counts.get("done", 0) < 30:
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.02)
        thread.start()
        time.sleep(0.1)

        server.kill()  # SIGKILL, mid-run: leases held, completions in flight
        killed_at = time.time()
        for name, call in {
            "stats": lambda: producer.stats(queue),
            "claim": lambda: producer.claim(queue),
            "enqueue": lambda: producer.enqueue(queue, {"work": 0}),
            "get": lambda: producer.get(acked[0]),
        }.items():
            exc, took = _timed(call)
            assert isinstance(exc, BackendUnavailable), f"{name} while down raised {exc!r}"
            assert isinstance(exc.__cause__, rx.RedisError), name
            assert took < FAST, f"{name} took {took:.2f}s to fail while the server was down"
        time.sleep(1.5)  # longer than a call's retries: the workers see the outage
        server.start()  # same directory and port: the append-only file is replayed
        restarted_at = time.time()
        time.sleep(0.3)
        stop.set()
        thread.join(timeout=30)

        final = _wait_all_done(producer, queue, len(acked), timeout=60)
        alive = [w.poll() is None for w in workers]
    finally:
        stop.set()
        for w in workers:
            w.terminate()
        errors = [w.communicate(timeout=30)[1] for w in workers]
        producer.close()

    assert all(alive), f"a worker died: {errors}"
    assert not [e for e in errors if "redis.exceptions" in e], errors
    assert refused, "the producer never saw the outage"
    assert all(isinstance(e, BackendUnavailable) and t < FAST for e, t in refused), refused[:3]
    # Every acknowledged task was completed; an enqueue refused during the outage may or may not
    # have been applied, and if it was, its task was completed too.
    tasks = {task_id: producer_get(url, task_id) for task_id in acked}
    assert all(t.state == "done" for t in tasks.values())
    assert final.counts["done"] >= len(set(acked))
    records = list(read_ledgers(ledgers))
    assert [r for r in records if r["kind"] == "untyped"] == []
    completed = Counter(r["task"] for r in records if r["kind"] == "completed")
    twice = {t: n for t, n in completed.items() if n > 1}
    assert twice == {}, f"completed more than once: {twice}"
    for r in records:
        if r["kind"] == "completed":
            task = tasks.get(r["task"]) or producer_get(url, r["task"])
            assert task.attempt == r["attempt"], "the accepted result is not the last lease's"
    for task in tasks.values():
        assert task.result == {"attempt": task.attempt}
    assert any(r["t"] > restarted_at for r in records if r["kind"] == "completed")
    assert any(killed_at - 2 < r["t"] < killed_at for r in records if r["kind"] == "completed")


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_killed_and_frozen_workers_on_redis(private_redis, seed: int) -> None:
    """The demo's faults on Redis: SIGKILLed workers lose nothing, a frozen worker's writes are
    all refused once its lease is reaped, and nothing is completed twice."""
    server = private_redis(**DURABLE)
    config = DemoConfig(
        url=f"{server.url}?prefix=demo", workers=6, tasks=40, kill=2, freeze=1, seed=seed
    )
    report = run_demo(config)
    f = report.figures
    assert report.ok, [c for c in report.checks if not c.ok]
    assert (f["completed"], f["lost"], f["duplicate_completions"]) == (40, 0, 0)
    assert f["zombie_writes_accepted"] == 0
    assert f["reaped"] >= 2, "each killed worker's task was reaped"


def producer_get(url: str, task_id: str) -> al.Task:
    q = al.Queue.connect(url)
    try:
        return q.get(task_id)
    finally:
        q.close()


# -- lost replies and interrupted enqueues ------------------------------------------------------


def _apply_then_drop(backend: Any, skip: int = 0) -> list[str]:
    """Make the call (or pipeline) after the next ``skip`` reach the store and lose its reply."""
    link = backend._link
    execute, pipeline = link._execute, link._pipeline
    dropped: list[str] = []
    seen = [0]

    def lose(reply: Any, what: str) -> Any:
        seen[0] += 1
        if not dropped and seen[0] > skip:
            dropped.append(what)
            raise rx.ConnectionError("Connection closed by server.")
        return reply

    link._execute = lambda *args: lose(execute(*args), str(args[0]))
    link._pipeline = lambda calls: lose(pipeline(calls), "pipeline")
    return dropped


def test_a_write_whose_reply_was_lost_is_sent_again_safely(served_url_redis: str) -> None:
    q = al.Queue.connect(served_url_redis)
    try:
        q.enqueue_many("jobs", ["a", "b", "c"])
        a, b, c = q.claim("jobs", 3, lease_for=30)
        dropped = _apply_then_drop(q.backend)
        q.complete(a.lease, "done once")  # applied, reply lost, sent again: answered as applied
        assert len(dropped) == 1
        assert q.get(a.task_id).result == "done once"
        with pytest.raises(LeaseLost):
            q.complete(a.lease, "again")  # a new request is a stale write, as always

        _apply_then_drop(q.backend)
        task = q.fail(b.lease, "boom", retry_in=None)
        assert (task.state, task.failures) == ("dead", 1)
        _apply_then_drop(q.backend)
        q.release(c.lease, front=True)
        assert q.get(c.task_id).state == "queued"

        # The ids are reserved, the script creates the task, and its reply is lost.
        dropped = _apply_then_drop(q.backend, skip=1)
        (e,) = q.enqueue_many("jobs", [al.TaskSpec(payload="new", id="fresh")])
        assert dropped == ["pipeline"]
        assert e == al.Enqueued("fresh", True), "a retried enqueue reports what it created"

        # A claim is not sent again: its tasks stay leased to nobody until the reaper takes them.
        _apply_then_drop(q.backend)
        with pytest.raises(BackendUnavailable):
            q.claim("jobs", 5, lease_for=0.3)
        assert q.stats("jobs").counts.get("leased") == 2
        time.sleep(0.5)
        assert sorted(r.task_id for r in q.reap("jobs")) == sorted([c.task_id, "fresh"])
    finally:
        q.close()


def test_an_enqueue_interrupted_after_reserving_its_ids_is_completed_by_a_retry(
    served_url_redis: str,
) -> None:
    prefix = served_url_redis.rsplit("prefix=", 1)[1]
    raw = redis.Redis.from_url(served_url_redis.split("?", 1)[0])
    q = al.Queue.connect(served_url_redis)
    try:
        # As if an enqueue had died between its two steps: ids reserved, tasks never written.
        raw.hset(f"{prefix}:ids", mapping={"job-1": "jobs", "job-2": "other"})
        with pytest.raises(al.UnknownTask):
            q.get("job-1")
        assert q.enqueue("jobs", "x", id="job-1") == al.Enqueued("job-1", True)
        assert q.get("job-1").payload == "x"
        # The same id to another queue: taken (it would be created by a retry to its queue).
        assert q.enqueue("jobs", "y", id="job-2") == al.Enqueued("job-2", False)
        assert q.enqueue("other", "y", id="job-2") == al.Enqueued("job-2", True)
        assert q.get("job-2").queue == "other"
        # A reservation for a task refused by its dedup key is dropped again.
        q.enqueue("jobs", "z", dedup_key="k")
        assert not q.enqueue("jobs", "w", id="job-3", dedup_key="k").created
        assert raw.hget(f"{prefix}:ids", "job-3") is None
        assert q.enqueue("other", "w", id="job-3").created
    finally:
        q.close()
        raw.close()


# -- unreachable hosts, refused input (credentials: test_refusals.py) ---------------------------


def _fails_fast(url: str, match: str) -> BackendUnavailable:
    q = al.Queue.connect(url)
    try:
        exc, took = _timed(lambda: q.stats("jobs"))
    finally:
        q.close()
    assert isinstance(exc, BackendUnavailable), f"{url}: {exc!r}"
    assert match in str(exc), str(exc)
    assert isinstance(exc.__cause__, rx.RedisError)
    assert took < FAST, f"{url} took {took:.2f}s to fail"
    return exc


def test_unreachable_hosts_fail_fast() -> None:
    _fails_fast(f"redis://127.0.0.1:{free_port()}/0", "unavailable")  # nothing listens
    with contextlib.ExitStack() as stack:
        # A host that never completes the handshake: a listener whose accept queue is full drops
        # further SYNs, as a firewall would. The bounded connect timeout fails the call.
        full = stack.enter_context(socket.socket())
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        for _ in range(3):
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            filler.connect_ex(full.getsockname())
        port = full.getsockname()[1]
        _fails_fast(f"redis://127.0.0.1:{port}/0?connect_timeout=0.3", "unavailable")
        # A host that accepts and never answers: the socket timeout fails the call.
        mute = stack.enter_context(socket.socket())
        mute.bind(("127.0.0.1", 0))
        mute.listen(16)
        port = mute.getsockname()[1]
        _fails_fast(f"redis://127.0.0.1:{port}/0?socket_timeout=0.3", "unavailable")


BAD_NAMES = ["", "a b", "{x}", "x" * 129, "-x", "a\nb", "é"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_odd_queue_names_are_refused_before_any_io(name: str) -> None:
    q = al.Queue.connect(f"redis://127.0.0.1:{free_port()}/0")  # any I/O would fail otherwise
    try:
        for call in (
            lambda: q.enqueue(name, 1),
            lambda: q.enqueue_many(name, [1]),
            lambda: q.claim(name),
            lambda: q.reap(name),
            lambda: q.stats(name),
            lambda: q.inspect(name),
            lambda: q.dead(name),
            lambda: q.requeue_dead(name),
        ):
            with pytest.raises(InvalidName):
                call()
    finally:
        q.close()


def test_a_payload_over_the_limit_writes_nothing(private_redis) -> None:
    server = private_redis()
    raw = redis.Redis(port=server.port)
    q = al.Queue.connect(f"{server.url}?prefix=big")
    try:
        huge = "x" * (2 * 1024 * 1024)
        with pytest.raises(PayloadTooLarge) as info:
            q.enqueue("jobs", huge)
        assert info.value.limit == 1_048_576
        with pytest.raises(PayloadTooLarge):
            q.enqueue_many("jobs", ["fine", huge, "fine too"])
        assert raw.dbsize() == 0, "a refused enqueue wrote something"
        assert q.queues() == []

        small = al.Queue.connect(
            f"{server.url}?prefix=big", settings=QueueSettings(max_payload_bytes=64)
        )
        try:
            task_id = small.enqueue("jobs", "ok").task_id
            (job,) = small.claim("jobs")
            before = small.get(task_id)
            with pytest.raises(PayloadTooLarge):
                small.complete(job.lease, "y" * 100)
            with pytest.raises(PayloadTooLarge):
                small.progress(job.lease, "p", checkpoint="c" * 100)
            assert small.get(task_id) == before
        finally:
            small.close()
    finally:
        q.close()
        raw.close()


# -- a server that cannot run calls for a while ------------------------------------------------


def test_a_server_busy_with_a_long_script_is_unavailable_not_broken(private_redis) -> None:
    """BUSY (another client's script has run past busy-reply-threshold) means the call was not
    run: the caller gets BackendUnavailable, an outage to wait out, not a BackendError, which
    says the call itself failed."""
    server = private_redis(**{"busy-reply-threshold": "50"})
    q = al.Queue.connect(f"{server.url}?prefix=busy&socket_timeout=5")
    q.enqueue("jobs", 1)
    spinner = redis.Redis(port=server.port)
    admin = redis.Redis(port=server.port)

    def spin() -> None:
        with contextlib.suppress(rx.RedisError):  # ended by SCRIPT KILL
            spinner.eval("while true do end", 0)

    loop = threading.Thread(target=spin, daemon=True)
    try:
        loop.start()
        deadline = time.monotonic() + 10
        while True:  # until the server answers BUSY
            try:
                admin.ping()
            except rx.ResponseError:
                break
            assert time.monotonic() < deadline, "the script never made the server busy"
            time.sleep(0.02)
        for call in (lambda: q.stats("jobs"), lambda: q.claim("jobs"), lambda: q.enqueue("j", 1)):
            exc, _ = _timed(call)
            assert isinstance(exc, BackendUnavailable), repr(exc)
            assert "BUSY" in str(exc)
    finally:
        with contextlib.suppress(rx.RedisError):
            admin.script_kill()
        loop.join(timeout=10)
        spinner.close()
        admin.close()
    assert q.stats("jobs").counts == {"queued": 1}, "nothing ran while the server was busy"
    q.close()
