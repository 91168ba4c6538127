"""Cursors of task listings: an opaque string that names where the next page starts.

A cursor is the state listed and the sort key of the last task of a page (the values of the
store's index for that state, then the task id), as JSON, in URL-safe base64. Each backend
decides what its key holds (see ``Backend.list_tasks``); :func:`key` checks that a cursor a
user passes back is one of ours for that state and has the shape the backend expects, so a
mangled cursor is refused with :class:`~agentlease.errors.InvalidInput` before any store call.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

import orjson

from agentlease.errors import InvalidInput

__all__ = ["Key", "decode", "encode", "key"]

Key = list[int | float | str]
"""A sort key: the index values of a task, then its id."""


def encode(state: str, position: Sequence[int | float | str]) -> str:
    """The cursor of ``position`` in the listing of ``state``."""
    raw = orjson.dumps([state, *position])
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode(cursor: object, state: str) -> Key:
    """The sort key a cursor carries; raises InvalidInput if it is not a cursor of ``state``."""
    if not isinstance(cursor, str) or not cursor or len(cursor) > 2000:
        raise InvalidInput(f"cursor must be a cursor string from a listing, not {cursor!r}")
    try:
        values = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, orjson.JSONDecodeError):
        raise InvalidInput(f"invalid cursor {cursor[:40]!r}") from None
    if not isinstance(values, list) or not values or values[0] != state:
        raise InvalidInput(f"cursor {cursor[:40]!r} is not one of a listing of {state} tasks")
    return list(values[1:])


def key(after: Key | None, *types: type) -> Key | None:
    """``after`` if it has one value of each of ``types`` (an int is taken for a float), else
    InvalidInput; ``None`` stays ``None``."""
    if after is None:
        return None
    ok = len(after) == len(types) and all(
        (isinstance(v, t) and not isinstance(v, bool)) or (t is float and type(v) is int)
        for v, t in zip(after, types, strict=False)
    )
    if not ok:
        raise InvalidInput("invalid cursor: not one of this store's")
    return after
