"""``postgresql://`` URLs: parsed and checked once into :class:`PostgresSettings`.

``agentlease.connect`` and ``connect_async`` come here for the schemes ``postgresql`` and
``postgres``. A URL is libpq's (user, password, host, port, database, and libpq options such as
``sslmode``) plus agentlease's own options, which never reach libpq:

=================== ======= ============================================================
option              default meaning
=================== ======= ============================================================
``schema``          public  the schema that holds the tables (created by the migrations)
``migrate``         true    apply pending migrations on first use (false: only check)
``pool_min``        1       connections each backend object keeps open
``pool_max``        10      most connections each backend object opens
``connect_timeout`` 5       seconds to establish a connection (also libpq's option)
``pool_timeout``    5       seconds to wait for a pooled connection before giving up
=================== ======= ============================================================

Every host form libpq reads is kept as libpq would read it: ``host[:port]``, several of them
separated by commas, an ``[IPv6]`` address, and a Unix socket, given as an empty host (libpq's
default socket: ``postgresql:///db``), a percent-encoded directory in the host part
(``postgresql://user@%2Fvar%2Frun%2Fpostgresql/db``) or ``host=`` in the query string
(``postgresql:///db?host=/var/run/postgresql``).

Unknown options, a malformed URL or a bad value raise :class:`~agentlease.errors.InvalidURL`.
Passwords (in the user part, or ``password``/``sslpassword`` options) never show: the settings'
``display`` masks them and their ``repr`` leaves out the URL and what libpq receives.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit

from agentlease._redact import SECRET_OPTIONS, misplaced_at, redact_url, unreadable
from agentlease.errors import InvalidURL

if TYPE_CHECKING:
    from agentlease.backends.base import AsyncBackend, Backend

__all__ = ["PostgresSettings", "connect", "connect_async", "parse"]

SCHEMES = ("postgresql", "postgres")
# libpq connection options that may ride along in the query string (everything else is refused).
LIBPQ_OPTIONS = frozenset(
    {
        "application_name",
        "channel_binding",
        "dbname",
        "gssencmode",
        "host",
        "hostaddr",
        "keepalives",
        "keepalives_count",
        "keepalives_idle",
        "keepalives_interval",
        "krbsrvname",
        "load_balance_hosts",
        "passfile",
        "password",
        "port",
        "require_auth",
        "service",
        "sslcert",
        "sslcrl",
        "sslkey",
        "sslmode",
        "sslpassword",
        "sslrootcert",
        "target_session_attrs",
        "tcp_user_timeout",
        "user",
    }
)
OWN_OPTIONS = frozenset(
    {"schema", "migrate", "pool_min", "pool_max", "connect_timeout", "pool_timeout"}
)
# Every query of the backend is an index lookup (a partial index by queue, or the primary key,
# with nested loops for joins against a list of ids). Stated for the planner, so that a plan made
# while a table was small, or with stale statistics, never becomes a scan of every task; and no
# JIT, whose compile time is larger than any of these statements.
PLANNER = (
    "-c enable_seqscan=off -c enable_bitmapscan=off -c enable_hashjoin=off "
    "-c enable_mergejoin=off -c jit=off"
)
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")  # fullmatch: "$" would let a final newline by
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True, slots=True)
class PostgresSettings:
    """Everything a PostgreSQL backend needs, checked once.

    Attributes:
        url: the URL as given (it may hold a password: never print it; use ``display``).
        display: the URL without its password, for messages.
        conninfo: what libpq receives (the URL without agentlease's options).
        schema: where the tables live; first on every connection's search_path.
        migrate: apply pending migrations on first use (otherwise only check for them).
        pool_min: connections kept open per backend object.
        pool_max: most connections per backend object.
        connect_timeout: seconds to establish one connection.
        pool_timeout: seconds to wait for a pooled connection.
        call_timeout: if set, the longest one statement may run (``statement_timeout``), and
            how long an unanswered connection is kept (TCP keepalives, ``tcp_user_timeout``);
            set on the connections of a worker's heartbeat.
    """

    url: str = field(repr=False)
    display: str
    conninfo: str = field(repr=False)
    schema: str = "public"
    migrate: bool = True
    pool_min: int = 1
    pool_max: int = 10
    connect_timeout: float = 5.0
    pool_timeout: float = 5.0
    call_timeout: float | None = None

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of every connection: autocommit, timeout, search_path, and index
        plans only (see :data:`PLANNER`); with ``call_timeout``, the bounds described there."""
        kwargs: dict[str, Any] = {
            "autocommit": True,
            # libpq counts whole seconds, at least 2; psycopg enforces the same bound in Python.
            "connect_timeout": max(2, math.ceil(self.connect_timeout)),
            "options": f"-c search_path={self.schema} {PLANNER}",
        }
        if self.call_timeout is not None:
            ms = max(1, int(self.call_timeout * 1000))
            kwargs["options"] += f" -c statement_timeout={ms}"
            kwargs["keepalives"] = 1
            kwargs["keepalives_idle"] = max(1, int(self.call_timeout))
            kwargs["keepalives_interval"] = 1
            kwargs["keepalives_count"] = 2
            kwargs["tcp_user_timeout"] = ms
        return kwargs

    def bounded(self, call_timeout: float | None) -> PostgresSettings:
        """The same settings, each statement bounded by ``call_timeout`` (see above)."""
        if call_timeout is None:
            return self
        return replace(self, call_timeout=call_timeout)

    def with_schema(self, schema: str) -> PostgresSettings:
        """The same server and options, another schema (validated)."""
        return parse(_replace_option(self.url, "schema", schema))


def _unsplit(parts: SplitResult, query: str) -> str:
    # Not urlunsplit: it drops the "//" of an empty host ("postgresql:///db" would become
    # "postgresql:/db", which libpq does not read as a URL), and libpq needs it kept.
    url = f"{parts.scheme}://{parts.netloc}{parts.path}"
    return f"{url}?{query}" if query else url


def _replace_option(url: str, key: str, value: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != key]
    query.append((key, value))
    return _unsplit(parts, urlencode(query))


_HOST_PORT = re.compile(r"(\[[^\]]*\]|[^:\[\]]*)(?::([0-9]*))?")  # ASCII digits: libpq's


def _check_hosts(netloc: str) -> None:
    """libpq's host part: ``host[:port]``, or several separated by commas; a host may be empty
    (the default socket), percent-encoded (a socket directory) or an ``[IPv6]`` address."""
    for item in netloc.rpartition("@")[2].split(","):
        match = _HOST_PORT.fullmatch(item)
        if match is None:
            raise InvalidURL(f"malformed host {item!r} in PostgreSQL URL")
        port = match.group(2)
        if port and not 0 < int(port) < 65536:
            raise InvalidURL(f"port {port} of PostgreSQL URL is out of range")


def _number(options: dict[str, str], key: str, default: float, low: float) -> float:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < low or value > 3600:
        raise InvalidURL(f"{key} must be a number of seconds from {low:g} to 3600, not {raw!r}")
    return value


def _integer(options: dict[str, str], key: str, default: int, low: int) -> int:
    raw = options.get(key)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= 1000:
        raise InvalidURL(f"{key} must be an integer from {low} to 1000, not {raw!r}")
    return int(raw)


def _redacted(parts: SplitResult) -> str:
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:***@{hosts}"
    query = [
        (k, "***" if k in SECRET_OPTIONS else v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    ]
    return _unsplit(parts._replace(netloc=netloc), urlencode(query, safe="/*"))


def parse(url: str) -> PostgresSettings:
    """Check a ``postgresql://`` URL and split it into libpq's part and agentlease's options.

    Raises:
        InvalidURL: malformed, another scheme, an unknown option or a bad value.
    """
    if not isinstance(url, str) or not url:
        raise InvalidURL(f"backend URL must be a non-empty str, not {redact_url(url)!r}")
    why = unreadable(url)
    if why:
        raise InvalidURL(why)
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise InvalidURL(f"malformed PostgreSQL URL: {exc}") from None
    misplaced = misplaced_at(url, parts.netloc)
    if misplaced:
        raise InvalidURL(misplaced)
    _check_hosts(parts.netloc)
    if parts.scheme.lower() not in SCHEMES:
        raise InvalidURL(f"not a PostgreSQL URL (postgresql://user@host/db): {redact_url(url)!r}")
    if parts.fragment:
        raise InvalidURL("PostgreSQL URLs take no #fragment")
    if parts.path.count("/") > 1:
        raise InvalidURL(f"the URL path names one database (/dbname), not {parts.path!r}")
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise InvalidURL(f"malformed options in PostgreSQL URL: {exc}") from None
    options: dict[str, str] = {}
    for key, value in pairs:
        if key in options:
            raise InvalidURL(f"option {key!r} is given twice")
        if key not in OWN_OPTIONS and key not in LIBPQ_OPTIONS:
            known = ", ".join(sorted(OWN_OPTIONS | LIBPQ_OPTIONS))
            raise InvalidURL(f"unknown PostgreSQL URL option {key!r}; known options: {known}")
        options[key] = value

    schema = options.get("schema", "public")
    if not _SCHEMA.fullmatch(schema) or schema.startswith("pg_"):
        raise InvalidURL(
            f"schema must be a lowercase identifier (a-z, 0-9, _; at most 63 characters; not "
            f"pg_*), not {schema!r}"
        )
    migrate = options.get("migrate", "true").lower()
    if migrate not in _TRUE | _FALSE:
        raise InvalidURL(f"migrate must be true or false, not {options['migrate']!r}")
    pool_min = _integer(options, "pool_min", 1, 0)
    pool_max = _integer(options, "pool_max", max(10, pool_min), 1)
    if pool_min > pool_max:
        raise InvalidURL(f"pool_min ({pool_min}) is larger than pool_max ({pool_max})")

    libpq = [(k, v) for k, v in pairs if k not in OWN_OPTIONS]
    conninfo = _unsplit(parts._replace(scheme="postgresql"), urlencode(libpq))
    return PostgresSettings(
        url=url,
        display=_redacted(parts),
        conninfo=conninfo,
        schema=schema,
        migrate=migrate in _TRUE,
        pool_min=pool_min,
        pool_max=pool_max,
        connect_timeout=_number(options, "connect_timeout", 5.0, 0.1),
        pool_timeout=_number(options, "pool_timeout", 5.0, 0.01),
    )


def connect(url: str) -> Backend:
    """Open the synchronous backend: connect once now to migrate (or check) the schema, so that
    a wrong URL, password or schema fails here; the pool opens on the first call.

    Raises:
        InvalidURL: see :func:`parse`.
        BackendUnavailable: the server cannot be reached (transient).
        AuthenticationFailed: the server refused the login (permanent, as are the next two).
        SchemaNotMigrated: the schema lacks the tables and ``migrate=false``.
        SchemaTooNew: the schema was migrated by a newer agentlease.
    """
    from agentlease.backends._sync.postgres_backend import PostgresBackend
    from agentlease.backends._sync.postgres_schema import migrate

    settings = parse(url)
    migrate(settings, apply=settings.migrate)
    return PostgresBackend(settings, migrated=True)


def connect_async(url: str) -> AsyncBackend:
    """The asyncio backend; it connects (and migrates) on first use, inside the event loop.

    Raises:
        InvalidURL: see :func:`parse` (connection errors surface at the first call).
    """
    from agentlease.backends._async.postgres_backend import AsyncPostgresBackend

    return AsyncPostgresBackend(parse(url))
