"""Backends: one seam (``base``), one module per store, picked by URL scheme.

``connect(url)`` returns the synchronous face, ``connect_async(url)`` the asyncio face. Drivers
are imported lazily, only for the scheme asked for.

=============== ===================================== ======================================
scheme          example                               store
=============== ===================================== ======================================
memory          ``memory://``                         this process's memory (tests, harness)
sqlite          ``sqlite:///tasks.db``                a SQLite file (``sqlite:////abs.db``)
redis, rediss   ``redis://host:6379/0``               Redis or Redis Cluster (extra: redis)
postgresql      ``postgresql://user@host/db``         PostgreSQL (extra: postgres)
=============== ===================================== ======================================
"""

from __future__ import annotations

import importlib
from types import ModuleType
from urllib.parse import parse_qsl, urlsplit

from agentlease._redact import redact_url, unreadable
from agentlease.backends.base import AsyncBackend, Backend
from agentlease.errors import InvalidURL, MissingDriver

__all__ = ["AsyncBackend", "Backend", "connect", "connect_async"]

_SQLITE_OPTIONS = {"timeout", "synchronous"}


def connect(url: str) -> Backend:
    """Open the synchronous backend named by ``url``.

    Raises:
        InvalidURL: the URL is malformed, names an unknown scheme or an unknown option.
        BackendUnavailable: the store cannot be opened.
    """
    _check_url(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise InvalidURL(f"malformed backend URL {redact_url(url)!r}") from None
    scheme = parts.scheme.lower()
    if scheme == "memory":
        if parts.netloc or parts.path or parts.query:
            raise InvalidURL(f"memory URLs take no host, path or options: {redact_url(url)!r}")
        from agentlease.backends.memory import MemoryBackend

        return MemoryBackend(url=url)
    if scheme == "sqlite":
        return _sqlite(url, parts.netloc, parts.path, parts.query)
    native = _native(scheme)
    if native is not None:
        backend: Backend = native.connect(url)
        return backend
    raise InvalidURL(
        f"unsupported backend URL {redact_url(url)!r}: use memory://, sqlite:///path.db, "
        "redis://host, rediss://host or postgresql://user@host/db"
    )


def connect_async(url: str) -> AsyncBackend:
    """Open the asyncio backend named by ``url`` (same URLs and errors as :func:`connect`)."""
    _check_url(url)
    scheme = url.split(":", 1)[0].lower()
    native = _native(scheme)
    if native is not None:
        backend: AsyncBackend = native.connect_async(url)
        return backend
    sync = connect(url)
    if scheme == "sqlite":
        from agentlease.backends._threaded import ThreadedAsyncBackend
        from agentlease.backends.sqlite import SQLiteBackend

        assert isinstance(sync, SQLiteBackend)
        # The connection just opened becomes the async face's own; twins are opened on demand.
        return ThreadedAsyncBackend(sync, sync_factory=sync.twin)
    return sync.open_async()


def _check_url(url: object) -> None:
    """Refuse what no store could open: a URL that is not text, or holds a character that no
    driver passes on (see :func:`agentlease._redact.unreadable`). The URL is quoted back only
    with its password masked."""
    if not isinstance(url, str) or not url:
        what = "an empty str" if url == "" else type(url).__name__
        raise InvalidURL(f"backend URL must be a non-empty str, not {what}")
    why = unreadable(url)
    if why:
        raise InvalidURL(why)


# Backends with their own asyncio driver: scheme -> (module opening it, extra that installs it).
_NATIVE = {
    "redis": ("agentlease.backends._redis_url", "redis"),
    "rediss": ("agentlease.backends._redis_url", "redis"),
    "postgresql": ("agentlease.backends._postgres_url", "postgres"),
    "postgres": ("agentlease.backends._postgres_url", "postgres"),
}
_DRIVERS = {"redis", "hiredis", "psycopg", "psycopg_pool"}


def _native(scheme: str) -> ModuleType | None:
    """The module that opens ``scheme``'s backend, imported lazily with its driver."""
    entry = _NATIVE.get(scheme)
    if entry is None:
        return None
    module, extra = entry
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] in _DRIVERS:
            raise MissingDriver(scheme, extra) from exc
        if exc.name == module:
            return None  # this build has no such backend
        raise


def _sqlite(url: str, netloc: str, path: str, query: str) -> Backend:
    if netloc:
        raise InvalidURL(
            "SQLite URLs have no host: write sqlite:///relative.db or sqlite:////abs.db, "
            f"not {redact_url(url)!r}"
        )
    if not path.startswith("/") or len(path) < 2:
        raise InvalidURL(
            f"SQLite URL {redact_url(url)!r} names no file: write sqlite:///path/to/file.db"
        )
    file = path[1:]
    if file in (":memory:", "") or file.endswith("/"):
        raise InvalidURL(
            f"SQLite URL {redact_url(url)!r} must name a file that several processes can open; "
            "for an in-process store use memory://"
        )
    try:
        options = dict(parse_qsl(query, strict_parsing=bool(query)))
    except ValueError:
        raise InvalidURL(f"malformed options in {redact_url(url)!r}") from None
    unknown = set(options) - _SQLITE_OPTIONS
    if unknown:
        raise InvalidURL(f"unknown SQLite options {sorted(unknown)} in {redact_url(url)!r}")
    try:
        timeout = float(options.get("timeout", "30"))
    except ValueError as exc:
        raise InvalidURL(f"timeout must be a number of seconds in {redact_url(url)!r}") from exc
    synchronous = options.get("synchronous", "NORMAL").upper()
    if synchronous not in ("NORMAL", "FULL"):
        raise InvalidURL(f"synchronous must be NORMAL or FULL in {redact_url(url)!r}")
    from agentlease.backends.sqlite import SQLiteBackend

    return SQLiteBackend(file, timeout=timeout, synchronous=synchronous, url=url)
