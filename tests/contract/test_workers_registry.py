"""Live workers on every backend of the ``store`` fixture: an entry is listed while its TTL (on
the store's clock) runs, refreshed by registering again, gone once it lapses or is removed; a
lapsed entry is collected by the next registration; each lease records the worker that claimed
it, and ``inspect`` shows it."""

from __future__ import annotations

import os
import socket
import time

import orjson
import pytest

import agentlease as al
from agentlease.errors import InvalidDuration, InvalidInput
from tests.conftest import Store

Q = "reg"
LIVE = 30.0
SHORT = 0.4
PAST = 0.6


def test_register_list_refresh_lapse_and_unregister(store: Store) -> None:
    q = store.queue()
    assert q.workers() == []
    info = {"host": "h1", "pid": 11, "queues": [Q], "concurrency": 2, "started": 1.0, "tasks": []}
    before = q.backend.now()
    expires = q.register_worker("h1:11:a", info, ttl=LIVE)
    assert before + LIVE - 1 <= expires <= q.backend.now() + LIVE
    q.register_worker("h2:22:b", {"host": "h2", "pid": 22}, ttl=SHORT)
    listed = q.workers()
    assert [w.id for w in listed] == ["h1:11:a", "h2:22:b"]
    first = listed[0]
    assert orjson.loads(first.info_json) == info
    assert (first.host, first.pid, first.queues, first.concurrency) == ("h1", 11, [Q], 2)
    assert first.tasks == []
    assert first.started == 1.0
    assert first.beat_at <= first.expires_at == expires

    # A new registration replaces what the entry says and pushes its expiry on.
    again = q.register_worker("h1:11:a", {**info, "tasks": ["t1"]}, ttl=LIVE)
    assert again >= expires
    assert q.workers()[0].tasks == ["t1"]

    time.sleep(PAST)  # h2's TTL lapses: no longer listed
    assert [w.id for w in q.workers()] == ["h1:11:a"]
    assert q.unregister_worker("h1:11:a") is True
    assert q.unregister_worker("h1:11:a") is False
    assert q.workers() == []


def test_a_registration_collects_lapsed_entries(store: Store) -> None:
    q = store.queue()
    for i in range(3):
        q.register_worker(f"gone:{i}", {"pid": i}, ttl=SHORT)
    time.sleep(PAST)
    q.register_worker("live", {"pid": 9}, ttl=LIVE)
    assert [w.id for w in q.workers()] == ["live"]
    # Collected, not only hidden: unregistering a collected entry finds nothing.
    assert [q.unregister_worker(f"gone:{i}") for i in range(3)] == [False, False, False]


def test_bad_worker_input_is_refused_and_changes_nothing(store: Store) -> None:
    q = store.queue()
    with pytest.raises(InvalidInput):
        q.register_worker("", {}, ttl=LIVE)
    with pytest.raises(InvalidInput):
        q.register_worker("x" * 201, {}, ttl=LIVE)
    with pytest.raises(InvalidDuration):
        q.register_worker("w", {}, ttl=0)
    with pytest.raises(InvalidInput):
        q.unregister_worker(None)  # type: ignore[arg-type]
    q.enqueue(Q, 1)
    with pytest.raises(InvalidInput):
        q.claim(Q, holder="")
    assert q.workers() == []
    assert q.stats(Q).counts == {"queued": 1}


def test_inspect_shows_the_holder_of_each_lease(store: Store) -> None:
    q = store.queue()
    q.enqueue_many(Q, [1, 2, 3])
    (a,) = q.claim(Q, 1, lease_for=LIVE, holder="host-a:1:x")
    (b,) = q.claim(Q, 1, lease_for=LIVE + 5, holder="host-b:2:y")
    (c,) = q.claim(Q, 1, lease_for=LIVE + 10)
    holders = {info.task_id: info.holder for info in q.inspect(Q)}
    assert holders == {a.task_id: "host-a:1:x", b.task_id: "host-b:2:y", c.task_id: None}


async def test_async_face_registers_and_records_holders(store: Store) -> None:
    q = store.aqueue()
    try:
        await q.register_worker("async:1:z", {"host": "a", "pid": 1}, ttl=LIVE)
        assert [w.id for w in await q.workers()] == ["async:1:z"]
        await q.enqueue(Q, {"n": 1}, id="t-async")
        (job,) = await q.claim(Q, holder="async:1:z")
        (info,) = await q.inspect(Q)
        assert (info.task_id, info.holder) == ("t-async", "async:1:z")
        await q.complete(job.lease, None)
        assert await q.unregister_worker("async:1:z") is True
        assert await q.workers() == []
    finally:
        await q.close()


def test_a_worker_is_listed_while_it_runs_and_names_itself_on_its_claims(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {"n": 1}, id="seen")
    listed: list[list[str]] = []

    def handler(ctx: al.JobContext) -> al.JSON:
        listed.append([w.id for w in q.workers()])
        return None

    worker = al.Worker(q, Q, handler, settings=al.WorkerSettings(poll_interval=0.05))
    assert worker.run(burst=True, handle_signals=False) == 1
    assert listed == [[worker.id]]
    host, pid, _ = worker.id.rsplit(":", 2)
    assert (host, int(pid)) == (socket.gethostname(), os.getpid())
    assert q.workers() == []  # removed at its stop
    assert [(a.worker, a.outcome) for a in q.get("seen").attempts] == [(worker.id, "done")]


async def test_an_async_worker_registers_with_its_queue_and_concurrency(store: Store) -> None:
    q = store.aqueue()
    try:
        await q.enqueue(Q, None, id="async-seen")
        entries: list[al.WorkerInfo] = []

        async def handler(ctx: al.AsyncJobContext) -> al.JSON:
            entries.extend(await q.workers())
            return None

        settings = al.WorkerSettings(concurrency=3, poll_interval=0.05)
        worker = al.AsyncWorker(q, Q, handler, settings=settings)
        await worker.run(burst=True, handle_signals=False)
        (entry,) = entries
        assert (entry.id, entry.queues, entry.concurrency) == (worker.id, [Q], 3)
        assert entry.pid == os.getpid()
        assert await q.workers() == []
        (attempt,) = (await q.get("async-seen")).attempts
        assert (attempt.worker, attempt.outcome) == (worker.id, "done")
    finally:
        await q.close()
