"""Opening the Redis backend: URL parsing, client settings, and driver-error translation.

``connect(url)`` and ``connect_async(url)`` are what :func:`agentlease.connect` dispatches to for
``redis://`` and ``rediss://`` URLs::

    redis://[user[:password]@]host[:port][/db][?option=value&...]
    rediss://...                 TLS

=================== =========================================================================
option              meaning
=================== =========================================================================
prefix              first part of every key (default ``agentlease``): letters, digits, ``_.-``
cluster             ``1`` for Redis Cluster (``host:port`` is any node; db must be 0)
socket_timeout      seconds to wait for a reply (default 10)
connect_timeout     seconds to wait for a connection (default 3)
ssl_cert_reqs       ``required`` (default), ``optional`` or ``none`` (rediss only)
ssl_ca_certs        CA bundle to verify the server with (rediss only)
ssl_certfile        client certificate, for mutual TLS (rediss only)
ssl_keyfile         the client certificate's key (rediss only)
ssl_check_hostname  ``0`` to skip the host name check (rediss only)
=================== =========================================================================

Opening does no I/O (except for a cluster's synchronous client, which reads the slot map): a
wrong password or an unreachable host surface at the first call, within the connect timeout: an
unreachable host as :class:`~agentlease.errors.BackendUnavailable` (transient), a refused login
as :class:`~agentlease.errors.AuthenticationFailed`, a command the user's ACL forbids as
:class:`~agentlease.errors.PermissionDenied` and a failed TLS handshake (a server certificate
that the CA of ``ssl_ca_certs`` did not sign or that does not name the host, a server that
requires a client certificate or refuses the one given) as :class:`~agentlease.errors.TLSRefused`
(all three :class:`~agentlease.errors.BackendRefused`: permanent, retrying cannot help).

How a TLS failure is told from an outage is :mod:`agentlease.backends._redis_tls`'s part.

Every driver error reaches the caller through :func:`translate`, the one place where redis-py's
exceptions become agentlease's (the driver's exception is kept as ``__cause__``).
"""

from __future__ import annotations

import inspect
import math
import os
import re
import select
import threading
import time
from asyncio import sleep as async_sleep
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

import redis as redis_sync
import redis.asyncio as redis_asyncio
from redis import exceptions as rx

from agentlease._redact import misplaced_at, redact_url, unreadable
from agentlease.backends._redis_tls import tls_reason
from agentlease.backends.base import AsyncBackend as AsyncFace
from agentlease.backends.base import Backend as SyncFace
from agentlease.errors import (
    AuthenticationFailed,
    BackendError,
    BackendUnavailable,
    InvalidURL,
    PermissionDenied,
    TLSRefused,
)

__all__ = [
    "DRIVER_ERRORS",
    "PACK",
    "REFUSED_REPLIES",
    "AsyncFace",
    "Gate",
    "RedisOptions",
    "SyncFace",
    "async_gate",
    "async_sleep",
    "closed_while_idle",
    "closer",
    "connect",
    "connect_async",
    "forks",
    "parse",
    "pool_args",
    "redis_asyncio",
    "redis_sync",
    "sync_gate",
    "sync_sleep",
    "translate",
    "twin_async",
    "twin_sync",
]

sync_sleep = time.sleep

PACK: Callable[[tuple[Any, ...]], bytes] | None
"""hiredis's packer of one command (the one redis-py's own serializer ends in), or None."""
try:
    from hiredis import pack_command as PACK
except ImportError:  # pragma: no cover - the redis extra installs hiredis
    PACK = None

_forks = [0]
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


def forks() -> int:
    """How many forks lie between the first process and this one (a child's count is higher
    than its parent's): a connection taken at another count belongs to another process."""
    return _forks[0]


# -- redis-py from 5.0 on ----------------------------------------------------------------------
# The floors in pyproject.toml are tested (scripts/floors.sh); where redis-py changed an API the
# link uses, these pick the spelling of the installed version, once.


def pool_args(pool: Any) -> tuple[str, ...]:
    """The arguments for ``pool.get_connection``: a command name before redis-py 5.3, which
    requires one, and none after (5.3 deprecates it)."""
    param = inspect.signature(pool.get_connection).parameters.get("command_name")
    if param is not None and param.default is inspect.Parameter.empty:
        return ("EVALSHA",)
    return ()


def closer(client: Any) -> Any:
    """The method that closes ``client``: ``aclose`` on an asyncio client from redis-py 5.0.1
    on (which deprecates ``close`` there), ``close`` on 5.0.0's and on a sync client."""
    return getattr(client, "aclose", None) or client.close


def closed_while_idle(conn: Any) -> bool | None:
    """Whether an idle connection's socket has something to read, which means the server closed
    it (a restart, its ``timeout``, ``CLIENT KILL``): one poll, no I/O. None if it has no socket
    to look at (not connected).

    redis-py's own check (``can_read``) on an asyncio connection only sees what the event loop
    has already read: a socket closed since the loop last ran looks healthy, and a claim, which
    is never sent twice, would fail on it. The socket itself knows at once.
    """
    sock = getattr(conn, "_sock", None)  # a sync connection
    if sock is None:
        writer = getattr(conn, "_writer", None)  # an asyncio one
        sock = None if writer is None else writer.transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        fd = sock.fileno()
    except OSError:
        return True
    if fd < 0:
        return True
    if _HAS_POLL:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)  # Windows: no poll()
    return bool(readable)


_HAS_POLL = hasattr(select, "poll")


class Gate(Protocol):
    """Lets one caller at a time through, and turns the others away at once (never waits)."""

    def acquire(self, blocking: bool = ...) -> bool: ...

    def release(self) -> None: ...


class _Flag:
    """A :class:`Gate` for one event loop: nothing runs between the check and the set."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = False

    def acquire(self, blocking: bool = False) -> bool:
        if self._held:
            return False
        self._held = True
        return True

    def release(self) -> None:
        self._held = False


def async_gate() -> Gate:
    """A gate for the asyncio face (``sync_gate`` in the generated twin)."""
    return _Flag()


def sync_gate() -> Gate:
    """A gate for the synchronous face, whose callers may be threads."""
    return threading.Lock()


# A prefix holds no ':', so that ':' ends it in every key: the keys of prefix ``a`` start with
# ``a:`` or ``{a:`` and no other prefix's do (a prefix ``a:b`` would share them).
_PREFIX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_TLS_OPTIONS = {
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_check_hostname",
}
_OPTIONS = {"prefix", "cluster", "socket_timeout", "connect_timeout", *_TLS_OPTIONS}
_BOOLS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


@dataclass(frozen=True, slots=True)
class RedisOptions:
    """A parsed Redis URL.

    Attributes:
        url: the URL with its password masked, for messages.
        host, port, db, username, password: where and as whom to connect (the password is left
            out of the ``repr``).
        tls: ``rediss://``.
        prefix: the first part of every key.
        cluster: talk to a Redis Cluster.
        socket_timeout, connect_timeout: seconds.
        tls_options: the ``ssl_*`` settings for redis-py.
    """

    url: str
    host: str
    port: int
    db: int
    username: str | None
    password: str | None = field(repr=False)
    tls: bool
    prefix: str
    cluster: bool
    socket_timeout: float
    connect_timeout: float
    tls_options: tuple[tuple[str, object], ...]

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments shared by the four redis-py clients (sync/async, plain/cluster)."""
        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "username": self.username,
            "password": self.password,
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.connect_timeout,
            "decode_responses": False,
        }
        if not self.cluster:
            kwargs["db"] = self.db
        if self.tls:
            kwargs["ssl"] = True
            kwargs.update(self.tls_options)
        return kwargs


def _seconds(options: dict[str, str], name: str, default: float, url: str) -> float:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise InvalidURL(f"{name} must be a positive number of seconds in {redact_url(url)!r}")
    return value


def _flag(options: dict[str, str], name: str, default: bool, url: str) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    if raw.lower() not in _BOOLS:
        raise InvalidURL(f"{name} must be 1 or 0 in {redact_url(url)!r}, not {raw!r}")
    return _BOOLS[raw.lower()]


def parse(url: str) -> RedisOptions:
    """Parse a ``redis://`` or ``rediss://`` URL.

    Raises:
        InvalidURL: malformed, or an unknown or invalid option.
    """
    why = unreadable(url)
    if why:
        raise InvalidURL(why)
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise InvalidURL(f"malformed Redis URL {redact_url(url)!r}: {exc}") from None
    misplaced = misplaced_at(url, parts.netloc)
    if misplaced:
        raise InvalidURL(misplaced)
    try:
        port = parts.port
        host = parts.hostname
    except ValueError as exc:
        raise InvalidURL(f"malformed Redis URL {redact_url(url)!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("redis", "rediss"):
        raise InvalidURL(f"not a Redis URL: {redact_url(url)!r}")
    if parts.fragment:
        raise InvalidURL(f"Redis URLs take no #fragment: {redact_url(url)!r}")
    if parts.netloc.endswith(("@", ":")) or (parts.netloc and not host):
        raise InvalidURL(f"malformed host in Redis URL {redact_url(url)!r}")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise InvalidURL(f"the path of a Redis URL is a database number, not {parts.path!r}")
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise InvalidURL(f"malformed options in {redact_url(url)!r}: {exc}") from None
    options = dict(pairs)
    if len(options) != len(pairs):
        raise InvalidURL(f"an option is given twice in {redact_url(url)!r}")
    unknown = set(options) - _OPTIONS
    if unknown:
        raise InvalidURL(
            f"unknown Redis URL options {sorted(unknown)} in {redact_url(url)!r}; "
            f"known: {sorted(_OPTIONS)}"
        )
    tls_given = {k: v for k, v in options.items() if k in _TLS_OPTIONS}
    if tls_given and scheme != "rediss":
        raise InvalidURL(
            f"TLS options {sorted(tls_given)} need a rediss:// URL: {redact_url(url)!r}"
        )
    prefix = options.get("prefix", "agentlease")
    if not _PREFIX.fullmatch(prefix):
        raise InvalidURL(
            f"invalid prefix {prefix!r} in {redact_url(url)!r}: 1 to 64 characters from letters, "
            "digits and _.- (not starting with . or -; no ':', which ends the prefix in every key "
            "so that one prefix cannot reach another's keys)"
        )
    cluster = _flag(options, "cluster", False, url)
    db = int(path) if path else 0
    if cluster and db != 0:
        raise InvalidURL(f"Redis Cluster has only database 0: {redact_url(url)!r}")
    tls: list[tuple[str, object]] = []
    if "ssl_cert_reqs" in tls_given:
        reqs = tls_given["ssl_cert_reqs"].lower()
        if reqs not in ("required", "optional", "none"):
            raise InvalidURL(
                f"ssl_cert_reqs must be required, optional or none in {redact_url(url)!r}"
            )
        tls.append(("ssl_cert_reqs", reqs))
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if name in tls_given:
            if not tls_given[name]:
                raise InvalidURL(f"{name} needs a file path in {redact_url(url)!r}")
            tls.append((name, tls_given[name]))
    if "ssl_check_hostname" in tls_given:
        tls.append(("ssl_check_hostname", _flag(options, "ssl_check_hostname", True, url)))
    password = None if parts.password is None else unquote(parts.password)
    username = unquote(parts.username) if parts.username else None
    return RedisOptions(
        url=redact_url(url),
        host=host or "localhost",
        port=6379 if port is None else port,
        db=db,
        username=username,
        password=password,
        tls=scheme == "rediss",
        prefix=prefix,
        cluster=cluster,
        socket_timeout=_seconds(options, "socket_timeout", 10.0, url),
        connect_timeout=_seconds(options, "connect_timeout", 3.0, url),
        tls_options=tuple(tls),
    )


DRIVER_ERRORS = (rx.RedisError, rx.RedisClusterException)
"""Everything redis-py raises on purpose (its cluster errors do not derive from RedisError)."""

# Errors that say the store cannot serve right now; anything else from Redis is a BackendError.
_UNAVAILABLE = (
    rx.ConnectionError,  # also refused connections, LOADING (a refused login is handled first)
    rx.TimeoutError,
    rx.ReadOnlyError,  # a replica promoted, or a failover in progress
    rx.ClusterError,  # the cluster is down, or redirections ran out during a failover
    rx.TryAgainError,
    rx.SlotNotCoveredError,
    rx.OutOfMemoryError,  # maxmemory reached: writes are refused until memory is freed
    rx.InvalidResponse,  # something that is not Redis answered
)
# Replies that say the server could not run the call now: an outage, which callers and workers
# wait out, not an error in the call.
_UNAVAILABLE_REPLIES = (
    "NOAUTH",
    "WRONGPASS",
    "LOADING",
    "READONLY",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "BUSY ",  # another client's script or function has run too long
    "MISCONF",  # the server cannot write its snapshot and refuses writes
    "NOREPLICAS",
    "OOM",
)
# A command a script calls, refused by the user's ACL: a plain error reply, not NOPERM (the words
# of Redis 7.0 and 7.1, then of 7.2 on).
_SCRIPT_DENIED = re.compile(r"user executing the script can't|ACL failure in script")
REFUSED_REPLIES = ("BUSY ", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN")
"""Replies to a call the server did not run: safe to send again whatever the call."""


def translate(url: str, exc: Exception) -> BackendError:
    """The one place where a redis-py exception becomes an agentlease error.

    Raise the result ``from exc`` so that the driver's exception stays the ``__cause__``.
    """
    message = str(exc) or type(exc).__name__
    why = tls_reason(exc, tls=url.startswith("rediss:"))
    if why is not None:  # permanent: the same handshake fails the same way
        return TLSRefused(f"Redis at {url}: TLS refused: {why}")
    # A cluster client that could reach no node says why in the error it chains (a refused login).
    cause = exc.__cause__ if isinstance(exc, rx.RedisClusterException) else exc
    if isinstance(cause, rx.RedisClusterException) and isinstance(
        cause.__context__, rx.NoPermissionError
    ):  # CLUSTER SLOTS refused by the ACL, which redis-py words as "cluster mode is not enabled"
        cause = cause.__context__
        message = str(cause)
    if isinstance(cause, rx.AuthenticationError | rx.AuthenticationWrongNumberOfArgsError) or (
        message.startswith(("WRONGPASS", "NOAUTH"))
    ):  # permanent: the same login fails the same way until the URL or the server's users change
        return AuthenticationFailed(f"Redis at {url}: authentication failed: {message}")
    if (
        isinstance(cause, rx.AuthorizationError | rx.NoPermissionError)
        or message.startswith("NOPERM")
        or (isinstance(exc, rx.ResponseError) and _SCRIPT_DENIED.search(message))
    ):  # permanent: the user's ACL lacks a command or a key (a script's commands count too)
        from agentlease._rights import explain_redis_denial

        return PermissionDenied(f"Redis at {url}: {explain_redis_denial(url, message)}")
    if isinstance(exc, _UNAVAILABLE) or message.startswith(_UNAVAILABLE_REPLIES):
        return BackendUnavailable(f"Redis at {url} is unavailable: {message}")
    if isinstance(exc, rx.RedisClusterException) and "connect" in message.lower():  # no node
        return BackendUnavailable(f"Redis Cluster at {url} is unavailable: {message}")
    return BackendError(f"Redis at {url}: {type(exc).__name__}: {message}")


def bounded(options: RedisOptions, call_timeout: float | None) -> RedisOptions:
    """``options`` whose socket and connect timeouts are at most ``call_timeout``."""
    if call_timeout is None:
        return options
    return replace(
        options,
        socket_timeout=min(options.socket_timeout, call_timeout),
        connect_timeout=min(options.connect_timeout, call_timeout),
    )


def twin_sync(options: RedisOptions) -> SyncFace:
    """A synchronous backend with a client of its own on the store of ``options``."""
    from agentlease.backends._sync.redis_backend import RedisBackend

    return RedisBackend(options)


def twin_async(options: RedisOptions) -> AsyncFace:
    """An asyncio backend with a client of its own on the store of ``options``."""
    from agentlease.backends._async.redis_backend import AsyncRedisBackend

    return AsyncRedisBackend(options)


def connect(url: str) -> SyncFace:
    """The synchronous Redis backend named by ``url`` (see the module docstring)."""
    return twin_sync(parse(url))


def connect_async(url: str) -> AsyncFace:
    """The asyncio Redis backend named by ``url``."""
    return twin_async(parse(url))
