"""What both faces of the PostgreSQL backend share; written by hand, not generated.

The asyncio backend (``backends/_async/postgres_*.py``) is the one source of truth and its
synchronous twin is generated from it; this module holds what the two faces cannot spell the same
way (``async_sleep``/``sync_sleep``, ``async_lock``/``sync_lock``) and what they share:

* :func:`translate`, the ONE place where psycopg errors become agentlease errors (the original
  is kept as ``__cause__`` by the ``raise ... from`` at each call site);
* the named queries and the versioned migrations, read from ``.sql`` files with
  :mod:`importlib.resources`;
* the JSON adapters: payloads cross the seam as the exact bytes the client encoded and are stored
  in ``json`` columns, which keep those bytes verbatim;
* :func:`channel`, the LISTEN/NOTIFY channel of a queue, derived from schema and queue by a hash
  so that any queue name is a safe channel name.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import select
import threading
import time
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, LiteralString

import psycopg
from psycopg import errors, pq
from psycopg.abc import Buffer
from psycopg.adapt import Dumper, Loader
from psycopg_pool import PoolTimeout

from agentlease._records import Task, task_from_row
from agentlease.backends._sqlfile import queries
from agentlease.backends.base import AsyncBackend, Backend
from agentlease.errors import (
    AuthenticationFailed,
    BackendError,
    BackendRefused,
    BackendUnavailable,
    PermissionDenied,
    SchemaNotMigrated,
    TLSRefused,
)

if TYPE_CHECKING:
    from agentlease.backends._postgres_url import PostgresSettings

__all__ = [
    "MIGRATE_HINT",
    "MIGRATIONS",
    "AsyncFace",
    "Migration",
    "Q",
    "async_face",
    "async_lock",
    "async_sleep",
    "channel",
    "configure",
    "stale",
    "sync_face",
    "sync_lock",
    "sync_sleep",
    "task",
    "translate",
]

async_sleep = asyncio.sleep
sync_sleep = time.sleep


def async_lock() -> asyncio.Lock:
    """A lock for the asyncio face (``sync_lock`` in the generated twin)."""
    return asyncio.Lock()


def sync_lock() -> threading.Lock:
    """A lock for the synchronous face."""
    return threading.Lock()


# The generated twin renames AsyncBackend to Backend; the asyncio face's ``open_async`` names its
# return type by this alias so that both faces keep returning an asyncio backend.
AsyncFace = AsyncBackend


def sync_face(settings: PostgresSettings, *, migrated: bool = False) -> Backend:
    """A new synchronous backend on the same database (its own pool, opened on first use)."""
    from agentlease.backends._sync.postgres_backend import PostgresBackend

    return PostgresBackend(settings, migrated=migrated)


def async_face(settings: PostgresSettings, *, migrated: bool = False) -> AsyncBackend:
    """A new asyncio backend on the same database (its own pool, opened on first use)."""
    from agentlease.backends._async.postgres_backend import AsyncPostgresBackend

    return AsyncPostgresBackend(settings, migrated=migrated)


# -- SQL files ------------------------------------------------------------------------------------

_PACKAGE = "agentlease.backends.sql"
_MIGRATION_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


def _trusted(text: str) -> LiteralString:
    # The text comes from this package's own .sql files, as fixed as a literal in the source;
    # nothing a caller passes ever reaches it (callers' values go in as bound parameters).
    # (mypy treats LiteralString as str, so this is where a stricter checker would need a cast.)
    return text


Q: dict[str, LiteralString] = {
    name: _trusted(sql) for name, sql in queries(_PACKAGE, "postgres.sql").items()
}


@dataclass(frozen=True, slots=True)
class Migration:
    """One versioned migration file: ``postgres_migrations/NNNN_name.sql``."""

    version: int
    name: str
    sql: LiteralString


@cache
def _migrations() -> tuple[Migration, ...]:
    folder = resources.files(_PACKAGE).joinpath("postgres_migrations")
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match:
            text = entry.read_text(encoding="utf-8")
            found.append(Migration(int(match.group(1)), match.group(2), _trusted(text)))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions) or versions[:1] != [1]:
        raise RuntimeError(f"migrations must be numbered 1, 2, ... once each: {found}")
    return tuple(found)


MIGRATIONS = _migrations()


# -- JSON as bytes --------------------------------------------------------------------------------

_JSON_OID = psycopg.postgres.types["json"].oid


class _JsonBytesDumper(Dumper):
    """``bytes`` parameters go to the server as ``json``, byte for byte (no bytea is used)."""

    oid = _JSON_OID

    def dump(self, obj: bytes) -> Buffer:
        return obj


class _JsonBytesBinaryDumper(_JsonBytesDumper):
    format = pq.Format.BINARY  # json's binary form is its text


class _JsonBytesLoader(Loader):
    """``json`` columns come back as the bytes stored, never parsed here."""

    def load(self, data: Buffer) -> bytes:
        return bytes(data)


def configure(conn: psycopg.BaseConnection[Any]) -> None:
    """Install the JSON adapters on one connection of the backend's pool."""
    conn.adapters.register_dumper(bytes, _JsonBytesDumper)
    conn.adapters.register_dumper(bytes, _JsonBytesBinaryDumper)
    conn.adapters.register_loader("json", _JsonBytesLoader)


def stale(conn: psycopg.BaseConnection[Any]) -> bool:
    """Whether a pooled connection died while it sat idle: the pool must not hand it out.

    An idle connection receives nothing unless the server is shutting it down (a restart, an
    administrator's terminate) or has closed it, so a readable socket means it is dead (or, very
    rarely, holds a message nobody needs: dropping it then costs one reconnect). One poll, no
    round trip: after a restart the pool replaces its connections instead of failing calls.
    """
    pgconn = conn.pgconn
    if pgconn.status != pq.ConnStatus.OK:
        return True
    if _HAS_POLL:
        poller = select.poll()
        poller.register(pgconn.socket, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([pgconn.socket], [], [], 0)  # Windows: no poll()
    return bool(readable)


_HAS_POLL = hasattr(select, "poll")


def channel(schema: str, queue: str) -> str:
    """The NOTIFY channel of ``queue`` in ``schema``: a hash, so always a safe identifier."""
    digest = hashlib.blake2b(f"{schema}\x00{queue}".encode(), digest_size=12).hexdigest()
    return f"agentlease_{digest}"


# -- errors ---------------------------------------------------------------------------------------

_MISSING = (errors.UndefinedTable, errors.UndefinedFunction, errors.InvalidSchemaName)
# A server that cannot take writes now (a standby, a failover under way), as Redis's READONLY:
# an outage to wait out, not a permanent refusal.
_NOT_NOW = errors.ReadOnlySqlTransaction
MIGRATE_HINT = "run: agentlease migrate --backend URL"
# A refused login carries no SQLSTATE in psycopg (libpq keeps none for connection failures), so
# it is known by libpq's and the server's words (a server that reports in another language
# than English is not recognised: its refusals stay BackendUnavailable).
_LOGIN_REFUSED = (
    "authentication failed for user",  # password, and peer, ident, ldap, cert, ...
    "no pg_hba.conf entry for",
    "pg_hba.conf rejects connection",
    "no password supplied",
    "is not permitted to log in",
    'authentication method requirement "',  # libpq's require_auth
)
# libpq's words (and the server's, for a client certificate hba requires) for a TLS setup that
# fails the same way every time, each with what it means for the user.
_TLS_REFUSED = (
    ("certificate verify failed", "the server's certificate could not be verified"),
    ("does not match host name", "the host name does not match the server's certificate"),
    ("connection requires a valid client certificate", "the server requires a client certificate"),
    ("certificate authentication failed for user", "the server refused the client certificate"),
    ("alert certificate required", "the server requires a client certificate"),
    ("alert unknown ca", "the server does not trust the client certificate's CA"),
    ("alert bad certificate", "the server refused the client certificate"),
    ("alert certificate unknown", "the server refused the client certificate"),
    ("server does not support SSL", "the server does not offer TLS, which sslmode requires"),
    ("root certificate file", "the CA file (sslrootcert) cannot be read"),
    ("could not open certificate file", "the client certificate (sslcert) cannot be read"),
    ("could not load private key file", "the client key (sslkey) cannot be read"),
    ("private key file", "the client key (sslkey) cannot be used"),
)
_TLS_HINTS = {
    "the server's certificate could not be verified": "sslrootcert must name the CA that signed it",
    "the host name does not match the server's certificate": (
        "connect by a name or address the certificate lists"
    ),
    "the server requires a client certificate": "give sslcert and sslkey",
}
_ROLE_MISSING = re.compile(r'role ".*" does not exist')
_DATABASE_MISSING = re.compile(r'database ".*" does not exist')


def translate(
    settings: PostgresSettings, exc: psycopg.Error, *, migrating: bool = False
) -> BackendError:
    """The one place where psycopg errors become agentlease errors.

    Callers ``raise translate(settings, exc) from exc`` so the driver's error stays the cause.
    Connection failures, timeouts, shutdowns, a closed pool and a read-only server (a standby,
    a failover under way) are :class:`BackendUnavailable` (transient). What retrying cannot fix
    is a :class:`BackendRefused` (permanent): a refused login (:class:`AuthenticationFailed`), a
    failed TLS setup (:class:`TLSRefused`: the server's certificate not verified or not naming
    the host, a client certificate required or refused, a TLS file that cannot be read), a
    missing privilege (:class:`PermissionDenied`), a missing database, and a schema without the
    agentlease tables (:class:`SchemaNotMigrated`, whose message says how to fix it).
    A missing privilege's message names the privilege and the object agentlease needs (the
    CREATE that migrating needs when ``migrating``).
    """
    detail = " ".join(str(exc).split()) or type(exc).__name__
    where = f"PostgreSQL {settings.display}"
    if isinstance(exc, _MISSING):
        return SchemaNotMigrated(
            f"{where}: schema {settings.schema!r} lacks the agentlease tables or is out of date "
            f"({detail}); {MIGRATE_HINT}"
        )
    refused = _refused_login(where, exc, detail)
    if refused is not None:
        return refused
    if isinstance(exc, errors.InsufficientPrivilege):
        from agentlease._rights import explain_postgres_denial

        why = explain_postgres_denial(settings.schema, detail, migrating=migrating)
        return PermissionDenied(f"{where}: {why}")
    if isinstance(exc, PoolTimeout):
        return BackendUnavailable(
            f"{where} is unavailable: no connection within pool_timeout={settings.pool_timeout:g}s "
            f"(the server is down or unreachable, or all pool_max={settings.pool_max} "
            "connections of this client are busy)"
        )
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | _NOT_NOW):
        return BackendUnavailable(f"{where} is unavailable: {detail}")
    return BackendError(f"{where}: {type(exc).__name__}: {detail}")


def _refused_login(where: str, exc: psycopg.Error, detail: str) -> BackendRefused | None:
    """The permanent error a refused connection stands for, or None if it may be transient."""
    if isinstance(exc, errors.InvalidAuthorizationSpecification | errors.InvalidPassword):
        return AuthenticationFailed(f"{where}: authentication failed: {detail}")
    if isinstance(exc, errors.InvalidCatalogName):
        return BackendRefused(f"{where}: no such database: {detail}")
    if not isinstance(exc, psycopg.OperationalError) or exc.sqlstate is not None:
        return None
    for words, why in _TLS_REFUSED:
        if words in detail:
            hint = _TLS_HINTS.get(why)
            return TLSRefused(
                f"{where}: TLS refused: {why}" + (f" ({hint})" if hint else "") + f": {detail}"
            )
    if any(words in detail for words in _LOGIN_REFUSED) or _ROLE_MISSING.search(detail):
        return AuthenticationFailed(f"{where}: authentication failed: {detail}")
    if "permission denied for database" in detail:
        return PermissionDenied(f"{where}: {detail}")
    if _DATABASE_MISSING.search(detail):
        return BackendRefused(f"{where}: no such database: {detail}")
    return None


# -- rows -----------------------------------------------------------------------------------------


def task(row: tuple[Any, ...]) -> Task:
    """A :class:`Task` from the 21 columns that ``dead`` and ``fail_*`` return (22 from ``get``:
    the cancel reason too)."""
    return task_from_row(row)
