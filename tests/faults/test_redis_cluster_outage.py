"""Redis Cluster: one master SIGKILLed and restarted under running workers.

Queues whose hash slots live on the healthy masters keep being claimed and completed during the
outage, on both faces, even though the master that goes down is the one the URL names; the down
shard's calls fail with BackendUnavailable, and its queue picks up where it was once its master
is back (append-only file, ``appendfsync always``). The healthy masters' script caches are
flushed when the outage starts, as if they had restarted or failed over earlier: their first
calls must not need the down master (a script the server does not know is sent again to its own
node, never loaded on every master).

The private cluster runs with ``cluster-require-full-coverage no``: with Redis's default, the
cluster itself refuses every key once a master has been down for ``cluster-node-timeout``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import key_slot

import agentlease as al
from agentlease import BackendUnavailable
from agentlease._demo.ledger import read_ledgers
from tests import _redis_cluster
from tests._private_redis import PrivateRedis
from tests.conftest import unavailable
from tests.faults.test_redis_restart import WORKERS

PREFIX = "outage"
OPTIONS = {
    "appendonly": "yes",
    "appendfsync": "always",
    "cluster-require-full-coverage": "no",
    "cluster-node-timeout": "1000",  # the outage outlasts it: the master is marked failed
}


@pytest.fixture
def cluster() -> Iterator[_redis_cluster.Cluster]:
    try:
        started = _redis_cluster.start(options=OPTIONS)
    except _redis_cluster.CannotStart as exc:
        unavailable("private redis cluster", str(exc))
    try:
        yield started
    finally:
        started.stop()


def _owners(cluster: _redis_cluster.Cluster) -> dict[int, PrivateRedis]:
    """Each slot's master, from CLUSTER SLOTS."""
    admin = redis.Redis(port=cluster.nodes[0].port)
    try:
        ranges = admin.execute_command("CLUSTER SLOTS")
    finally:
        admin.close()
    by_port = {n.port: n for n in cluster.nodes}
    owners: dict[int, PrivateRedis] = {}
    for first, last, master, *_ in ranges if isinstance(ranges, list) else []:
        for slot in range(int(first), int(last) + 1):
            owners[slot] = by_port[int(master[1])]
    if not owners:  # redis-py parses CLUSTER SLOTS into {(first, last): {...}}
        for (first, last), node in ranges.items():
            port = int(node["primary"][1])
            for slot in range(int(first), int(last) + 1):
                owners[slot] = by_port[port]
    return owners


def _stats(q: al.Queue, queue: str) -> dict[str, int]:
    return {s: n for s, n in q.stats(queue).counts.items() if n}


def _wait(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout}s"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("face", ["sync", "async"])
def test_healthy_shards_keep_running_while_one_master_is_down(
    cluster: _redis_cluster.Cluster, tmp_path: Path, face: str
) -> None:
    owners = _owners(cluster)
    # One queue per master; the master that goes down holds no global key (the id index and the
    # queue set, which every enqueue writes, and the layout version, which every new client reads
    # first), so enqueues go on during the outage.
    queue_of: dict[int, str] = {}
    for i in range(10_000):
        node = owners[key_slot(f"{{{PREFIX}:q{i}}}".encode())]
        queue_of.setdefault(node.port, f"q{i}")
        if len(queue_of) == len(cluster.nodes):
            break
    global_keys = [f"{PREFIX}:{k}".encode() for k in ("ids", "queues", "layout")]
    global_ports = {owners[key_slot(key)].port for key in global_keys}  # two masters of three
    down = next(n for n in cluster.nodes if n.port not in global_ports)
    healthy = [queue_of[n.port] for n in cluster.nodes if n is not down]
    lost = queue_of[down.port]

    # The URL names the master that goes down: the clients know the others from its slot map.
    url = f"redis://127.0.0.1:{down.port}/0?cluster=1&prefix={PREFIX}"
    url += "&connect_timeout=1&socket_timeout=2"
    producer = al.Queue.connect(url)
    for queue in queue_of.values():
        # Seconds of work: the kill lands mid-run, even if the down shard's worker started well
        # before the others on a loaded machine (it has three times as much to do).
        work = 0.3 if queue == lost else 0.1
        producer.enqueue_many(queue, [{"work": work}] * 40)
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKERS[face], url, queue, str(ledgers / f"{queue}.jsonl")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for queue in queue_of.values()
    ]
    try:
        _wait(
            "every queue is being worked",
            lambda: all(_stats(producer, q).get("done", 0) >= 3 for q in queue_of.values()),
            60,
        )
        assert set(_stats(producer, lost)) != {"done"}, "the down shard's queue still has work"
        down.kill()
        killed_at = time.time()
        for node in cluster.nodes:
            if node is not down:  # as after an earlier restart or failover of these masters
                admin = redis.Redis(port=node.port)
                admin.script_flush()
                admin.close()
        # The healthy shards take new work and finish it while the master is down.
        during = {
            q: [e.task_id for e in producer.enqueue_many(q, [{"work": 0.01}] * 10)] for q in healthy
        }

        def finished_during_outage() -> bool:
            return all(producer.get(t).state == "done" for ids in during.values() for t in ids)

        _wait("the healthy shards finished new work during the outage", finished_during_outage, 60)
        for call in (
            lambda: producer.stats(lost),
            lambda: producer.claim(lost),
            lambda: producer.inspect(lost),
        ):
            with pytest.raises(BackendUnavailable):
                call()
        assert down.process is None, "the master stayed down throughout"
        down.start()  # same directory and port: its append-only file is replayed
        restarted_at = time.time()

        def all_done() -> bool:
            try:
                return all(set(_stats(producer, q)) == {"done"} for q in queue_of.values())
            except BackendUnavailable:
                return False

        _wait("every task done after the restart", all_done, 90)
        alive = [w.poll() is None for w in workers]
        done = sum(_stats(producer, q)["done"] for q in queue_of.values())
    finally:
        for w in workers:
            w.terminate()
        errors = [w.communicate(timeout=30)[1] for w in workers]
        producer.close()

    assert all(alive), f"a worker died: {errors}"
    assert not [e for e in errors if "redis.exceptions" in e], errors
    records = list(read_ledgers(ledgers))
    assert [r for r in records if r["kind"] == "untyped"] == []
    completed = Counter(r["task"] for r in records if r["kind"] == "completed")
    assert {t: n for t, n in completed.items() if n > 1} == {}, "completed more than once"
    assert done == 40 * len(queue_of) + 10 * len(healthy), "nothing lost, on any shard"
    # The down shard's queue was completed after its master came back, the others during.
    finished = {r["task"]: r["t"] for r in records if r["kind"] == "completed"}
    assert all(killed_at < finished[t] < restarted_at for ids in during.values() for t in ids)
    assert any(t > restarted_at for t in finished.values())
