"""Optimistic concurrency on the user's own SQL tables, on a connection they already hold.

``UPDATE t SET a = ?, version = version + 1 WHERE id = ? AND version = ?`` is the whole pattern;
this module writes it safely (identifiers checked and quoted, values bound) for :mod:`sqlite3`
and psycopg 3 connections, and turns "no row updated" into a
:class:`~agentlease.errors.ConflictError` that carries the row as it is now. It runs in the
connection's current transaction and never commits: the caller's transaction stays theirs.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping
from typing import Any

from agentlease import _validate as check
from agentlease.errors import ConflictError, InvalidInput, InvalidName

__all__ = ["versioned_update"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def _ident(name: object, what: str) -> str:
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        raise InvalidName(f"{what} {name!r} is not a plain SQL identifier")
    return name


def _bindable(value: object) -> None:
    """Refuse what neither driver can bind as its SQL type: an int past 64 bits, a str with a
    lone surrogate (no UTF-8). Other types are the driver's to map (or refuse)."""
    if type(value) is int and not -(2**63) <= value < 2**63:
        raise InvalidInput(f"{value} does not fit a 64-bit SQL integer")
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise InvalidInput(f"{value!r} is not valid text: {exc.reason}") from None


def versioned_update(
    conn: Any,
    table: str,
    where: Mapping[str, object],
    expected_version: int,
    values: Mapping[str, object],
    *,
    version_column: str = "version",
) -> int:
    """Update one row only if its version is still ``expected_version``; returns the new one.

    Args:
        conn: a :class:`sqlite3.Connection` or a psycopg 3 ``Connection``.
        table: the table (a plain identifier, optionally ``schema.table``).
        where: the row's key columns and values (for example ``{"id": 7}``).
        expected_version: the version the caller read.
        values: the columns to set.
        version_column: the integer column that counts writes.

    Raises:
        ConflictError: the row's version moved (or the row is gone): ``current_version`` and
            ``current_value`` (the row as a dict, ``None`` if gone) say what it is now.
        InvalidName, InvalidInput: bad identifiers, nothing to set, an ``expected_version``
            that is not an int in 0..2**63 - 1, or a value no driver can bind (an int past 64
            bits, a str with a lone surrogate).
    """
    if not isinstance(table, str):
        raise InvalidName(f"table must be a str, not {type(table).__name__}")
    check.integer(expected_version, "expected_version", low=0, high=2**63 - 1)
    if not isinstance(where, Mapping) or not isinstance(values, Mapping):
        raise InvalidInput("versioned_update takes where= and values= as mappings of columns")
    for value in (*where.values(), *values.values()):
        _bindable(value)
    parts = table.split(".")
    if not 1 <= len(parts) <= 2:
        raise InvalidName(f"table {table!r} is not [schema.]table")
    names = [_ident(p, "table") for p in parts]
    keys = [_ident(c, "column") for c in where]
    cols = [_ident(c, "column") for c in values]
    version = _ident(version_column, "column")
    if not cols or not keys:
        raise InvalidInput("versioned_update needs columns to set and key columns to match")
    if version in cols:
        raise InvalidInput(f"{version!r} is counted by versioned_update; do not set it")
    if isinstance(conn, sqlite3.Connection):
        quote = '"{}"'.format
        mark = "?"
    elif type(conn).__module__.startswith("psycopg"):
        quote = '"{}"'.format
        mark = "%s"
    else:
        raise InvalidInput(f"versioned_update takes a sqlite3 or psycopg connection, not {conn!r}")
    target = ".".join(quote(n) for n in names)
    sets = ", ".join(f"{quote(c)} = {mark}" for c in cols)
    match = " AND ".join(f"{quote(k)} = {mark}" for k in keys)
    statement = (
        f"UPDATE {target} SET {sets}, {quote(version)} = {quote(version)} + 1"
        f" WHERE {match} AND {quote(version)} = {mark} RETURNING {quote(version)}"
    )
    params = [*values.values(), *where.values(), expected_version]
    cursor = conn.execute(statement, params)
    row = cursor.fetchone()
    if row is not None:
        new: int = row[0]
        return new
    cursor = conn.execute(f"SELECT * FROM {target} WHERE {match}", list(where.values()))
    current = cursor.fetchone()
    if current is None:
        raise ConflictError(table, expected_version, 0, None)
    columns = [d[0] for d in cursor.description]
    now = dict(zip(columns, current, strict=True))
    raise ConflictError(table, expected_version, int(now[version]), now)
