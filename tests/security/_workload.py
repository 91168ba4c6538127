"""Every primitive a worker, an idempotent tool and a guard send, on one store: the workload that
tests/security/test_rights.py runs under exactly the rights ``agentlease rights`` prints.

Each store primitive is called at least once (retention's ``purge_tasks`` and ``purge_state``
too, as a worker's janitor sends them), through the public API where it reaches it
(``Queue``, ``Idempotency``, ``SharedState``) and through the backend where only a background
thread would (renewals, the sweep); a failure raises whatever the store's refusal became.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import agentlease as al

__all__ = ["QUEUE", "exercise", "exercise_async"]

QUEUE = "rights"


def _queue(url: str) -> None:
    name = f"{QUEUE}-{uuid.uuid4().hex[:8]}"
    with al.Queue.connect(url, settings=al.QueueSettings(lease_for=5)) as queue:
        queue.enqueue(name, {"n": 1}, dedup_key="one")
        assert not queue.enqueue(name, {"n": 1}, dedup_key="one").created
        queue.enqueue(name, {"n": 2}, delay=60)
        queue.enqueue(name, {"n": 3}, partition="account:1")
        queue.enqueue(name, {"n": 4}, partition="account:1")  # parked behind n=3
        queue.enqueue_many(name, [{"n": 5}, {"n": 6}, {"n": 7}])
        jobs = queue.claim(name, n=5, holder="rights:1:abc")
        assert jobs, "nothing claimed"
        assert {info.holder for info in queue.inspect(name)} == {"rights:1:abc"}
        queue.extend([job.lease for job in jobs])
        queue.progress(jobs[0].lease, {"step": 1}, checkpoint={"at": 1})
        queue.complete(jobs[0].lease, {"ok": True})
        queue.complete_many([(job.lease, None) for job in jobs[1:3]])
        queue.release(jobs[3].lease)
        queue.fail(jobs[4].lease, "boom", retry_in=None)  # dead at once
        assert queue.requeue_dead(name) == 1
        (job,) = queue.claim(name, n=1)
        queue.fail(job.lease, "again", retry_in=0)  # retried
        assert [a.outcome for a in queue.get(job.task_id).attempts][-1] == "failed"
        queue.stats(name)
        queue.inspect(name)
        queue.dead(name)
        queue.queues()
        queue.reap(name)
        # A lease that runs out and is reaped by the next claim (and by reap).
        short = al.QueueSettings(lease_for=0.2)
        with al.Queue.connect(url, settings=short) as fast:
            fast.claim(name, n=10)
            time.sleep(0.3)
            fast.reap(name)
            fast.complete_encoded_and_claim([], name, 2)
        queue.backend.wait_for_work(name, 0.05)
        # Retention: the first purge of a queue's done tasks also indexes older ones (Redis).
        (dead,) = queue.claim(name, n=1)
        queue.fail(dead.lease, "for good", retry_in=None)
        assert queue.purge(name, older_than=0) >= 1
        assert queue.purge(name, state="dead", older_than=0) == 1
        assert queue.enqueue(name, {"n": 1}, dedup_key="one").created  # its key was freed
        for state in ("queued", "leased", "done", "dead"):
            _, cursor = queue.tasks(name, state=state, limit=1)  # type: ignore[arg-type]
            if cursor is not None:
                queue.tasks(name, state=state, limit=1, cursor=cursor)  # type: ignore[arg-type]
        # A scheduler's pass: the store's clock, then an enqueue with an id and a dedup key.
        hourly = al.Schedule("rights", name, every=3600, grace=3600)
        (tick,) = al.Scheduler(queue, [hourly]).run_once()
        assert tick.created
        _workers(queue)
        _cancel(queue, name)


def _workers(queue: al.Queue) -> None:
    """The live-worker registry: register (collecting a lapsed entry), list, unregister."""
    gone, me = f"gone:{uuid.uuid4().hex}", f"rights:{uuid.uuid4().hex}"
    queue.register_worker(gone, {"pid": 1}, ttl=0.05)
    time.sleep(0.1)
    queue.register_worker(me, {"pid": 2, "queues": [QUEUE]}, ttl=30)
    assert me in [w.id for w in queue.workers()]
    assert queue.unregister_worker(me)


def _cancel(queue: al.Queue, name: str) -> None:
    """Cancel a waiting task and a leased one (told at its extend, refused at its write), then
    delete the queue: refused while a lease lives, then in batches, then forced."""
    gone = f"{name}-cancel"
    queue.enqueue_many(gone, [{"n": i} for i in range(5)])
    waiting = queue.enqueue(gone, {"n": 5}, delay=60).task_id
    assert queue.cancel(waiting, "not needed").outcome == "cancelled"
    (job,) = queue.claim(gone, n=1)
    assert queue.cancel(job.task_id, "stop").outcome == "requested"
    try:
        queue.progress(job.lease, {"step": 1})
    except al.TaskCancelled:
        pass
    else:
        raise AssertionError("a cancelled lease's write was accepted")
    assert queue.extend([job.lease]) == [None]
    assert queue.get(job.task_id).state == "cancelled"
    assert queue.cancel(job.task_id, "again").outcome == "finished"
    (held,) = queue.claim(gone, n=1)
    try:
        queue.delete_queue(gone)
    except al.QueueInUse:
        pass
    else:
        raise AssertionError("a queue with a live lease was deleted")
    queue.complete(held.lease, None)
    assert queue.delete_queue(gone, batch=2) == 6
    forced = f"{name}-forced"
    queue.enqueue(forced, {})
    queue.claim(forced, n=1)
    assert queue.delete_queue(forced, force=True) == 1


def _keys(url: str) -> None:
    settings = al.IdempotencySettings(hold_for=5)
    with al.Idempotency.connect(url, settings=settings) as keys:
        task = uuid.uuid4().hex
        with keys.begin("send", {"to": "ada"}, step="s", task_id=task) as act:
            assert not act.replayed
            act.check()
            assert act.hold is not None
            keys.backend.extend_key(act.hold, 5)  # what the renewal thread sends
            act.complete({"id": 1})
        again = keys.begin("send", {"to": "ada"}, step="s", task_id=task)
        assert again.replayed
        assert again.result == {"id": 1}
        failed = keys.begin("send", {"to": "bob"}, step="s", task_id=task)
        failed.fail(ValueError("bounced"))
        released = keys.begin("send", {"to": "eve"}, step="s", task_id=task)
        released.release()
        keys.get(released.key)
        keys.purge()


def _state(url: str) -> None:
    with al.SharedState.connect(url) as state:
        key = f"pr:{uuid.uuid4().hex}"
        version = state.compare_and_set(key, 0, {"status": "draft", "notes": []})
        state.set_field(key, "status", "review")
        state.update(key, lambda pr: {**pr, "notes": ["lgtm"]})
        state.delete(key, state.get(key).version)
        assert version == 1
        counter = f"seats:{uuid.uuid4().hex}"
        state.add(counter, 3)
        state.reserve(counter, 1, limit=10)
        state.take(counter, 1, minimum=0)
        state.release(counter, 1)
        state.counter(counter)
        with state.hold(counter, 2, limit=10, ttl=5) as held:
            state.backend.extend_hold(counter, held.token, 5)  # what its renewals send
            held.commit()
        with state.hold(counter, 1, limit=10, ttl=5):
            pass  # given back
        with state.hold(counter, 2, limit=10, ttl=5) as settled:
            settled.commit(units=1)
        _budgets(state.backend)
        names = [f"lock:{uuid.uuid4().hex}", f"lock:{uuid.uuid4().hex}"]
        with state.locks(names[:1], timeout=2, ttl=5):  # a set of one
            pass
        with state.locks(names, timeout=2, ttl=5) as locks:
            state.backend.extend_locks(locks.names, locks.owner, 5)  # what its renewals send
            state.lock_holders(names)
        state.sweep_locks()


def _budgets(backend: al.Backend) -> None:
    """Retry budgets and circuit breakers, through the backend (the classes above them send
    these): every path that writes, and the reads."""
    budget = f"budget:{uuid.uuid4().hex}"
    assert backend.retry_budget(budget, 5, True, 0.1, 1, 60).granted
    backend.retry_budget(budget, 0, False, 0.1, 1, 60)
    breaker = f"dep:{uuid.uuid4().hex}"
    backend.breaker_admit(breaker, 5, 60)
    backend.breaker_record(breaker, 0, False, 2, 60, 60)
    backend.breaker_record(breaker, 0, True, 2, 60, 60)  # resets the failure
    assert backend.breaker_record(breaker, 0, False, 1, 0.05, 60).state == "open"
    time.sleep(0.1)
    trial = backend.breaker_admit(breaker, 5, 60)
    assert trial.trial
    assert backend.breaker_record(breaker, trial.fence, True, 1, 60, 60).state == "closed"
    backend.retry_budget(f"{budget}:short", 1, False, 0.1, 1, 0.05)
    time.sleep(0.1)
    backend.purge_state(100)  # what a worker's janitor sends


def exercise(url: str) -> None:
    """Every primitive of the queue, the idempotency keys and the guards, on the sync face."""
    _queue(url)
    _keys(url)
    _state(url)


async def exercise_async(url: str) -> None:
    """The asyncio face: a task through an ``AsyncWorker``, a key replayed, a guarded write."""
    async with al.AsyncQueue.connect(url) as queue:
        await queue.enqueue("rights-async", {"n": 1})

        async def handler(ctx: al.AsyncJobContext) -> al.JSON:
            return {"n": ctx.payload}

        worker = al.AsyncWorker(queue, "rights-async", handler)
        await worker.run(burst=True)
        assert (await queue.stats("rights-async")).counts == {"done": 1}
        assert await queue.purge("rights-async", older_than=0) == 1  # what its janitor sends
        await queue.backend.purge_state(100)
        assert worker.id not in [w.id for w in await queue.workers()]  # removed at the stop
        await queue.enqueue("rights-async", {"n": 2}, id=f"c-{uuid.uuid4().hex}")
        (job,) = await queue.claim("rights-async")
        assert (await queue.cancel(job.task_id, "async stop")).outcome == "requested"
        assert await queue.extend([job.lease]) == [None]
        assert await queue.delete_queue("rights-async") == 1  # the done task was purged above
    async with al.AsyncIdempotency.connect(url) as keys:
        task = uuid.uuid4().hex
        act = await keys.begin("send", {"to": "ada"}, step="s", task_id=task)
        await act.complete({"id": 1})
        assert (await keys.begin("send", {"to": "ada"}, step="s", task_id=task)).replayed
    async with al.AsyncSharedState.connect(url) as state:
        key = f"pr:{uuid.uuid4().hex}"
        await state.compare_and_set(key, 0, {"status": "draft"})
        await state.add(f"c:{key}", 1)
        async with state.locks([key], timeout=2, ttl=5):
            pass


def run_async(url: str) -> None:
    """:func:`exercise_async` on a new event loop."""
    asyncio.run(exercise_async(url))
