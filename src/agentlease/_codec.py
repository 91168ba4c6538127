"""JSON encoding at the edge of the store: strict, size-limited, never pickle.

Values are encoded once, above the storage seam, so every backend stores the same bytes and a
refusal happens before anything is written.
"""

from __future__ import annotations

import math
from typing import TypeAlias

import orjson

from agentlease.errors import NotJSON, PayloadTooLarge

__all__ = ["DEFAULT_MAX_BYTES", "JSON", "decode", "encode"]

JSON: TypeAlias = (
    "dict[str, JSON] | list[JSON] | tuple[JSON, ...] | str | int | float | bool | None"
)
"""A JSON value: what payloads, results, progress values and checkpoints may hold."""

DEFAULT_MAX_BYTES = 1_048_576

# Dataclasses, datetimes, UUIDs, enums and subclasses are refused rather than silently reshaped:
# what a handler receives must equal what the producer sent.
_OPTIONS = (
    orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def encode(value: object, *, what: str = "payload", limit: int = DEFAULT_MAX_BYTES) -> bytes:
    """Encode ``value`` as compact JSON, refusing anything that is not plain JSON.

    Args:
        value: dicts with string keys, lists, tuples, strings, ints, floats, bools and ``None``.
        what: how the value is named in an error message.
        limit: the largest encoded size accepted, in bytes.

    Returns:
        The UTF-8 JSON bytes.

    Raises:
        NotJSON: the value holds something JSON cannot represent (NaN, a set, an object, ...).
        PayloadTooLarge: the encoding is longer than ``limit``.
    """
    # orjson would write NaN as null and UUIDs, enums and int/str subclasses as plain values;
    # refuse those first, by exact type, so the handler receives what the producer sent.
    problem = _not_plain(value)
    if problem is not None:
        raise NotJSON(f"{what} is not plain JSON: {problem}")
    try:
        data = orjson.dumps(value, option=_OPTIONS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise NotJSON(f"{what} is not JSON-serialisable: {exc}") from exc
    if len(data) > limit:
        raise PayloadTooLarge(what, len(data), limit)
    return data


def _not_plain(value: object) -> str | None:
    """Why ``value`` is not plain JSON, or ``None`` if it is (tuples count as arrays)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if v is None or type(v) in (str, int, bool):
            continue
        if type(v) is float:
            if not math.isfinite(v):
                return f"{v!r} has no JSON representation"
        elif type(v) is dict:
            for key in v:
                if type(key) is not str:
                    return f"object keys must be str, not {type(key).__name__}"
            stack.extend(v.values())
        elif type(v) in (list, tuple):
            stack.extend(v)  # type: ignore[arg-type]
        else:
            return f"a {type(v).__name__} is an object, not a JSON value"
    return None


def decode(data: bytes | None) -> JSON:
    """Decode JSON bytes from the store; ``None`` stands for no value."""
    if data is None:
        return None
    result: JSON = orjson.loads(data)
    return result
