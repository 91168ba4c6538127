"""Retention on Redis, what only Redis needs: a purge is two steps (the queue's script, then the
global id index), so a resent script (a lost reply) answers with the same ids, the next purge
frees the ids of a batch whose client died between the steps, and nothing of a purged task is
left under the prefix."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

import agentlease as al
from agentlease.backends.lua import queue_keys


@pytest.fixture
def url(served_url_redis: str) -> str:
    return served_url_redis


@pytest.fixture
def raw(url: str) -> Iterator[Any]:
    client = redis.Redis.from_url(url.split("?", 1)[0])
    yield client
    client.close()


def _prefix(url: str) -> str:
    return url.rsplit("prefix=", 1)[1].split("&", 1)[0]


def test_a_resent_purge_frees_the_same_ids(url: str, raw: Any) -> None:
    prefix = _prefix(url)
    with al.Queue.connect(url) as q:
        q.enqueue_many("r", [al.TaskSpec(payload=i, dedup_key=f"k{i}") for i in range(3)])
        for job in q.claim("r", 3, lease_for=30):
            q.complete(job.lease, {"big": "x" * 300})
        link = q.backend._link  # type: ignore[attr-defined]
        keys = queue_keys(prefix, "r").purge["done"]
        first, _ = link.script("purge", keys, ("done", 0, 10, "nonce-1"), retry=False)
        again, _ = link.script("purge", keys, ("done", 0, 10, "nonce-1"), retry=False)
        assert sorted(first) == sorted(again)
        assert len(first) == 3
        # The script dropped the tasks from the queue; the ids stay in the global index until
        # a client's second step: as if the client died before it.
        assert raw.hlen(f"{prefix}:ids") == 3
    with al.Queue.connect(url) as q:
        q.enqueue("r", "x", id="later")
        assert q.purge("r", older_than=0) == 0  # nothing new: the lost batch is freed now
        assert raw.hlen(f"{prefix}:ids") == 1
        (job,) = q.claim("r", lease_for=30)
        q.complete(job.lease, None)
        assert q.purge("r", older_than=0) == 1
    assert raw.hget(f"{prefix}:ids", "later") is None
    tag = f"{{{prefix}:r}}:"
    left = sorted(k.decode()[len(tag) :] for k in raw.scan_iter(match=f"{tag}*"))
    assert left == ["n"]  # the queue's counters; no hash or ZSET of a task is left
