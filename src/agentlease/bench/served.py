"""The ``bench`` rows on a served store (Redis or PostgreSQL): which backend module measures
them, the latency lines (claim latency deep vs shallow, one extend of 10,000 leases), and the
fresh library and baseline stores the worker row (:mod:`agentlease.bench.workers`) runs on."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from agentlease._codec import JSON
from agentlease.bench.guards import GuardRow
from agentlease.bench.keys import KeyRow

if TYPE_CHECKING:
    from agentlease.bench.command import Row, Stores

__all__ = ["SERVED", "fresh_stores", "latency_rows", "measure"]

SERVED = ("redis", "rediss", "postgresql", "postgres")


def measure(
    url: str,
    kind: str,
    *,
    tasks: int,
    processes: int,
    batch: int,
    latency: bool,
    keys: int,
    guards: int,
) -> tuple[list[Row], list[KeyRow], list[GuardRow], list[dict[str, JSON]]]:
    """The rows on Redis or PostgreSQL, each backend's own ``compare`` in fresh namespaces:
    throughput rows, idempotency rows, guard rows, and latency lines (if ``latency``)."""
    extra: list[dict[str, JSON]] = []
    key_rows: list[KeyRow] = []
    guard_rows: list[GuardRow] = []
    if kind.startswith("redis"):
        from agentlease.bench import redis_rows as _bench_redis

        rows = _bench_redis.compare(url, tasks=tasks, batch=batch, processes=processes)
        if keys:
            key_rows = _bench_redis.compare_keys(url, keys)
        if guards:
            guard_rows = _bench_redis.compare_guards(url, guards)
        if latency:
            f = _bench_redis.latency_and_extend(url)
            extra = latency_rows(
                kind,
                (f["claim_p50_ms_1m"], f["claim_p99_ms_1m"]),
                (f["claim_p50_ms_1k"], f["claim_p99_ms_1k"]),
                f["extend_10k_ms"],
            )
    else:
        from agentlease.bench import postgres_rows as _bench_postgres

        rows = _bench_postgres.compare(url, tasks, processes=processes, batch=batch)
        if keys:
            key_rows = _bench_postgres.compare_keys(url, keys)
        if guards:
            guard_rows = _bench_postgres.compare_guards(url, guards)
        if latency:
            f = _bench_postgres.latency_and_extend(url)
            extra = latency_rows(
                kind,
                (f["p50_deep"], f["p99_deep"]),
                (f["p50_shallow"], f["p99_shallow"]),
                f["extend_ms"],
            )
    return rows, key_rows, guard_rows, extra


def latency_rows(
    kind: str, deep: tuple[float, float], shallow: tuple[float, float], extend_ms: float
) -> list[dict[str, JSON]]:
    """Claim latency (p50, p99 in ms) with 1,000,000 vs 1,000 queued, as rates so that
    ratio = shallow latency / deep latency, and the one-call extend of 10,000 leases."""
    p50_deep, p99_deep = deep
    p50_shallow, p99_shallow = shallow
    rows: list[dict[str, JSON]] = []
    for label, d, s in (("p50", p50_deep, p50_shallow), ("p99", p99_deep, p99_shallow)):
        rows.append(
            {
                "name": f"claim latency {label}, 1,000,000 vs 1,000 queued",
                "backend": kind,
                "ops_per_s": round(1000 / d, 1) if d else 0.0,
                "baseline_ops_per_s": round(1000 / s, 1) if s else 0.0,
                "ratio": round(s / d, 3) if d else 0.0,
                "detail": f"{d:.3f} ms vs {s:.3f} ms",
            }
        )
    rows.append(
        {
            "name": "one extend call for 10,000 leases",
            "backend": kind,
            "ops_per_s": round(10_000 / (extend_ms / 1000), 1) if extend_ms else 0.0,
            "baseline_ops_per_s": None,
            "ratio": None,
            "detail": f"{extend_ms:.1f} ms",
        }
    )
    return rows


@contextmanager
def fresh_stores(url: str, kind: str) -> Iterator[Stores]:
    """The library and its raw baseline on the server of ``url``, as the throughput rows use
    them (``RedisStores``: a fresh key prefix and the raw one's; ``PostgresStores``: a fresh
    library schema and a raw one), deleted afterwards."""
    if kind.startswith("redis"):
        from agentlease.bench import redis_link
        from agentlease.bench.redis_rows import RedisStores

        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        try:
            redis_stores = RedisStores(redis_link.with_prefix(url, prefix))
            try:
                yield redis_stores
            finally:
                redis_stores.close()
        finally:
            redis_link.drop(url, prefix)
        return
    from agentlease.backends._postgres_url import parse
    from agentlease.bench import postgres_rows

    library = postgres_rows._fresh_schema(parse(url), "agentlease_bench")
    try:
        postgres_stores = postgres_rows.PostgresStores(library.url, Path("."))
        try:
            yield postgres_stores
        finally:
            postgres_stores.close()
    finally:
        postgres_rows._drop(library)
