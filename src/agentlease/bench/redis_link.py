"""How the Redis rows of ``agentlease bench`` reach the server: the raw baselines' transport
(:class:`Pinned`: the one the library uses for its scripts, see
:mod:`agentlease.backends._async.redis_link`), their clients, and fresh key prefixes.
"""

from __future__ import annotations

import uuid
from typing import Any

import redis

from agentlease.backends._redis_url import parse
from agentlease.backends._sync.redis_link import RedisLink

__all__ = ["Pinned", "client", "drop", "raw_url", "with_prefix"]


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
    """Commands over the library's own transport for scripts: a
    :class:`~agentlease.backends._sync.redis_link.RedisLink` around ``client`` (on a plain
    Redis, one connection kept out of the pool; on a cluster, the client), without the link's
    retries, so that a raw baseline and the library differ only in what they send.

    Args:
        client: a redis-py client; closed by :meth:`close`.
    """

    def __init__(self, client: redis.Redis | redis.RedisCluster) -> None:
        self.client = client
        self._link = RedisLink(client, "bench")
        self._send: Any = self._link._execute

    def __call__(self, *args: Any) -> Any:
        """Send one command and return its reply."""
        return self._send(*args)

    def close(self) -> None:
        """Give the connection back and close the client."""
        self._link.close()
