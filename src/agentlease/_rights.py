"""Least privilege: the rights agentlease needs on Redis and PostgreSQL, and no more.

:func:`rights` turns a store URL into what an administrator runs so that agentlease's clients
can do their work and nothing else; ``agentlease rights URL`` prints it, the README shows it for
the defaults, and ``tests/security/test_rights.py`` configures private servers with exactly this
output, runs workers, idempotency keys and guards under it, and takes each right away in turn to
see the typed error (:class:`~agentlease.errors.PermissionDenied`) that names what is missing.

**Redis** (:class:`RedisRule`): one ACL user, allowed the keys of one prefix (``~<prefix>:*``,
the store's own keys, and ``~{<prefix>:*``, the keys of its queues and locks, whose names start
with a hash tag), no Pub/Sub channel (none is used), and exactly the commands agentlease sends:
those the client sends itself (:data:`REDIS_CLIENT`), and those its Lua scripts call
(:data:`REDIS_SCRIPTS`), which Redis checks against the same ACL. ``SELECT`` is added for a
database other than 0 and what redis-py's cluster client reads at start (``CLUSTER SLOTS``,
``COMMAND``) for ``cluster=1``. redis-py also sends ``CLIENT SETINFO`` on connecting and ignores
a refusal (Redis before 7.2 does not know it, and would refuse the rule that named it): it is
left out.

**PostgreSQL** (:class:`PostgresGrants`): an owner role that migrates the schema (it owns it:
``agentlease migrate`` as that role), and a worker role that may use the schema, read, insert,
update and delete exactly the rows agentlease's statements touch (:data:`WORKER_TABLES`), draw
the task sequence, and execute the functions agentlease calls (:data:`WORKER_FUNCTIONS`); it
needs no CREATE, no ownership, nothing outside the schema. LISTEN/NOTIFY needs no privilege.
The functions run with the caller's rights (``SECURITY INVOKER``), so the table privileges cover
what they do too. Functions are executable by PUBLIC by default; the owner's part revokes that,
so that EXECUTE is granted to the worker alone.

:func:`explain_redis_denial` and :func:`explain_postgres_denial` say, for a refusal the store
sent, which right is missing, in the words of these grants (the two drivers' error translators
call them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from agentlease.errors import InvalidURL

__all__ = [
    "REDIS_CLIENT",
    "REDIS_SCRIPTS",
    "WORKER_FUNCTIONS",
    "WORKER_SEQUENCES",
    "WORKER_TABLES",
    "PostgresGrants",
    "RedisRule",
    "explain_postgres_denial",
    "explain_redis_denial",
    "rights",
]

REDIS_CLIENT = (
    "evalsha",  # every primitive is one script, called by its SHA
    "eval",  # the same script, sent whole, once a server does not know it (NOSCRIPT)
    "get",  # <prefix>:layout, read once per client
    "set",  # <prefix>:layout, written once per store (SET NX)
    "time",  # the store's clock, read by queue.now()
    "hsetnx",  # <prefix>:ids: a task id taken for its queue at enqueue
    "hget",
    "hset",
    "hdel",
    "hexists",  # after a purge: which freed ids were enqueued again meanwhile
    "sadd",  # <prefix>:queues
    "smembers",
    "srem",  # <prefix>:queues, when a queue is deleted
    "hgetall",  # a versioned record, read
)
"""Commands the client sends itself (besides AUTH, which needs no right)."""

REDIS_SCRIPTS = (
    "decrby",
    "del",
    "exists",
    "get",
    "hdel",
    "hexists",
    "hget",
    "hgetall",
    "hincrby",
    "hlen",
    "hmget",
    "hrandfield",  # delete_queue: a batch of a queue's tasks
    "hscan",  # purge.lua: the one-off index of a queue's done tasks of key layout 1
    "hset",
    "incrby",
    "pexpireat",
    "set",  # plan_secret.lua (SET NX), plan_act.lua (a plan's receipt, with PX)
    "time",
    "unlink",  # delete_queue: the keys of a queue once its last task is deleted
    "zadd",
    "zcard",
    "zcount",  # delete_queue: the live leases that refuse it
    "zincrby",
    "zmscore",
    "zpopmin",
    "zrange",
    "zrangebylex",
    "zrangebyscore",
    "zrem",
    "zrevrange",
    "zrevrangebyscore",
    "zscore",
)
"""Commands the Lua scripts (``backends/lua/*.lua``) call (Redis checks them against the ACL)."""

REDIS_CLUSTER = ("cluster|slots", "command")
"""What redis-py's cluster clients send at start: the slot map, and the command table."""

WORKER_TABLES: dict[str, tuple[str, ...]] = {
    "agentlease_migrations": ("SELECT",),  # the schema's version, checked on connect
    "agentlease_queues": ("SELECT", "INSERT", "UPDATE", "DELETE"),  # DELETE: delete_queue
    "agentlease_tasks": ("SELECT", "INSERT", "UPDATE", "DELETE"),  # DELETE: retention
    "agentlease_keys": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    # DELETE: a plan that read an absent record deletes the stand-in row it locked it with.
    "agentlease_records": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "agentlease_record_fields": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "agentlease_counters": ("SELECT", "INSERT", "UPDATE"),
    "agentlease_counter_holds": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "agentlease_locks": ("SELECT", "INSERT", "UPDATE"),
    "agentlease_budgets": ("SELECT", "INSERT", "UPDATE", "DELETE"),  # DELETE: purge_state
    "agentlease_breakers": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    # Attempt histories, written by the triggers of migration 11 inside the worker's own
    # statements (old attempts deleted past the last 20), and the live workers' entries.
    "agentlease_attempts": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "agentlease_workers": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    # Plans (migration 12): receipts (DELETE: purge_state), and the store's secrets (the key of
    # the MACs of plans: whoever reads it may seal a plan the store accepts).
    "agentlease_plans": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "agentlease_secrets": ("SELECT", "INSERT"),
}
"""The worker role's privileges on each table of the schema (UPDATE covers row locks too)."""

WORKER_SEQUENCES: dict[str, tuple[str, ...]] = {"agentlease_seq": ("USAGE",)}
"""The worker role's privileges on each sequence (nextval: the order of queued tasks)."""

WORKER_FUNCTIONS = (
    "agentlease_acquire_locks",
    "agentlease_act_plan",
    "agentlease_add_counter",
    "agentlease_breaker_admit",
    "agentlease_breaker_record",
    "agentlease_breaker_wait",
    "agentlease_cancel",
    "agentlease_claim_holder",
    "agentlease_complete_many",
    "agentlease_delete_queue",
    "agentlease_end_hold",
    "agentlease_enqueue_context",
    "agentlease_extend",
    "agentlease_extend_locks",
    "agentlease_front",
    "agentlease_hold_counter",
    "agentlease_lock_counter",
    "agentlease_lock_partitions",
    "agentlease_partition_key",
    "agentlease_reap",
    "agentlease_release_locks",
    "agentlease_requeue_dead",
    "agentlease_reserve_key",
    "agentlease_retry_budget",
    "agentlease_secret",
    "agentlease_settle_hold",
    "agentlease_unpark",
    "agentlease_write_record",
)
"""The functions the worker role executes (directly, or from one another). Not granted:
``agentlease_claim`` (kept by migration 6 for clients of schema version 5),
``agentlease_claim_ranked`` and ``agentlease_enqueue`` (kept by migration 8 for clients of schema
version 7), ``agentlease_claim_context`` (kept by migration 11 for clients before it) and the
trigger functions ``agentlease_partition_freed``, ``agentlease_attempt_close`` and
``agentlease_attempt_forget`` (a trigger needs no EXECUTE of whoever fires it)."""

_CREDENTIALS = ("user", "password", "sslpassword")
DEFAULT_ROLE = "agentlease_worker"
DEFAULT_OWNER = "agentlease_owner"
_PASSWORD = "<password>"


def _redis_prefix(url: str) -> str | None:
    """The ``prefix`` of a (masked) Redis URL, or None if it cannot be read."""
    try:
        options = dict(parse_qsl(urlsplit(url).query))
    except ValueError:
        return None
    return options.get("prefix", "agentlease")


@dataclass(frozen=True, slots=True)
class RedisRule:
    """The ACL of the one Redis user agentlease's clients log in as.

    Attributes:
        user: the ACL user's name.
        prefix: the URL's key prefix.
        keys: the key patterns (``~...``).
        commands: the commands, lower case (``cluster|slots`` names a subcommand).
    """

    user: str
    prefix: str
    keys: tuple[str, ...]
    commands: tuple[str, ...]

    def rules(self, password: str = _PASSWORD) -> list[str]:
        """The arguments of ``ACL SETUSER <user>`` (or the rules of an ACL file's line)."""
        return [
            "reset",
            "on",
            f">{password}",
            "resetchannels",
            *self.keys,
            "-@all",
            *(f"+{c}" for c in self.commands),
        ]

    def text(self) -> str:
        """The rule as ``agentlease rights`` prints it."""
        return "\n".join(
            [
                f"# Redis: the ACL user {self.user!r} for keys under the prefix {self.prefix!r}",
                "# (redis-cli; an ACL file takes 'user <name>' and these rules); set its password:",
                " ".join(["ACL SETUSER", self.user, *self.rules()]),
            ]
        )


_SIMPLE = re.compile(r"[a-z_][a-z0-9_]*")
# PostgreSQL's reserved key words: such names must be quoted.
_RESERVED_WORDS = """
    all analyse analyze and any array as asc asymmetric authorization binary both case cast
    check collate column concurrently constraint create cross current_catalog current_date
    current_role current_schema current_time current_timestamp current_user default
    deferrable desc distinct do else end except false fetch for foreign freeze from full
    grant group having ilike in initially inner intersect into is isnull join lateral
    leading left like limit localtime localtimestamp natural none not notnull null offset on
    only or order outer overlaps placing primary references returning right select
    session_user similar some symmetric system_user table tablesample then to trailing true
    union unique user using variadic verbose when where window with
"""
_RESERVED = frozenset(_RESERVED_WORDS.split())


def _ident(name: str) -> str:
    """``name`` as a PostgreSQL identifier (quoted when it must be)."""
    if _SIMPLE.fullmatch(name) and name not in _RESERVED:
        return name
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class PostgresGrants:
    """What a PostgreSQL administrator and the schema's owner grant, and to whom.

    Attributes:
        database: the URL's database (None: libpq's default, the user's name).
        schema: the URL's schema.
        owner: the role that migrates (owns the schema and everything in it).
        worker: the role workers, producers, idempotent tools and guards log in as.
        owner_url: the URL the owner migrates with (the given URL, the owner as its user, no
            password).
    """

    database: str | None
    schema: str
    owner: str
    worker: str
    owner_url: str

    def admin(self) -> list[str]:
        """Statements for an administrator, once (the roles exist and may log in)."""
        owner, worker, schema = _ident(self.owner), _ident(self.worker), _ident(self.schema)
        statements = []
        if self.database is not None:
            statements.append(
                f"GRANT CONNECT ON DATABASE {_ident(self.database)} TO {owner}, {worker};"
            )
        if self.schema == "public":  # it exists, owned by the database's owner
            statements.append(f"GRANT USAGE, CREATE ON SCHEMA public TO {owner};")
        else:
            statements.append(f"CREATE SCHEMA IF NOT EXISTS {schema} AUTHORIZATION {owner};")
        return statements

    def worker_grants(self) -> list[str]:
        """Statements for the owner, after every ``agentlease migrate``: the worker's rights."""
        schema, worker = _ident(self.schema), _ident(self.worker)
        statements = [f"GRANT USAGE ON SCHEMA {schema} TO {worker};"]
        for table, privileges in WORKER_TABLES.items():
            statements.append(f"GRANT {', '.join(privileges)} ON {schema}.{table} TO {worker};")
        for sequence, privileges in WORKER_SEQUENCES.items():
            statements.append(
                f"GRANT {', '.join(privileges)} ON SEQUENCE {schema}.{sequence} TO {worker};"
            )
        functions = ",\n    ".join(f"{schema}.{f}" for f in WORKER_FUNCTIONS)
        if self.schema == "public":  # shared with other software: only agentlease's functions
            statements.append(f"REVOKE EXECUTE ON FUNCTION\n    {functions}\n    FROM PUBLIC;")
        else:  # agentlease's own schema: its functions are all agentlease's
            statements.append(f"REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC;")
        statements.append(f"GRANT EXECUTE ON FUNCTION\n    {functions}\n    TO {worker};")
        return statements

    def text(self) -> str:
        """The grants as ``agentlease rights`` prints them."""
        where = f"schema {self.schema!r}"
        if self.database is not None:
            where += f" of database {self.database!r}"
        return "\n".join(
            [
                f"-- PostgreSQL: {where}; {self.owner} migrates it, {self.worker} works in it.",
                "-- 1. As an administrator, once (both roles exist and may log in):",
                *self.admin(),
                f"-- 2. As {self.owner}: agentlease migrate --backend '{self.owner_url}'",
                f"-- 3. As {self.owner}, after every migrate: what {self.worker} may do.",
                *self.worker_grants(),
            ]
        )


def _scheme(url: str) -> str:
    return url.partition("://")[0].lower() if "://" in url else ""


def rights(
    url: str, *, role: str | None = None, owner: str | None = None
) -> RedisRule | PostgresGrants:
    """The least rights agentlease needs on the store of ``url``.

    Args:
        url: a ``redis://``, ``rediss://`` or ``postgresql://`` URL (its prefix or schema, and
            database, decide the rule).
        role: the Redis ACL user, or the PostgreSQL worker role (default: the URL's user, else
            ``agentlease_worker``).
        owner: the PostgreSQL role that migrates (default ``agentlease_owner``).

    Raises:
        InvalidURL: not a Redis or PostgreSQL URL, or a malformed one.
        MissingDriver: the Redis URL's driver is not installed (its parser lives with it).
    """
    scheme = _scheme(url)
    if scheme in ("redis", "rediss"):
        from agentlease.backends import _native

        module = _native(scheme)
        assert module is not None
        options = module.parse(url)
        commands = [*REDIS_CLIENT, *(c for c in REDIS_SCRIPTS if c not in REDIS_CLIENT)]
        if options.db:
            commands.append("select")
        if options.cluster:
            commands.extend(REDIS_CLUSTER)
        prefix = options.prefix
        return RedisRule(
            user=_role(role or options.username),
            prefix=prefix,
            keys=(f"~{prefix}:*", f"~{{{prefix}:*"),
            commands=tuple(sorted(commands)),
        )
    if scheme in ("postgresql", "postgres"):
        from agentlease.backends._postgres_url import parse

        settings = parse(url)
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        user = unquote(parts.username) if parts.username else query.get("user")
        database = unquote(parts.path.lstrip("/")) or query.get("dbname")
        worker, migrator = _role(role or user), _role(owner or DEFAULT_OWNER)
        if worker == migrator:
            raise InvalidURL(f"the worker and the owner must be two roles, not both {worker!r}")
        host = parts.netloc.rpartition("@")[2]
        query_text = urlencode(  # the owner's URL carries no one's user or password
            [(k, v) for k, v in parse_qsl(parts.query) if k not in _CREDENTIALS],
            safe="/",
            quote_via=quote,
        )
        owner_url = f"{parts.scheme}://{quote(migrator, safe='')}@{host}{parts.path}"
        owner_url += f"?{query_text}" if query_text else ""
        return PostgresGrants(database or None, settings.schema, migrator, worker, owner_url)
    raise InvalidURL(f"agentlease rights takes a redis:// or postgresql:// URL, not {url!r}")


def _role(name: str | None) -> str:
    name = name or DEFAULT_ROLE
    if (
        len(name) > 63
        or name.lower() in ("public", "none")  # PostgreSQL's reserved role names
        or any(ch.isspace() or ch in "\"'<>;" for ch in name)
    ):
        raise InvalidURL(f"invalid role or user name {name!r}")
    return name


# -- what a refusal means -------------------------------------------------------------------------

_SCRIPT_AT = re.compile(r"script: ([0-9a-f]{40}), on @user_script:(\d+)")
_NAMED = re.compile(r"'([a-z|]+)' command")
_CALL = re.compile(r"redis\.p?call\('([A-Za-z]+)'")


def explain_redis_denial(url: str, message: str) -> str:
    """What a Redis ACL refusal (``message``: the server's words) lacks, in this module's terms."""
    prefix = _redis_prefix(url)
    named = _NAMED.search(message)
    at = _SCRIPT_AT.search(message)
    if at is not None:
        script, line = _script_line(at.group(1), int(at.group(2)))
        command = named.group(1) if named else None
        if command is None and line is not None:
            called = _CALL.search(line)
            command = called.group(1).lower() if called else None
        what = f"the command {command.upper()}" if command else "a command"
        where = f" that script {script!r} calls" if script else " that a script calls"
        if line is not None and command is None:
            where += f" (line {at.group(2)}: {line.strip()})"
        lacks = f"the user may not run {what}{where}"
        if "access" in message and "keys" in message:
            lacks = f"the user may not access a key that script {script!r} uses"
    elif "keys" in message:
        lacks = "the user may not access a key of this store"
        if prefix is not None:
            lacks += f" (its keys match ~{prefix}:* and ~{{{prefix}:*)"
    elif "channel" in message:
        lacks = "the user may not use a Pub/Sub channel"
    elif named is not None:
        lacks = f"the user may not run the command {named.group(1).upper().replace('|', ' ')}"
    else:
        lacks = "the user may not do this"
    return f"{lacks}: {message}; `agentlease rights URL` prints the ACL rule agentlease needs"


def _script_line(sha: str, number: int) -> tuple[str | None, str | None]:
    """The name of the script with ``sha``, and its line ``number`` (1 is ``#!lua``)."""
    from agentlease.backends.lua import SCRIPTS

    for name, script in SCRIPTS.items():
        if script.sha == sha:
            lines = script.text.decode().splitlines()
            return name, lines[number - 1] if 0 < number <= len(lines) else None
    return None, None


_PG_DENIED = re.compile(r"permission denied for (table|relation|sequence|function|schema) (\S+)")


def explain_postgres_denial(schema: str, detail: str, *, migrating: bool) -> str:
    """What a PostgreSQL ``permission denied`` (``detail``: the server's words) lacks."""
    found = _PG_DENIED.search(detail)
    kind, name = (found.group(1), found.group(2).strip('"')) if found else ("", "")
    if migrating:
        need = (
            f"migrating needs CREATE on schema {schema!r} (and on the database to create the "
            "schema): run agentlease migrate as the schema's owner, or pick a schema the URL's "
            "user owns with ?schema="
        )
    elif kind == "schema":
        need = f"the role needs USAGE on schema {name!r}"
    elif kind in ("table", "relation") and name in WORKER_TABLES:
        privileges = ", ".join(WORKER_TABLES[name])
        need = f"the role needs {privileges} on table {schema}.{name}"
    elif kind == "sequence" and name in WORKER_SEQUENCES:
        privileges = ", ".join(WORKER_SEQUENCES[name])
        need = f"the role needs {privileges} on sequence {schema}.{name}"
    elif kind == "function":
        need = f"the role needs EXECUTE on function {schema}.{name}"
    else:
        need = "the role lacks a privilege"
    return f"{detail} ({need}; `agentlease rights URL` prints the grants agentlease needs)"
