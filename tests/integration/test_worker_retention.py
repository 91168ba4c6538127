"""Workers purge on a timer: done and dead tasks past their queue's retention, idempotency keys
past their window and expired budgets and breakers go, with nobody calling purge by hand; what
is younger stays. The memory store runs on a clock the test moves (days pass in an instant);
the SQL store runs on its real clock, with the queue's retention at its floor."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import agentlease as al
from agentlease._async.queue import AsyncQueue
from agentlease._janitor import Janitor
from agentlease.backends.memory import MemoryBackend
from agentlease.errors import UnknownTask

DAY = 86_400.0
FAST = al.WorkerSettings(purge_every=0.05, poll_interval=0.05, retry=al.RetryPolicy(max_failures=1))


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    give_up = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < give_up, "timed out"
        time.sleep(0.02)


def handler(ctx: al.JobContext) -> object:
    if ctx.payload == "poison":
        raise RuntimeError("poison")  # never retried (max_failures=1): dead at once
    return ctx.payload


def test_a_worker_purges_what_outlived_its_retention(tmp_path: Path) -> None:
    clock = Clock()
    backend = MemoryBackend(clock=clock)
    settings = al.QueueSettings(done_retention=DAY, dead_retention=3 * DAY)
    queue = al.Queue(backend, settings=settings)
    for i in range(5):
        queue.enqueue("jobs", i, dedup_key=f"k{i}")
    queue.enqueue("jobs", "poison")
    hold = backend.reserve_key("key", "fp", "holder", 30, 60)
    assert isinstance(hold, al.KeyRecord) is False
    backend.complete_key(hold, b"1", 60)  # type: ignore[arg-type]
    backend.retry_budget("budget", 1, False, 0.1, 1, 60)
    backend.breaker_record("breaker", 0, False, 5, 10, 60)
    worker = al.Worker(queue, "jobs", handler, settings=FAST)
    runner = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    runner.start()
    try:
        until(lambda: queue.stats("jobs").counts.get("done") == 5)
        until(lambda: queue.stats("jobs").counts.get("dead") == 1)
        assert backend.get_key("key") is not None
        clock.now += 2 * DAY  # past the done retention and the key's window, not the dead one
        until(lambda: queue.stats("jobs").counts.get("done") is None)
        until(lambda: not backend._keys._keys)
        until(lambda: not backend._state.budgets and not backend._state.breakers)
        assert queue.stats("jobs").counts.get("dead") == 1
        assert queue.enqueue("jobs", "again", dedup_key="k0").created  # the dedup key is free
        clock.now += 2 * DAY
        until(lambda: queue.stats("jobs").counts.get("dead") is None)
        until(lambda: queue.stats("jobs").counts.get("done") == 1)  # "again" ran, and is young
    finally:
        worker.stop()
        runner.join(20)
    assert not runner.is_alive()


def test_purge_every_none_purges_nothing() -> None:
    clock = Clock()
    backend = MemoryBackend(clock=clock)
    queue = al.Queue(backend)
    queue.enqueue("jobs", 1)
    settings = al.WorkerSettings(purge_every=None, poll_interval=0.05)
    al.Worker(queue, "jobs", handler, settings=settings).run(burst=True, handle_signals=False)
    clock.now += 365 * DAY
    al.Worker(queue, "jobs", handler, settings=settings).run(burst=True, handle_signals=False)
    assert queue.stats("jobs").counts.get("done") == 1


async def test_a_janitor_round_works_off_a_backlog_in_bounded_batches(tmp_path: Path) -> None:
    import random

    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    queue = AsyncQueue.connect(url)
    try:
        ids = []
        for i in range(25):
            await queue.enqueue("jobs", i)
        jobs = await queue.claim("jobs", 25, lease_for=30)
        for job in jobs:
            await queue.complete(job.lease, None)
            ids.append(job.task_id)
        janitor = Janitor(queue, "jobs", 60, 2, random.Random(1))
        assert await janitor.round() == {
            "done": 0,
            "dead": 0,
            "cancelled": 0,
            "keys": 0,
            "locks": 0,
            "state": 0,
        }
        # A retention at its floor would take a minute: the round's batches are what is tested.
        queue.settings = al.QueueSettings(done_retention=60)
        janitor.queue = _Aged(queue)  # type: ignore[assignment]
        counts = await janitor.round()
        assert counts["done"] == 20  # ten full batches of two, then the round ends
        assert (await janitor.round())["done"] == 5
        for task_id in ids:
            try:
                await queue.get(task_id)
            except UnknownTask:
                continue
            raise AssertionError(f"{task_id} was not purged")
    finally:
        await queue.close()


class _Aged:
    """The queue, with every purge asked for tasks of any age (older_than=0)."""

    def __init__(self, queue: AsyncQueue) -> None:
        self._queue = queue
        self.backend = queue.backend

    async def purge(self, name: str, *, state: al.TaskState, limit: int) -> int:
        return await self._queue.purge(name, state=state, older_than=0, limit=limit)  # type: ignore[arg-type]
