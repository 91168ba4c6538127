"""How the Redis rows of ``agentlease bench`` reach the server: the raw baselines' transport
(:class:`Pinned`: the one the library uses for its scripts, see
:mod:`agentlease.backends._async.redis_link`), their clients, and fresh key prefixes.
"""

from __future__ import annotations

import uuid
from typing import Any

import redis

from agentlease.backends._redis_url import PACK, parse

__all__ = ["Pinned", "client", "drop", "pack", "raw_url", "with_prefix"]


def pack(args: tuple[Any, ...]) -> bytes:
    """One command in the protocol, packed by hiredis."""
    assert PACK is not None  # a Pinned connection exists only with hiredis
    return PACK(args)


def raw_url(url: str) -> str:
    """The URL of a fresh raw baseline beside the library's store at ``url`` (own prefix)."""
    return with_prefix(url, f"{parse(url).prefix}-raw-{uuid.uuid4().hex[:8]}")


def with_prefix(url: str, prefix: str) -> str:
    """``url`` with its ``prefix`` option set to ``prefix``."""
    base, _, query = url.partition("?")
    options = [o for o in query.split("&") if o and not o.startswith("prefix=")]
    return f"{base}?{'&'.join([*options, f'prefix={prefix}'])}"


def client(url: str) -> redis.Redis | redis.RedisCluster:
    """A synchronous redis-py client (plain or cluster) for ``url``."""
    options = parse(url)
    kwargs = options.client_kwargs()
    return redis.RedisCluster(**kwargs) if options.cluster else redis.Redis(**kwargs)


def drop(url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (UNLINK: freed in the background)."""
    store = client(url)
    try:
        for pattern in (f"{{{prefix}:*", f"{prefix}:*"):
            batch: list[bytes] = []
            for key in store.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    for k in batch:
                        store.unlink(k)
                    batch = []
            for k in batch:
                store.unlink(k)
    finally:
        store.close()


class Pinned:
    """Commands over one connection kept out of a client's pool (packed by hiredis, sent with
    ``send_packed_command``, read with ``read_response``, after the same ``can_read`` check), as
    the library sends its scripts on a plain Redis; through the client on a cluster, as the
    library does there.

    Args:
        client: a redis-py client.
    """

    def __init__(self, client: redis.Redis | redis.RedisCluster) -> None:
        self.client = client
        self._conn: Any = None
        if PACK is not None and isinstance(client, redis.Redis):
            pool: Any = client.connection_pool
            self._conn = pool.get_connection()

    def __call__(self, *args: Any) -> Any:
        """Send one command and return its reply."""
        conn = self._conn
        if conn is None:
            execute: Any = self.client.execute_command
            return execute(*args)
        if conn.can_read():
            conn.disconnect()
        conn.send_packed_command([pack(args)])
        return conn.read_response()

    def close(self) -> None:
        """Give the connection back and close the client."""
        try:
            if self._conn is not None and isinstance(self.client, redis.Redis):
                pool: Any = self.client.connection_pool
                pool.release(self._conn)
        finally:
            self.client.close()
