"""Named queries kept in ``.sql`` files, parsed once per file.

A file holds blocks that each start with a ``-- name: <name>`` line; the text up to the next such
line is that query. Keeping SQL in files lets it be read, reviewed and run by hand as SQL.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

__all__ = ["queries"]

_HEADER = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)


@cache
def queries(package: str, filename: str) -> dict[str, str]:
    """Parse ``filename`` in ``package`` into ``{name: sql}``."""
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    named: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        named[name] = body.strip()
    return named
