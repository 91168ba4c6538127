"""The Redis rows of ``agentlease bench``: a raw baseline, and latency and heartbeat figures.

:class:`RawRedis` is the baseline the library is measured against on Redis: the same client
(redis-py with hiredis) running a loop of two minimal scripts, with no agentlease in the way.
The claim script pops ids from a list and marks each leased with an expiry from ``TIME``; the
complete script checks the mark, removes it and stores the result. That is the least any leased
queue on Redis does per task; the library's scripts also keep priorities, fencing tokens, attempt
counters, reaping, dead letters and state counts.

Every raw baseline sends its scripts over the transport the library uses (see
:mod:`agentlease.backends._async.redis_link`): on a plain Redis, one connection kept out of
redis-py's pool, with ``send_command`` and ``read_response``; on a cluster, the client. So a
ratio measures what the library's scripts and Python cost, not how redis-py is called. Two more
rows put the library beside the same raw loop through redis-py's client API (``Script`` objects
and ``execute_command``: a pool checkout, a retry wrapper and metrics hooks per call), the way
a Redis queue usually calls its scripts. One more puts the batch claim beside a plain script that
makes the same changes as ``claim.lua`` on the library's keys (:mod:`.redis_plain`): what the
library's record, index and lease cost before any of its own tuning.

:func:`latency_and_extend` measures what throughput does not show: claim latency with a short
and with a million-task queue (the cost must not grow with depth), one heartbeat ``extend`` of
10,000 leases, and a reap with nothing expired beside one with 1,000 expired leases (the
reaper's cost grows with the expired leases, not with the queue).

:class:`RawRedisKeys` is the baseline of the idempotency rows (see
:mod:`agentlease.bench.keys`): ``SET key value NX`` through the same client.
:class:`RawRedisGuards` is that of the shared-state guard rows (see
:mod:`agentlease.bench.guards`): a minimal version-checking script, and ``SET NX PX`` with
an owner-checked release script.

Run everything against one server with ``python -m agentlease.bench.redis_rows redis://...``.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import click

from agentlease._records import TaskSpec
from agentlease._redact import redact_url
from agentlease._sync.queue import Queue
from agentlease.backends import connect
from agentlease.backends._redis_url import parse
from agentlease.bench.command import Row, Stores, cases, run_bench
from agentlease.bench.guards import (
    DEFAULT_GUARDS,
    LOCK_TTL,
    GuardRow,
    LibraryGuards,
    run_guards,
)
from agentlease.bench.keys import DEFAULT_CALLS, KeyRow, LibraryKeys, run_keys
from agentlease.bench.loops import FILL_CHUNK, LEASE_FOR, Driver, Library, Mode, Target
from agentlease.bench.redis_link import Pinned, raw_url
from agentlease.bench.redis_link import client as _client
from agentlease.bench.redis_link import drop as _drop
from agentlease.bench.redis_link import with_prefix as _with_prefix
from agentlease.bench.redis_plain import PLAIN, PlainStores
from agentlease.errors import InvalidURL

__all__ = [
    "CLIENT_API",
    "PLAIN",
    "Pinned",
    "RawRedis",
    "RawRedisGuards",
    "RawRedisKeys",
    "RawRedisTarget",
    "RedisStores",
    "compare",
    "compare_guards",
    "compare_keys",
    "latency_and_extend",
    "raw_url",
]

_CLAIM = """
local ids = redis.call('LPOP', KEYS[1], ARGV[1])
if not ids then return {} end
local t = redis.call('TIME')
local expires = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[2])
local out = {}
for i, id in ipairs(ids) do
  redis.call('HSET', KEYS[2], id, expires)
  out[2 * i - 1] = id
  out[2 * i] = redis.call('HGET', KEYS[3], id)
end
return out
"""
_COMPLETE = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
"""


CLIENT_API = "client-API raw"
"""What the names of the rows measured beside the client-API raw loop end with."""


class RawRedis:
    """The raw baseline: two minimal scripts through redis-py, no agentlease.

    Args:
        url: a ``redis://`` URL; its ``prefix`` names the baseline's keys.
        client_api: call the scripts through redis-py's client API (``Script`` objects) instead
            of the library's transport (see :class:`Pinned`).
    """

    def __init__(self, url: str, *, client_api: bool = False) -> None:
        self.url = url
        self.prefix = parse(url).prefix
        self.client = _client(url)
        self.client_api = client_api
        self._send = Pinned(self.client)
        self._claim = self.client.register_script(_CLAIM)
        self._complete = self.client.register_script(_COMPLETE)
        self._send("SCRIPT", "LOAD", _CLAIM)
        self._send("SCRIPT", "LOAD", _COMPLETE)
        self._filled: set[str] = set()

    @classmethod
    def open(cls, url: str, *, client_api: bool = False) -> RawRedis:
        """A baseline driver with a connection of its own (for spawned worker processes)."""
        return cls(url, client_api=client_api)

    def _keys(self, queue: str) -> tuple[str, str, str, str]:
        tag = f"{{{self.prefix}:{queue}}}"
        return f"{tag}:ready", f"{tag}:leased", f"{tag}:payload", f"{tag}:done"

    def fill(self, queue: str, count: int) -> None:
        ready, _, payloads, _ = self._keys(queue)
        self._filled.add(queue)
        for start in range(0, count, FILL_CHUNK):
            ids = [uuid.uuid4().hex for _ in range(start, min(count, start + FILL_CHUNK))]
            pipe = self.client.pipeline(transaction=False)
            pipe.hset(
                payloads, mapping={i: json.dumps({"n": start + k}) for k, i in enumerate(ids)}
            )
            pipe.rpush(ready, *ids)
            pipe.execute()

    def drain(self, queue: str, batch: int, mode: Mode) -> int:
        ready, leased, payloads, done = self._keys(queue)
        claim, complete = self._claim, self._complete
        claim_keys, complete_keys = [ready, leased, payloads], [leased, done]
        send, claim_sha, complete_sha = self._send, claim.sha, complete.sha
        client_api = self.client_api

        def claim_one() -> Any:
            if client_api:
                return claim(keys=claim_keys, args=[batch, LEASE_FOR])
            return send("EVALSHA", claim_sha, 3, *claim_keys, batch, LEASE_FOR)

        def complete_one(task_id: bytes) -> Any:
            if client_api:
                return complete(keys=complete_keys, args=[task_id, ""])
            return send("EVALSHA", complete_sha, 2, *complete_keys, task_id, "")

        claimed = 0
        while True:
            reply = claim_one()
            if not reply:
                return claimed
            claimed += len(reply) // 2
            if mode == "claim_only":
                continue
            if batch == 1:
                replies = [complete_one(reply[0])]
            else:  # the same script per task, pipelined: one round trip for the batch
                pipe = self.client.pipeline(transaction=False)
                for i in range(0, len(reply), 2):
                    complete(keys=complete_keys, args=[reply[i], ""], client=pipe)
                replies = pipe.execute()
            if any(r != 1 for r in replies):
                raise click.ClickException("a raw complete was refused")

    def close(self) -> None:
        """Delete the queues this driver filled, and close the client."""
        try:
            for queue in self._filled:
                for key in self._keys(queue):
                    self.client.unlink(key)
        finally:
            self._send.close()


@dataclass(frozen=True, slots=True)
class RawRedisTarget(Target):
    """How a spawned bench process opens the raw Redis baseline."""

    client_api: bool = False

    def open(self) -> Driver:
        if self.kind == "library":
            return Library(connect(self.url))
        return RawRedis.open(self.url, client_api=self.client_api)


class RedisStores(Stores):
    """The library on ``url`` beside the raw baseline on the same server (its own prefix).

    The library's bench queues are left under the URL's prefix, as on every backend; the
    baseline deletes its keys on close.
    """

    def __init__(self, url: str, *, client_api: bool = False) -> None:
        raw = raw_url(url)
        self.kind = "rediss" if parse(url).tls else "redis"
        self.targets = (
            RawRedisTarget("library", url),
            RawRedisTarget("raw", raw, client_api=client_api),
        )
        self.library = Library(connect(url))
        self.raw = RawRedis.open(raw, client_api=client_api)


def compare(url: str, *, tasks: int = 30_000, batch: int = 50, processes: int = 4) -> list[Row]:
    """The bench rows on ``url``: the library beside the raw baseline, under a fresh prefix;
    then the two batching-off rows again beside the raw loop through redis-py's client API, and
    the batch claim row again beside the plain claim script (see :mod:`.redis_plain`)."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    target = _with_prefix(url, prefix)
    try:
        plan = cases(processes, batch, "sqlite")
        stores = RedisStores(target)
        try:
            rows = run_bench(stores, plan, tasks)
        finally:
            stores.close()
        stores = RedisStores(target, client_api=True)
        try:
            plain = [c for c in plan if c.mode == "claim_complete" and c.batch == 1]
            again = [replace(c, name=f"{c.name} ({CLIENT_API})") for c in plain]
            rows += run_bench(stores, again, tasks)
        finally:
            stores.close()
        beside_plain = PlainStores(target)
        try:
            claims = [c for c in plan if c.mode == "claim_only" and c.batch > 1]
            again = [replace(c, name=f"{c.name} ({PLAIN})") for c in claims]
            rows += run_bench(beside_plain, again, tasks)
        finally:
            beside_plain.close()
        return rows
    finally:
        _drop(url, prefix)


class RawRedisKeys:
    """The baseline of the idempotency rows: one ``SET key value NX`` per key, over the
    library's transport (see :class:`Pinned`).

    Args:
        url: a ``redis://`` URL; its ``prefix`` names the baseline's keys, deleted on close.
    """

    operation = "SET key value NX"

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = parse(url).prefix
        self.client = _client(url)
        self._send = Pinned(self.client)

    def put(self, keys: Sequence[str]) -> int:
        execute = self._send
        prefix = self.prefix
        new = 0
        for key in keys:
            if execute("SET", f"{prefix}:key:{{{key}}}", b"1", "NX"):
                new += 1
        return new

    def close(self) -> None:
        try:
            _drop(self.url, self.prefix)
        finally:
            self._send.close()


def compare_keys(url: str, calls: int) -> list[KeyRow]:
    """The idempotency rows on ``url``: ``@idempotent`` around a no-op beside ``SET NX``, each
    under a fresh prefix, deleted afterwards."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    target = _with_prefix(url, prefix)
    try:
        library = LibraryKeys(connect(target))
        try:
            raw = RawRedisKeys(raw_url(target))
            try:
                return run_keys("rediss" if parse(url).tls else "redis", library, raw, calls)
            finally:
                raw.close()
        finally:
            library.close()
    finally:
        _drop(url, prefix)


_CAS = """
if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'value', ARGV[3])
return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
"""


class RawRedisGuards:
    """The raw side of the guard rows, over the library's transport (see :class:`Pinned`): a
    script that writes a hash's
    version and value if the version matches, sent by ``EVALSHA``; a lock taken with ``SET key
    owner NX PX`` and released by a script that deletes it if the owner matches.

    Args:
        url: a ``redis://`` URL; its ``prefix`` names the baseline's keys, deleted on close.
    """

    cas_operation = "EVALSHA of HGET version, HSET version and value if it matches"
    lock_operation = "SET key owner NX PX, EVALSHA of GET, DEL if the owner matches"

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = parse(url).prefix
        self.client = _client(url)
        self._send = Pinned(self.client)
        execute = self._send
        self._cas = execute("SCRIPT", "LOAD", _CAS)
        self._release = execute("SCRIPT", "LOAD", _RELEASE)

    def create(self, keys: Sequence[str]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hset(f"{self.prefix}:rec:{{{key}}}", mapping={"v": 1, "value": b"{}"})
        pipe.execute()

    def compare_and_set(self, keys: Sequence[str], values: Sequence[bytes]) -> int:
        execute = self._send
        prefix, sha = self.prefix, self._cas
        written = 0
        for key, value in zip(keys, values, strict=True):
            written += execute("EVALSHA", sha, 1, f"{prefix}:rec:{{{key}}}", 1, 2, value)
        return written

    def lock_cycles(self, name: str, owner: str, count: int) -> int:
        execute = self._send
        key, sha, ttl = f"{self.prefix}:lock:{{{name}}}", self._release, int(LOCK_TTL * 1000)
        acquired = 0
        for _ in range(count):
            if execute("SET", key, owner, "NX", "PX", ttl):
                acquired += 1
            execute("EVALSHA", sha, 1, key, owner)
        return acquired

    def close(self) -> None:
        try:
            _drop(self.url, self.prefix)
        finally:
            self._send.close()


def compare_guards(url: str, calls: int) -> list[GuardRow]:
    """The guard rows on ``url``: :class:`~agentlease.SharedState` beside the raw scripts and
    commands, each under a fresh prefix, deleted afterwards."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    target = _with_prefix(url, prefix)
    try:
        library = LibraryGuards(connect(target))
        try:
            raw = RawRedisGuards(raw_url(target))
            try:
                return run_guards("rediss" if parse(url).tls else "redis", library, raw, calls)
            finally:
                raw.close()
        finally:
            library.close()
    finally:
        _drop(url, prefix)


def _percentiles(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49] * 1e3, cuts[98] * 1e3


def _fill(q: Queue, queue: str, count: int, chunk: int = 5000) -> None:
    for start in range(0, count, chunk):
        stop = min(count, start + chunk)
        q.enqueue_many(queue, [TaskSpec(payload={"n": i}) for i in range(start, stop)])


def _claim_latencies(q: Queue, queues: tuple[str, str], samples: int) -> list[list[float]]:
    """Seconds of ``samples`` one-task claims from each queue, taken in turns so that both
    queues see the same machine. Untimed, each job is completed and a new task enqueued, so the
    depth of each queue stays what it was."""
    times: list[list[float]] = [[], []]
    for i in range(samples):
        for k, queue in enumerate(queues):
            start = time.perf_counter()
            (job,) = q.claim(queue)
            times[k].append(time.perf_counter() - start)
            q.complete(job.lease)
            q.enqueue(queue, {"n": i})
    return times


def _used_memory(url: str) -> int:
    client = _client(url)
    try:
        info: Any = client.info("memory")
        if "used_memory" not in info:  # a cluster answers per node
            return sum(int(node["used_memory"]) for node in info.values())
        return int(info["used_memory"])
    finally:
        client.close()


def latency_and_extend(url: str, *, deep: int = 1_000_000, samples: int = 2_000) -> dict[str, Any]:
    """Claim latency at two depths, one extend of 10,000 leases, and reaping costs.

    Everything runs under a fresh prefix on ``url``, deleted afterwards.

    Returns:
        Milliseconds (``*_ms``), the depths measured, and bytes of Redis memory per queued task.
    """
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    q = Queue(connect(_with_prefix(url, prefix)))
    out: dict[str, Any] = {"shallow": 1_000, "deep": deep, "samples": samples}
    log = logging.getLogger("agentlease")
    level = log.level
    log.setLevel(logging.ERROR)  # a thousand "reaped" warnings are not the point here
    try:
        _fill(q, "shallow", 1_000)
        before = _used_memory(url)
        start = time.perf_counter()
        _fill(q, "deep", deep)
        out["fill_s"] = round(time.perf_counter() - start, 1)
        out["bytes_per_task"] = round((_used_memory(url) - before) / deep)
        _claim_latencies(q, ("shallow", "deep"), 100)  # warm up connections and caches
        shallow, deep_times = _claim_latencies(q, ("shallow", "deep"), samples)
        out["claim_p50_ms_1k"], out["claim_p99_ms_1k"] = _percentiles(shallow)
        out["claim_p50_ms_1m"], out["claim_p99_ms_1m"] = _percentiles(deep_times)
        out["p50_ratio"] = round(out["claim_p50_ms_1m"] / out["claim_p50_ms_1k"], 3)
        out["p99_ratio"] = round(out["claim_p99_ms_1m"] / out["claim_p99_ms_1k"], 3)

        leases = [j.lease for _ in range(10) for j in q.claim("deep", 1_000, lease_for=60)]
        start = time.perf_counter()
        renewed = q.extend(leases, lease_for=60)
        out["extend_10k_ms"] = (time.perf_counter() - start) * 1e3
        assert all(r is not None for r in renewed)

        start = time.perf_counter()
        assert q.reap("deep") == []
        out["reap_none_expired_ms"] = (time.perf_counter() - start) * 1e3  # 10k live leases
        q.claim("deep", 1_000, lease_for=0.05)
        time.sleep(0.1)
        start = time.perf_counter()
        reaped = q.reap("deep")
        out["reap_1000_expired_ms"] = (time.perf_counter() - start) * 1e3
        assert len(reaped) == 1_000
    finally:
        log.setLevel(level)
        q.close()
        _drop(url, prefix)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


def main(argv: list[str]) -> int:
    """``python -m agentlease.bench.redis_rows URL [TASKS]``: print every figure as JSON."""
    if not argv:
        print("usage: python -m agentlease.bench.redis_rows redis://host:port/0 [tasks]")
        return 2
    url = argv[0]
    if not url.startswith(("redis://", "rediss://")):
        raise InvalidURL(f"not a Redis URL: {redact_url(url)!r}")
    tasks = int(argv[1]) if len(argv) > 1 else 30_000
    rows = compare(url, tasks=tasks)
    print(json.dumps({"rows": [r.as_json() for r in rows]}, indent=1), flush=True)
    keys = compare_keys(url, DEFAULT_CALLS)
    print(json.dumps({"keys": [r.as_json() for r in keys]}, indent=1), flush=True)
    guards = compare_guards(url, DEFAULT_GUARDS)
    print(json.dumps({"guards": [r.as_json() for r in guards]}, indent=1), flush=True)
    print(json.dumps(latency_and_extend(url), indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
