"""A namespace of its own for a demo on a shared store, removed afterwards.

On Redis the demo's keys get a prefix of their own (``prefix=agentlease-demo-<run>``), on
PostgreSQL its tables a schema of their own (``schema=agentlease_demo_<run>``); when the demo ends,
the keys of that prefix (on every primary of a cluster) or the schema are dropped, unless the
user asked to keep them. A URL that names its own ``prefix`` or ``schema`` is used as it is (a
user whose rights end at that prefix or schema can run the demo there), and its data is left.
SQLite and memory demos need none: each runs in a database of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit

from agentlease._redact import redact_url
from agentlease.errors import InvalidURL

__all__ = ["Namespace", "namespace"]


@dataclass(frozen=True)
class Namespace:
    """Where a demo runs: its URL, what it is called, and how to remove it."""

    url: str
    name: str | None = None
    drop: Callable[[], None] | None = None


def _with_option(url: str, key: str, value: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != key]
    query.append((key, value))
    base = f"{parts.scheme}://{parts.netloc}{parts.path}"
    return f"{base}?{urlencode(query)}"


def namespace(url: str) -> Namespace:
    """A namespace of the demo's own on the store at ``url`` (the URL itself for SQLite and
    memory). The URL is validated by the backend when the demo connects."""
    scheme = url.split(":", 1)[0].lower()
    if scheme not in ("redis", "rediss", "postgresql", "postgres"):
        return Namespace(url)  # SQLite, memory, or a URL the backend will refuse
    try:
        given = {k for k, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True)}
    except ValueError:
        raise InvalidURL(f"malformed backend URL {redact_url(url)!r}") from None
    run = uuid.uuid4().hex[:8]
    if scheme in ("redis", "rediss") and "prefix" in given:
        return Namespace(url, "the key prefix it names: its keys are left there")
    if scheme in ("postgresql", "postgres") and "schema" in given:
        return Namespace(url, "the schema it names: its tables are left there")
    if scheme in ("redis", "rediss"):
        prefix = f"agentlease-demo-{run}"
        scoped = _with_option(url, "prefix", prefix)
        return Namespace(scoped, f"key prefix {prefix}", lambda: _drop_redis(scoped))
    if scheme in ("postgresql", "postgres"):
        schema = f"agentlease_demo_{run}"
        scoped = _with_option(url, "schema", schema)
        return Namespace(scoped, f"schema {schema}", lambda: _drop_postgres(scoped))
    return Namespace(url)


def _drop_redis(url: str) -> None:
    """Delete every key of the URL's prefix, on every primary."""
    import redis
    from redis.cluster import RedisCluster

    from agentlease.backends._redis_url import parse

    options = parse(url)
    kwargs = options.client_kwargs()
    if options.cluster:
        cluster = RedisCluster(**kwargs)
        try:
            primaries = [(n.host, n.port) for n in cluster.get_primaries()]  # type: ignore[no-untyped-call]
        finally:
            cluster.close()
        kwargs.pop("host")
        kwargs.pop("port")
        clients = [redis.Redis(host=h, port=p, **kwargs) for h, p in primaries]
    else:
        clients = [redis.Redis(**kwargs)]
    for client in clients:
        try:
            for pattern in (f"{{{options.prefix}:*", f"{options.prefix}:*"):
                batch = list(client.scan_iter(match=pattern, count=1000))
                for start in range(0, len(batch), 500):
                    client.unlink(*batch[start : start + 500])
        finally:
            client.close()


def _drop_postgres(url: str) -> None:
    """Drop the URL's schema and everything in it."""
    import psycopg
    from psycopg import sql

    from agentlease.backends._postgres_url import parse

    settings = parse(url)
    with psycopg.connect(settings.conninfo, autocommit=True) as conn:
        drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(settings.schema))
        conn.execute(drop)
