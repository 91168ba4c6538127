"""Pins: a plan's read of a row of the user's own table, in the store's own database.

A pin is kept in a plan as the canonical JSON text of ``{"column": c, "table": t, "where":
{column: value, ...}}`` (sorted keys, no spaces): that text is the pin's key in the plan, and the
store that checks it (SQLite, PostgreSQL) parses it again with :func:`parse_pin`, so an edited
plan (whose MAC is checked first anyway) could never smuggle SQL in: every identifier is checked
as :func:`agentlease.versioned_update` checks them (a plain identifier, the table optionally
``schema.table``), and the values are bound, never spliced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from agentlease._versioned_sql import _bindable, _ident
from agentlease.errors import AgentLeaseError, PlanRefused

__all__ = ["Pin", "parse_pin", "pin_key"]

Pin = tuple[tuple[str, ...], tuple[tuple[str, Any], ...], str]
"""A parsed pin: the table's parts (``schema``, ``table``), the ``where`` columns and values in
order, and the version column."""

_SCALARS = (str, int, float)


def _checked(table: object, where: object, column: object) -> Pin:
    if not isinstance(table, str):
        raise PlanRefused(f"a pin's table must be a str, not {type(table).__name__}")
    parts = table.split(".")
    if not 1 <= len(parts) <= 2:
        raise PlanRefused(f"a pin's table {table!r} is not [schema.]table")
    if not isinstance(where, Mapping) or not where:
        raise PlanRefused("a pin needs where= as a non-empty mapping of key columns to values")
    try:
        names = tuple(_ident(p, "table") for p in parts)
        version = _ident(column, "column")
        keys = []
        for col, value in where.items():
            if type(value) is bool or not isinstance(value, _SCALARS):
                raise PlanRefused(
                    f"a pin's where value for {col!r} must be a str, int or float, not"
                    f" {type(value).__name__}"
                )
            _bindable(value)
            keys.append((_ident(col, "column"), value))
    except PlanRefused:
        raise
    except AgentLeaseError as exc:
        raise PlanRefused(str(exc)) from None
    return names, tuple(sorted(keys)), version


def pin_key(table: object, where: object, column: object = "version") -> str:
    """The canonical key of a pin (identifiers and values checked); raises PlanRefused."""
    names, keys, version = _checked(table, where, column)
    text = orjson.dumps(
        {"column": version, "table": ".".join(names), "where": dict(keys)},
        option=orjson.OPT_SORT_KEYS,
    )
    return text.decode()


def parse_pin(key: str) -> Pin:
    """A pin's key parsed back and checked; PlanRefused if it is not one :func:`pin_key` made."""
    try:
        data = orjson.loads(key)
    except orjson.JSONDecodeError:
        raise PlanRefused("a pin's key is not JSON") from None
    if not isinstance(data, dict) or set(data) != {"column", "table", "where"}:
        raise PlanRefused("a pin's key must hold exactly column, table and where")
    pin = _checked(data["table"], data["where"], data["column"])
    if pin_key(data["table"], data["where"], data["column"]) != key:
        raise PlanRefused("a pin's key is not in its canonical form")
    return pin
