"""Versioned JSON-lines files (histories, traces): a header naming the format and version, then
one JSON object per line."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from agentlease.errors import InvalidInput

__all__ = ["dump_lines", "load_lines"]

_HEADER = ("format", "version")


def dump_lines(format: str, version: int, meta: Mapping[str, Any], rows: Iterable[Any]) -> bytes:
    """The header (``format``, ``version`` and ``meta``), then one row per line."""
    header = {"format": format, "version": version}
    header |= {k: v for k, v in meta.items() if k not in _HEADER}
    lines = [orjson.dumps(header), *(orjson.dumps(row) for row in rows)]
    return b"\n".join(lines) + b"\n"


def load_lines(
    data: bytes, *, format: str, version: int, what: str
) -> tuple[dict[str, Any], list[Any]]:
    """The header's other fields and the rows of a file written by :func:`dump_lines`.

    Raises:
        InvalidInput: empty, not JSON, another format, or a version this library does not read.
    """
    lines = [line for line in data.splitlines() if line.strip()]
    if not lines:
        raise InvalidInput(f"an empty {what} file")
    try:
        header = orjson.loads(lines[0])
        rows = [orjson.loads(line) for line in lines[1:]]
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"a {what} line is not JSON: {exc}") from None
    if not isinstance(header, dict) or header.get("format") != format:
        raise InvalidInput(f"not an agentlease {what} (its first line names {format!r})")
    if header.get("version") != version:
        raise InvalidInput(
            f"{what} version {header.get('version')!r}; this library reads version {version}"
        )
    return {k: v for k, v in header.items() if k not in _HEADER}, rows
