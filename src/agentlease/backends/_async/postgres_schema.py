"""Versioned migrations of the PostgreSQL backend, applied once however many processes start.

The files ``sql/postgres_migrations/NNNN_name.sql`` are applied in order; each applied version is
recorded in ``agentlease_migrations`` in the target schema. :func:`migrate` first reads the applied
versions without any lock (the common case: nothing to do, no waiting). When some are missing it
opens ONE transaction, takes a transaction-level advisory lock keyed by the schema, creates the
schema if needed, reads the versions again and applies only what is still missing, then commits:
processes that start together queue on the lock, and each one after the first finds the work
done. A failure rolls everything back, so a schema is never left half-migrated. A role without
USAGE on an existing schema sees no tables in it: that is reported as the missing USAGE, not as
a schema to migrate.

A schema with a migration newer than any this agentlease ships (an upgraded process migrated
it) is refused with :class:`~agentlease.errors.SchemaTooNew`, by :func:`migrate` and
:func:`pending` alike, before anything is written: this version would misread its tables.

Written once for asyncio; ``backends/_sync/postgres_schema.py`` is generated from it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
from psycopg import AsyncConnection, errors, sql

from agentlease._rights import explain_postgres_denial
from agentlease.backends._postgres_driver import MIGRATE_HINT, MIGRATIONS, Migration, Q, translate
from agentlease.backends._postgres_url import PostgresSettings
from agentlease.errors import PermissionDenied, SchemaNotMigrated, SchemaTooNew

__all__ = ["lock_key", "migrate", "pending"]


def lock_key(schema: str) -> int:
    """The advisory lock that serialises migrations of one schema (a signed 64-bit integer)."""
    digest = hashlib.blake2b(f"agentlease-migrate\x00{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


async def _applied(conn: AsyncConnection[Any], settings: PostgresSettings) -> set[int]:
    """The versions applied to the schema; a version newer than any this agentlease knows is
    refused (before anything is written)."""
    cur = await conn.execute(Q["migrations_exist"], {"schema": settings.schema})
    row = await cur.fetchone()
    if row is not None and not row[0] and row[1]:  # it exists, but the role may not use it
        denied = f"permission denied for schema {settings.schema}"
        why = explain_postgres_denial(settings.schema, denied, migrating=False)
        raise PermissionDenied(f"PostgreSQL {settings.display}: {why}")
    if row is None or not row[0]:
        return set()
    cur = await conn.execute(Q["applied_versions"])
    applied = {version for (version,) in await cur.fetchall()}
    newest = MIGRATIONS[-1].version
    if applied and max(applied) > newest:
        where = f"PostgreSQL {settings.display} (schema {settings.schema!r})"
        raise SchemaTooNew(where, "migrations", max(applied), newest)
    return applied


def _missing(applied: set[int]) -> list[Migration]:
    return [m for m in MIGRATIONS if m.version not in applied]


async def _connect(settings: PostgresSettings) -> AsyncConnection[Any]:
    return await AsyncConnection.connect(settings.conninfo, **settings.connect_kwargs())


async def pending(settings: PostgresSettings) -> list[Migration]:
    """The migrations not yet applied to the URL's schema (nothing is changed).

    Raises:
        BackendUnavailable: the server cannot be reached.
        BackendRefused: the server refused the login (:class:`AuthenticationFailed`), the
            role may not use the schema (:class:`PermissionDenied`: no USAGE), or the schema is
            newer than this agentlease (:class:`SchemaTooNew`).
    """
    try:
        async with await _connect(settings) as conn:
            return _missing(await _applied(conn, settings))
    except psycopg.Error as exc:
        raise translate(settings, exc) from exc


async def migrate(settings: PostgresSettings, *, apply: bool = True) -> list[Migration]:
    """Bring the URL's schema up to date, or (``apply=False``) check that it is.

    Returns:
        The migrations this call applied (empty when the schema was up to date).

    Raises:
        BackendUnavailable: the server cannot be reached.
        AuthenticationFailed: the server refused the login.
        SchemaNotMigrated: ``apply=False`` and migrations are pending.
        SchemaTooNew: the schema has a migration newer than this agentlease knows.
        PermissionDenied: the role may not use the schema (no USAGE), or may not migrate it
            (no CREATE on it, or on the database to create it); the message says which.
        BackendError: applying a migration failed (nothing of it was kept).
    """
    try:
        async with await _connect(settings) as conn:
            missing = _missing(await _applied(conn, settings))
            if not missing:
                return []
            if not apply:
                names = ", ".join(f"{m.version:04d}_{m.name}" for m in missing)
                raise SchemaNotMigrated(
                    f"PostgreSQL {settings.display}: schema {settings.schema!r} lacks the "
                    f"agentlease tables or is out of date (pending migrations: {names}) and the "
                    f"URL says migrate=false; {MIGRATE_HINT}"
                )
            return await _apply(conn, settings)
    except psycopg.Error as exc:
        raise translate(settings, exc) from exc


async def _apply(conn: AsyncConnection[Any], settings: PostgresSettings) -> list[Migration]:
    try:
        return await _apply_all(conn, settings)
    except errors.InsufficientPrivilege as exc:  # CREATE on the schema (or the database)
        raise translate(settings, exc, migrating=True) from exc


async def _apply_all(conn: AsyncConnection[Any], settings: PostgresSettings) -> list[Migration]:
    schema = sql.Identifier(settings.schema)
    applied: list[Migration] = []
    async with conn.transaction():
        await conn.execute("SET LOCAL lock_timeout = '120s'")
        await conn.execute(Q["migration_lock"], {"key": lock_key(settings.schema)})
        cur = await conn.execute(Q["schema_exists"], {"schema": settings.schema})
        row = await cur.fetchone()
        if row is None or not row[0]:
            await conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        await conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(schema))
        await conn.execute(Q["migrations_table"])
        for migration in _missing(await _applied(conn, settings)):
            await conn.execute(migration.sql)
            await conn.execute(
                Q["record_migration"], {"version": migration.version, "name": migration.name}
            )
            applied.append(migration)
    return applied
