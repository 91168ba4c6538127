"""The worker honours a task's deadline and hands its root task and deadline on to the tasks its
handler enqueues: a task past its deadline never runs and is dead-lettered with reason
``deadline``; a running handler is stopped at the deadline (async: cancelled; sync: its cancel
token, ``check()`` and ``al.check_deadline()``) and dead-lettered, never retried; a child task
carries its parent's root and deadline on the store's clock, and one enqueued after the deadline
never runs. On memory, SQLite and PostgreSQL, both faces."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentlease as al
from agentlease._worker import Handler
from agentlease.backends.memory import MemoryBackend
from agentlease.backends.sqlite import SCHEMA_VERSION
from tests.conftest import Store

Q = "work"
KIDS = "kids"
SHORT = 0.3  # seconds: a deadline the handlers below outlive
# A deadline a handler must still be running under: it counts from the enqueue, and on a loaded
# machine the worker's start and first claim can take longer than SHORT.
RUNNING = 1.5
FAST = al.WorkerSettings(poll_interval=0.05, shutdown_grace=5.0)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Memory, SQLite and one server store are enough here: the seam itself is checked on every
    store by tests/contract/test_task_context.py."""
    kind = request.param
    if kind == "memory":
        s = Store(kind, "memory://", MemoryBackend())
    elif kind == "sqlite":
        s = Store(kind, f"sqlite:///{tmp_path / 'tasks.db'}")
    else:
        s = Store(kind, request.getfixturevalue("served_url_postgres"))
    yield s
    s.close()


def _dead_for_deadline(task: al.Task) -> None:
    assert task.state == "dead"
    error = task.error
    assert isinstance(error, dict)
    assert error["reason"] == "deadline"


def _shared_state(store: Store, q: al.Queue) -> al.SharedState:
    """Shared state on the queue's store (on memory, the very same backend)."""
    if store.kind == "memory":
        return al.SharedState(q.backend)
    return al.SharedState.connect(store.url)


def _run(q: al.Queue, name: str, handler: Handler) -> None:
    al.Worker(q, name, handler, settings=FAST).run(burst=True, handle_signals=False)


def test_a_task_past_its_deadline_is_dead_lettered_and_never_runs(store: Store) -> None:
    events: list[al.Event] = []
    q = store.queue(on_event=events.append)
    q.enqueue(Q, {}, id="late", deadline=0.01)
    q.enqueue(Q, {}, id="fine")
    time.sleep(0.05)
    ran: list[str] = []

    def handler(ctx: al.JobContext) -> al.JSON:
        ran.append(ctx.task_id)
        return None

    _run(q, Q, handler)
    assert ran == ["fine"]
    late = q.get("late")
    _dead_for_deadline(late)
    assert late.error["type"] == "DeadlineExceeded"  # type: ignore[index, call-overload]
    assert (late.attempt, late.failures) == (1, 1)  # through the fenced fail of its lease
    assert any(e.name == "dead_lettered" and e.task_id == "late" for e in events)
    assert q.get("fine").state == "done"


async def test_an_async_handler_is_cancelled_at_the_deadline(store: Store) -> None:
    q = store.aqueue()
    await q.queues()  # connected (and migrated) before the clock starts
    await q.enqueue(Q, {}, id="slow", deadline=RUNNING)
    cancelled = threading.Event()

    async def handler(ctx: al.AsyncJobContext) -> al.JSON:
        assert al.remaining() is not None
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "too late"

    await al.AsyncWorker(q, Q, handler, settings=FAST).run(burst=True, handle_signals=False)
    assert cancelled.is_set()
    task = await q.get("slow")
    _dead_for_deadline(task)
    assert task.failures == 1  # dead at once: never retried
    await q.close()


def test_a_sync_handler_sees_the_deadline_and_stops(store: Store) -> None:
    q = store.queue()
    q.queues()  # connected (and migrated) before the clock starts
    q.enqueue(Q, {}, id="poll", deadline=RUNNING)
    seen: list[object] = []

    def handler(ctx: al.JobContext) -> al.JSON:
        assert not ctx.cancelled
        while not ctx.cancelled:
            ctx.wait(10.0)  # wakes at the deadline
        seen.append(al.remaining())
        with pytest.raises(al.DeadlineExceeded):
            ctx.check()
        al.check_deadline()  # the deadline is in this thread's context: raises
        seen.append("not reached")
        return None

    _run(q, Q, handler)
    assert seen == [0.0]
    _dead_for_deadline(q.get("poll"))


def test_a_retry_that_would_start_past_the_deadline_is_dead_lettered(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {}, id="flaky", deadline=5.0)
    calls: list[int] = []

    def handler(ctx: al.JobContext) -> al.JSON:
        calls.append(ctx.attempt)
        raise ValueError("flaky")

    # Backoff drawn from (0, 10^6) s: a retry would land past the deadline (but for a one in
    # 200,000 draw).
    settings = al.WorkerSettings(
        poll_interval=0.05, retry=al.RetryPolicy(max_failures=5, base=1e6, cap=1e6)
    )
    al.Worker(q, Q, handler, settings=settings).run(burst=True, handle_signals=False)
    assert calls == [1]
    task = q.get("flaky")
    _dead_for_deadline(task)
    assert task.error["type"] == "ValueError"  # type: ignore[index, call-overload]


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_child_task_carries_its_parents_root_and_deadline(store: Store, face: str) -> None:
    q = store.queue()
    q.enqueue(Q, {}, id="parent", deadline=60.0)
    parent_deadline = q.get("parent").deadline
    assert parent_deadline is not None

    def sync_handler(ctx: al.JobContext) -> al.JSON:
        ctx.queue.enqueue(KIDS, {}, id="child")
        ctx.queue.enqueue_many(KIDS, [al.TaskSpec(id="sooner", deadline=30.0)])
        return None

    async def async_handler(ctx: al.AsyncJobContext) -> al.JSON:
        await ctx.queue.enqueue(KIDS, {}, id="child")
        await ctx.queue.enqueue_many(KIDS, [al.TaskSpec(id="sooner", deadline=30.0)])
        return None

    _run(q, Q, sync_handler if face == "sync" else async_handler)
    assert q.get("parent").state == "done"
    child, sooner = q.get("child"), q.get("sooner")
    assert child.root_id == sooner.root_id == "parent"
    assert child.deadline is not None
    # The same instant, carried through the claim's clock offset and back (a small tolerance:
    # the offset is measured when the claim returns).
    assert abs(child.deadline - parent_deadline) < 1.0
    assert sooner.deadline is not None
    assert sooner.deadline < parent_deadline - 20.0  # the earlier of the two deadlines wins


def test_a_child_enqueued_after_the_deadline_never_runs(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {}, id="parent", deadline=SHORT)

    def parent(ctx: al.JobContext) -> al.JSON:
        ctx.wait(10.0)  # until the deadline
        ctx.queue.enqueue(KIDS, {}, id="child")  # enqueued all the same, already past it
        return "done late"

    _run(q, Q, parent)
    _dead_for_deadline(q.get("parent"))  # it returned after its deadline: not accepted
    ran: list[str] = []

    def child(ctx: al.JobContext) -> al.JSON:
        ran.append(ctx.task_id)
        return None

    _run(q, KIDS, child)
    assert ran == []
    task = q.get("child")
    assert task.root_id == "parent"
    _dead_for_deadline(task)


WITHOUT_VERSION_10 = (
    "DROP TRIGGER agentlease_attempt_close",
    "DROP TRIGGER agentlease_attempt_forget",
    "DROP TABLE agentlease_attempts",
    "DROP TABLE agentlease_workers",
    "ALTER TABLE agentlease_tasks DROP COLUMN holder",
)


def test_a_sqlite_database_of_version_5_gains_task_contexts(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    q = al.Queue.connect(f"sqlite:///{path}")
    q.enqueue(Q, {}, id="old")
    q.close()
    db = sqlite3.connect(path)  # back to version 5: no context column (nor what 10 added)
    for statement in WITHOUT_VERSION_10:
        db.execute(statement)
    db.execute("ALTER TABLE agentlease_tasks DROP COLUMN context")
    db.execute("PRAGMA user_version = 5")
    db.commit()
    db.close()
    q = al.Queue.connect(f"sqlite:///{path}")
    try:
        assert q.get("old").context_json is None
        q.enqueue(Q, {}, id="new", deadline=60.0)
        assert q.get("new").deadline is not None
        assert {j.task_id for j in q.claim(Q, n=5)} == {"old", "new"}
    finally:
        q.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    db.close()


def test_task_retries_draw_on_the_root_tasks_retry_budget(store: Store) -> None:
    """A parent's handler fans out four children that always fail; their retries share the
    root task's budget (ratio 0, minimum 2): two retries in all, then dead letters with reason
    ``retry_budget``, and handler-level budgets of the same root see the same count."""
    q = store.queue()
    policy = al.RetryPolicy(
        max_failures=5, base=0.001, cap=0.001, budget_ratio=0.0, budget_minimum=2
    )
    settings = al.WorkerSettings(poll_interval=0.05, shutdown_grace=5.0, retry=policy)
    q.enqueue(Q, {}, id="root-task")
    runs: list[str] = []

    def handler(ctx: al.JobContext) -> al.JSON:
        if ctx.task_id == "root-task":
            for n in range(4):
                q.enqueue(KIDS, {}, id=f"kid-{n}")
            return None
        runs.append(ctx.task_id)
        raise ConnectionError("the dependency is down")

    al.Worker(q, Q, handler, settings=settings).run(burst=True, handle_signals=False)
    al.Worker(q, KIDS, handler, settings=settings).run(burst=True, handle_signals=False)
    kids = [q.get(f"kid-{n}") for n in range(4)]
    assert all(k.state == "dead" for k in kids)
    assert len(runs) == 4 + 2  # four first attempts, two retries granted by the shared budget
    reasons = sorted(str(k.error["reason"]) for k in kids)  # type: ignore[index, call-overload]
    assert reasons == ["retry_budget"] * 4
    state = _shared_state(store, q)
    with pytest.raises(al.RetryBudgetExhausted) as caught:
        al.RetryBudget(state, scope="root-task", ratio=0.0, minimum=2).acquire_retry()
    assert caught.value.retries == 2
    if store.kind != "memory":
        state.close()


def test_a_handlers_retry_budget_is_its_root_tasks_by_default(store: Store) -> None:
    q = store.queue()
    state = _shared_state(store, q)
    q.enqueue(Q, {}, id="request-5")
    scopes: list[str] = []

    def handler(ctx: al.JobContext) -> al.JSON:
        if ctx.task_id == "request-5":
            q.enqueue(KIDS, {}, id="subagent-1")
            return None
        budget = al.RetryBudget(state, minimum=1, ratio=0.0)  # no scope: the root task's
        budget.acquire_retry()
        try:
            budget.acquire_retry()
        except al.RetryBudgetExhausted as exc:
            scopes.append(exc.scope)
        return None

    _run(q, Q, handler)
    _run(q, KIDS, handler)
    assert scopes == ["request-5"]
    assert q.get("subagent-1").root_id == "request-5"
    if store.kind != "memory":
        state.close()
