"""Single-writer routing: tasks of one partition run one at a time, in enqueue order, on every
backend of the ``store`` fixture; tasks of different partitions run in parallel."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest

import agentlease as al
from agentlease import InvalidName, QueueSettings, TaskSpec
from tests.conftest import Store

Q = "jobs"
LIVE = 30.0
SHORT = 0.3
PAST = 0.5


def ids(jobs: list[al.Job]) -> list[str]:
    return sorted(j.task_id for j in jobs)


def counts(q: al.Queue) -> dict[str, int]:
    return {state: n for state, n in q.stats(Q).counts.items() if n}


def test_one_task_of_a_partition_runs_at_a_time_in_enqueue_order(store: Store) -> None:
    q = store.queue()
    for i in range(3):
        q.enqueue(Q, {"i": i}, id=f"a{i}", partition="acct-a")
    q.enqueue(Q, {}, id="b0", partition="acct-b")
    q.enqueue(Q, {}, id="free")
    assert q.get("a1").state == "parked"
    assert q.get("a1").partition == "acct-a"
    assert q.get("free").partition is None
    stats = q.stats(Q)
    assert stats.hot_partitions == (("acct-a", 2),)
    assert stats.depth == 5
    first = q.claim(Q, n=10, lease_for=LIVE)
    assert ids(first) == ["a0", "b0", "free"]  # different partitions run in parallel
    assert counts(q) == {"leased": 3, "parked": 2}
    assert q.claim(Q, n=10, lease_for=LIVE) == []
    by_id = {j.task_id: j for j in first}
    q.complete(by_id["a0"].lease, None)  # the partition is idle: its next task is unparked
    (a1,) = q.claim(Q, n=10, lease_for=LIVE)
    assert a1.task_id == "a1"
    q.fail(a1.lease, ValueError("retry me"), retry_in=LIVE)  # waiting to retry: still busy
    assert q.get("a2").state == "parked"
    assert q.claim(Q, n=10, lease_for=LIVE) == []
    q.complete(by_id["b0"].lease, None)
    q.complete(by_id["free"].lease, None)
    assert q.stats(Q).hot_partitions == (("acct-a", 1),)


def test_a_dead_task_frees_its_partition(store: Store) -> None:
    q = store.queue()
    q.enqueue_many(Q, [TaskSpec(id=f"t{i}", partition="doc-1") for i in range(2)])
    (t0,) = q.claim(Q, n=5, lease_for=LIVE)
    assert t0.task_id == "t0"
    q.fail(t0.lease, ValueError("no"), retry_in=None)  # dead-lettered
    (t1,) = q.claim(Q, n=5, lease_for=LIVE)
    assert t1.task_id == "t1"
    assert q.requeue_dead(Q) == 1  # the partition is busy again: requeued behind t1, parked
    assert q.get("t0").state == "parked"
    q.complete(t1.lease, None)
    (again,) = q.claim(Q, n=5, lease_for=LIVE)
    assert again.task_id == "t0"


def test_a_reaped_task_keeps_its_partition_and_a_dead_one_frees_it(store: Store) -> None:
    q = store.queue(QueueSettings(max_reclaims=1))
    q.enqueue_many(Q, [TaskSpec(id=f"r{i}", partition="p") for i in range(2)])
    (r0,) = q.claim(Q, n=5, lease_for=SHORT)
    time.sleep(PAST)
    (again,) = q.claim(Q, n=5, lease_for=SHORT)  # reaped and requeued: still the head
    assert again.task_id == "r0"
    assert q.get("r1").state == "parked"
    time.sleep(PAST)
    (nxt,) = q.claim(Q, n=5, lease_for=LIVE)  # reaped past max_reclaims: dead, r1 runs
    assert nxt.task_id == "r1"
    assert q.get("r0").state == "dead"
    del r0


def test_an_unparked_task_keeps_its_delay(store: Store) -> None:
    q = store.queue()
    q.enqueue(Q, {}, id="d0", partition="p")
    q.enqueue(Q, {}, id="d1", partition="p", delay=LIVE)
    (d0,) = q.claim(Q, n=5, lease_for=LIVE)
    q.complete(d0.lease, None)
    assert q.get("d1").state == "scheduled"
    assert q.claim(Q, n=5, lease_for=LIVE) == []


def test_bad_partition_keys_are_refused(store: Store) -> None:
    q = store.queue()
    for bad in ("", "a b", "x" * 201, 7):
        with pytest.raises(InvalidName):
            q.enqueue(Q, {}, partition=bad)  # type: ignore[arg-type]
    assert q.queues() == []


def test_concurrent_workers_never_run_one_partition_twice_at_once(store: Store) -> None:
    q = store.queue()
    partitions = [f"acct-{i}" for i in range(4)]
    q.enqueue_many(
        Q, [TaskSpec(payload={"p": p, "n": n}, partition=p) for n in range(6) for p in partitions]
    )
    running: dict[str, int] = defaultdict(int)
    overlaps: list[str] = []
    order: dict[str, list[int]] = defaultdict(list)
    lock = threading.Lock()
    clients = [store.queue() for _ in range(4)]

    def work(c: al.Queue) -> None:
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 1.5:
            jobs = c.claim(Q, n=2, lease_for=LIVE)
            if not jobs:
                time.sleep(0.01)
                continue
            idle_since = time.monotonic()
            for job in jobs:
                payload = job.payload
                assert isinstance(payload, dict)
                p = str(payload["p"])
                with lock:
                    running[p] += 1
                    if running[p] > 1:
                        overlaps.append(p)
                    order[p].append(int(payload["n"]))  # type: ignore[call-overload]
                time.sleep(0.002)
                with lock:
                    running[p] -= 1
                c.complete(job.lease, None)

    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert overlaps == []
    assert {p: order[p] for p in partitions} == {p: list(range(6)) for p in partitions}
    assert counts(q) == {"done": 24}
