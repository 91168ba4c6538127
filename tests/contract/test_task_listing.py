"""Task listings on every backend: ``Queue.tasks`` pages through the tasks of one state, in that
state's order (queued: claim order; leased: soonest expiry; done and dead: most recently
finished first), with a cursor that resumes exactly where the last page stopped."""

from __future__ import annotations

import time

import pytest

import agentlease as al
from agentlease import _cursor
from agentlease.errors import InvalidInput
from tests.conftest import Store

Q = "listed"


def every(q: al.Queue, state: al.TaskState, limit: int) -> list[str]:
    """All ids of ``state``, page by page; checks that no page is larger than ``limit``."""
    ids: list[str] = []
    cursor = None
    for _ in range(100):
        page, cursor = q.tasks(Q, state=state, limit=limit, cursor=cursor)  # type: ignore[arg-type]
        assert len(page) <= limit
        assert all(t.state == state and t.queue == Q for t in page)
        ids += [t.id for t in page]
        if cursor is None:
            return ids
    raise AssertionError("the cursor never ended")


def test_queued_tasks_are_listed_in_claim_order(store: Store) -> None:
    q = store.queue()
    for i in range(7):
        q.enqueue(Q, i, id=f"t{i}", priority=5 if i in (3, 5) else 0)
    q.enqueue(Q, "later", delay=60)
    listed = every(q, "queued", 2)
    assert listed == ["t3", "t5", "t0", "t1", "t2", "t4", "t6"]
    claimed = [j.task_id for j in q.claim(Q, 7, lease_for=30)]
    assert claimed == listed  # the listing's order is the claim's


def test_leased_tasks_soonest_expiry_first(store: Store) -> None:
    q = store.queue()
    for i in range(5):
        q.enqueue(Q, i, id=f"t{i}")
    for i, lease_for in enumerate((50, 30, 40, 20, 60)):
        (job,) = q.claim(Q, lease_for=lease_for)
        assert job.task_id == f"t{i}"
    assert every(q, "leased", 2) == ["t3", "t1", "t2", "t0", "t4"]
    assert every(q, "leased", 10) == ["t3", "t1", "t2", "t0", "t4"]


def test_finished_tasks_most_recent_first_in_pages(store: Store) -> None:
    q = store.queue()
    for i in range(6):
        q.enqueue(Q, i, id=f"t{i}")
    jobs = q.claim(Q, 6, lease_for=30)
    for job in jobs[:4]:
        q.complete(job.lease, None)
        time.sleep(0.002)
    q.complete_many([(job.lease, None) for job in jobs[4:]])  # finished at one time: by id
    listed = every(q, "done", 1)
    assert listed[:2] == ["t5", "t4"]
    assert listed[2:] == ["t3", "t2", "t1", "t0"]
    assert every(q, "done", 4) == listed
    assert every(q, "dead", 3) == []


def test_dead_letters_are_listed_and_purged_ones_are_gone(store: Store) -> None:
    q = store.queue()
    for i in range(3):
        q.enqueue(Q, i, id=f"t{i}")
        (job,) = q.claim(Q, lease_for=30)
        q.fail(job.lease, "boom", retry_in=None)
        time.sleep(0.002)
    page, cursor = q.tasks(Q, state="dead", limit=2)
    assert [t.id for t in page] == ["t2", "t1"]
    assert page[0].error is not None
    assert cursor is not None
    q.purge(Q, state="dead", older_than=0)
    page, cursor = q.tasks(Q, state="dead", limit=2, cursor=cursor)
    assert (page, cursor) == ([], None)


def test_an_unknown_queue_lists_nothing(store: Store) -> None:
    q = store.queue()
    assert q.tasks("never", state="queued") == ([], None)
    assert q.tasks("never", state="done") == ([], None)


def test_bad_listing_input_is_refused(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, 1)
    q.enqueue(Q, 2)
    _, cursor = q.tasks(Q, limit=1)
    assert cursor is not None
    with pytest.raises(InvalidInput):
        q.tasks(Q, state="scheduled")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        q.tasks(Q, state="done", cursor=cursor)  # a cursor of another state
    with pytest.raises(InvalidInput):
        q.tasks(Q, cursor="not a cursor!")
    with pytest.raises(InvalidInput):
        q.tasks(Q, cursor=_cursor.encode("queued", ["x"]))
    with pytest.raises(InvalidInput):
        q.tasks(Q, limit=0)


async def test_async_listing(store: Store) -> None:
    q = store.aqueue()
    try:
        for i in range(3):
            await q.enqueue(Q, i, id=f"a{i}")
        page, cursor = await q.tasks(Q, limit=2)
        assert [t.id for t in page] == ["a0", "a1"]
        page, cursor = await q.tasks(Q, limit=2, cursor=cursor)
        assert ([t.id for t in page], cursor) == (["a2"], None)
    finally:
        await q.close()


def test_cancelled_tasks_are_listed_newest_first(store: Store) -> None:
    q = store.queue()
    for i in range(3):
        q.enqueue(Q, {"i": i}, id=f"c{i}")
        q.cancel(f"c{i}", "no")
        time.sleep(0.01)
    page, cursor = q.tasks(Q, state="cancelled", limit=2)
    assert [t.id for t in page] == ["c2", "c1"]
    assert all(t.state == "cancelled" for t in page)
    assert cursor is not None
    rest, end = q.tasks(Q, state="cancelled", limit=2, cursor=cursor)
    assert [t.id for t in rest] == ["c0"]
    assert end is None
    assert {t.cancel_reason for t in page + rest} == {"no"}


def test_listed_leased_tasks_carry_a_requested_cancel(store: Store) -> None:
    q = store.queue()
    for i in range(3):
        q.enqueue(Q, i, id=f"t{i}")
    for lease_for in (20, 30, 40):
        q.claim(Q, lease_for=lease_for)
    q.cancel("t1", "stop it")
    for limit in (1, 10):  # pages that end early (with a cursor) and the last page
        reasons = {}
        cursor = None
        for _ in range(10):
            page, cursor = q.tasks(Q, state="leased", limit=limit, cursor=cursor)
            reasons.update({t.id: t.cancel_reason for t in page})
            if cursor is None:
                break
        assert reasons == {"t0": None, "t1": "stop it", "t2": None}
        assert reasons["t1"] == q.get("t1").cancel_reason
