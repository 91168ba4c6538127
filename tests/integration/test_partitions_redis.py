"""Partitions on Redis: the record layout they keep, the keys they leave, the hot-partition
ranking (what the contract suite cannot see from outside)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from agentlease import QueueSettings, TaskSpec
from tests import _services
from tests.conftest import Store

Q = "jobs"
LIVE = 30.0


@pytest.fixture
def store(served_url_redis: str) -> Iterator[Store]:
    s = Store("redis", served_url_redis)
    yield s
    s.close()


@pytest.fixture
def raw(served_url_redis: str) -> Iterator[tuple[redis.Redis, str]]:
    """A plain client on the shared Redis, and the tag of queue ``Q``'s keys."""
    prefix = served_url_redis.rsplit("prefix=", 1)[1]
    client = redis.Redis.from_url(_services.REDIS_URL)
    yield client, f"{{{prefix}:{Q}}}:"
    client.close()


def test_only_a_task_with_a_partition_has_a_22nd_value(
    store: Store, raw: tuple[redis.Redis, str]
) -> None:
    client, tag = raw
    q = store.queue()
    q.enqueue(Q, {}, id="free")
    q.enqueue(Q, {}, id="owned", partition="acct-1")
    free, owned = client.hmget(tag + "t", ["free", "owned"])
    assert free[:3] == b"\xdc\x00\x15"  # as before partitions: old records read the same way
    assert owned[:3] == b"\xdc\x00\x16"
    assert q.get("free").partition is None
    jobs = {j.task_id: j for j in q.claim(Q, n=5, lease_for=LIVE)}
    # extend rewrites the head of a record and keeps the rest, header included
    q.extend([j.lease for j in jobs.values()], lease_for=LIVE)
    assert client.hget(tag + "t", "owned")[:3] == b"\xdc\x00\x16"
    assert q.get("owned").partition == "acct-1"
    for job in jobs.values():
        q.complete(job.lease, None)
    assert q.get("owned").state == "done"


def test_hot_partitions_are_the_most_parked_first_ties_by_name(store: Store) -> None:
    q = store.queue()
    parked = {"e": 3, "d": 2, "b": 2, "a": 2, "f": 1, "c": 1, "g": 0}
    q.enqueue_many(Q, [TaskSpec(partition=p) for p, n in parked.items() for _ in range(n + 1)])
    stats = q.stats(Q)
    assert stats.hot_partitions == (("e", 3), ("a", 2), ("b", 2), ("d", 2), ("c", 1))
    assert stats.counts["parked"] == 11
    assert stats.counts["queued"] == 7


def test_partition_keys_are_gone_once_every_task_finished(
    store: Store, raw: tuple[redis.Redis, str]
) -> None:
    client, tag = raw
    q = store.queue(QueueSettings(max_reclaims=0))
    q.enqueue_many(Q, [TaskSpec(id=f"t{i}", partition="p", delay=0.01 * i) for i in range(3)])
    (t0,) = q.claim(Q, n=5, lease_for=0.2)
    time.sleep(0.4)
    (reaped,) = q.reap(Q)  # reap.lua dead-letters t0 and unparks t1
    assert (reaped.task_id, reaped.outcome) == ("t0", "dead")
    assert q.get("t1").state == "queued"
    (t1,) = q.claim(Q, n=5, lease_for=LIVE)
    q.fail(t1.lease, ValueError("no"), retry_in=None)  # fail.lua unparks t2
    (t2,) = q.claim(Q, n=5, lease_for=LIVE)
    assert t2.task_id == "t2"
    assert client.hget(tag + "pb", "p") == b"1"
    q.complete(t2.lease, None)
    assert client.exists(tag + "pb", tag + "pk", tag + "ph") == 0
    assert q.stats(Q).counts == {"done": 1, "dead": 2}
    del t0
