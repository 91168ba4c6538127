"""JSON encoding at the edge of the store: strict, size-limited, never pickle.

Values are encoded once, above the storage seam, so every backend stores the same bytes and a
refusal happens before anything is written.
"""

from __future__ import annotations

import json
from typing import TypeAlias

import orjson

from agentlease.errors import NotJSON, PayloadTooLarge

__all__ = ["DEFAULT_MAX_BYTES", "JSON", "decode", "encode"]

JSON: TypeAlias = (
    "dict[str, JSON] | list[JSON] | tuple[JSON, ...] | str | int | float | bool | None"
)
"""A JSON value: what payloads, results, progress values and checkpoints may hold."""

DEFAULT_MAX_BYTES = 1_048_576

# Dataclasses, datetimes and subclasses are refused rather than silently reshaped: what a handler
# receives must equal what the producer sent.
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
    try:
        data = orjson.dumps(value, option=_OPTIONS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise NotJSON(f"{what} is not JSON-serialisable: {exc}") from exc
    # orjson writes NaN and infinities as null; JSON has no such numbers, so refuse them. The scan
    # only runs when a null could have come from one.
    if b"null" in data and _has_non_finite(value):
        raise NotJSON(f"{what} holds NaN or an infinity, which JSON cannot represent")
    if len(data) > limit:
        raise PayloadTooLarge(what, len(data), limit)
    return data


def _has_non_finite(value: object) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return True
    return False


def decode(data: bytes | None) -> JSON:
    """Decode JSON bytes from the store; ``None`` stands for no value."""
    if data is None:
        return None
    result: JSON = orjson.loads(data)
    return result
