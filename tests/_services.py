"""The servers the contract suite runs against, and per-test namespaces on them.

Shared servers (Redis on 127.0.0.1:6379, PostgreSQL on 127.0.0.1:5432) are used only for plain
runs; each test gets its own namespace (a Redis key prefix, a PostgreSQL schema) and drops it
afterwards. Tests that must break a server start their own private one (see tests/faults).
"""

from __future__ import annotations

import os
import uuid
from functools import cache
from typing import Any

REDIS_URL = os.environ.get("AGENTLEASE_TEST_REDIS", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get("AGENTLEASE_TEST_POSTGRES", "postgresql://root@127.0.0.1:5432/test")


def namespace() -> str:
    """A fresh name for one test's keys or schema."""
    return f"t{uuid.uuid4().hex[:12]}"


@cache
def redis_problem() -> str | None:
    """Why the shared Redis cannot be used, or None if it can."""
    try:
        import redis
    except ImportError as exc:
        return f"redis-py not installed ({exc})"
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
        client.ping()
        client.close()
    except redis.RedisError as exc:
        return f"{REDIS_URL}: {exc}"
    return None


@cache
def postgres_problem() -> str | None:
    """Why the shared PostgreSQL cannot be used, or None if it can."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg not installed ({exc})"
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"{POSTGRES_URL}: {exc}"
    return None


def with_option(url: str, key: str, value: str) -> str:
    """``url`` with one more query option."""
    return f"{url}{'&' if '?' in url else '?'}{key}={value}"


def drop_redis_prefix(url: str, prefix: str) -> None:
    """Delete every key of one test's prefix (on every node of a cluster)."""
    for client in redis_primaries(url):
        _drop_keys(client, prefix)


def redis_primaries(url: str) -> list[Any]:
    """One plain client per primary of the server or cluster of ``url`` (the caller closes
    them): the cluster client's scan_iter(target_nodes=...) leaves a socket open (a
    ResourceWarning that fails the session when it is collected)."""
    import redis
    from redis.cluster import RedisCluster

    base = url.split("?", 1)[0]
    if "cluster=1" not in url:
        return [redis.Redis.from_url(base)]
    cluster = RedisCluster.from_url(base)
    try:
        nodes = [(n.host, n.port) for n in cluster.get_primaries()]
    finally:
        # RedisCluster.close() hands node connections back to their pools without closing
        # them: close the sockets now, not at some later garbage collection (a warning).
        for node in cluster.get_nodes():
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()
        cluster.close()
    return [redis.Redis(host=host, port=port) for host, port in nodes]


def _drop_keys(client: Any, prefix: str) -> None:
    try:
        for pattern in (f"{{{prefix}:*", f"{prefix}:*"):
            for key in list(client.scan_iter(match=pattern, count=1000)):
                client.delete(key)
    finally:
        client.close()


def drop_postgres_schema(schema: str) -> None:
    """Drop one test's schema."""
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
