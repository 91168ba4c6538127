"""Idempotency keys from the semantic identity of an action: pure, versioned, stable.

The key of an action is the SHA-256 of a versioned canonical encoding of the task id, the step
id, the tool name and the canonical JSON of the arguments. Nothing that varies between attempts
(the attempt number, a timestamp, a random id, raw model text) may enter it, so every attempt of
the same step of the same task, in any process, on any Python, derives the same key.

An action's **fingerprint** (what a reservation stores, and what tells a re-planned call from a
retry) covers the tool, the step and the arguments, so a key given by the caller (an upstream
``Idempotency-Key``) reused for another tool or step is a conflict, never a replay of the other
action's result. It is versioned: ``2:<SHA-256 hex>:<JSON [tool, step]>`` (the tool and step in
clear, cut to 100 characters each, so a conflict can name the action that holds the key).
Version 1 fingerprints, stored before version 2, are 64 hex digits of the arguments alone: a
key derived here (which covers the tool and step itself) still matches one, and a caller's own
key meets it as a conflict (:func:`legacy_fingerprint`).

Canonical JSON: object keys sorted, no whitespace, UTF-8 strings, tuples as arrays, and numbers
in one spelling (an integral float such as ``10.0`` is written ``10``, as JSON itself cannot tell
them apart and a planner may produce either). Anything that is not plain JSON is refused with
:class:`~agentlease.errors.NotJSON`, never converted.
"""

from __future__ import annotations

import hashlib
import math
from functools import lru_cache

import orjson

from agentlease._codec import JSON
from agentlease.errors import InvalidName, MissingIdentity, NotJSON

__all__ = [
    "FINGERPRINT_VERSION",
    "KEY_VERSION",
    "canonical_json",
    "check_key",
    "derive_key",
    "fingerprint",
    "fingerprint_names",
    "key_and_fingerprint",
    "legacy_fingerprint",
    "reservable",
]

KEY_VERSION = 1
"""Bumped whenever the encoding changes, so keys of different versions never collide."""

FINGERPRINT_VERSION = 2
"""The encoding of fingerprints (version 1: the arguments alone; version 2: tool, step and
arguments, with the tool and step in clear)."""

_LABEL = 100  # characters of the tool and the step kept in clear in a fingerprint

_MAX_INT = 2**53  # floats past this are not exact integers in every JSON reader
_MAX_KEY = 256


def _canonical(value: object, path: str) -> JSON:
    if value is None or type(value) in (str, bool, int):
        return value  # type: ignore[return-value]
    if type(value) is float:
        if not math.isfinite(value):
            raise NotJSON(f"argument {path} is {value!r}, which has no JSON representation")
        if value.is_integer() and abs(value) < _MAX_INT:
            return int(value)
        return value
    if type(value) is dict:
        out: dict[str, JSON] = {}
        for k, v in value.items():
            if type(k) is not str:
                raise NotJSON(f"argument {path} has a {type(k).__name__} key; keys must be str")
            out[k] = _canonical(v, f"{path}.{k}")
        return out
    if isinstance(value, list | tuple) and type(value) in (list, tuple):
        return [_canonical(v, f"{path}[{i}]") for i, v in enumerate(value)]
    raise NotJSON(
        f"argument {path} is a {type(value).__name__}, not a JSON value: exclude it from the "
        "key or pass its JSON form"
    )


def _plain(value: object) -> bool:
    """Whether ``value`` is plain JSON already in canonical form (no float that is an integer,
    nothing JSON cannot hold), so that it can be encoded as it is, without the copy
    :func:`_canonical` makes."""
    stack = [value]
    while stack:
        v = stack.pop()
        if v is None or type(v) is str or type(v) is bool or type(v) is int:
            continue
        if type(v) is dict:
            for k in v:
                if type(k) is not str:
                    return False
            stack.extend(v.values())
        elif type(v) is list or type(v) is tuple:
            stack.extend(v)
        elif type(v) is float:
            if not math.isfinite(v) or v.is_integer():
                return False
        else:
            return False
    return True


def canonical_json(value: object) -> bytes:
    """The canonical JSON encoding of ``value``.

    Raises:
        NotJSON: ``value`` holds something JSON cannot represent.
    """
    # Most arguments need no rewriting: check them, and encode them as they are. Anything else
    # (an integral float, or something to refuse with the path that names it) is rebuilt.
    plain = value if _plain(value) else _canonical(value, "$")
    try:
        return orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError) as exc:  # an int past 64 bits
        raise NotJSON(f"arguments are not JSON-serialisable: {exc}") from exc


def fingerprint(args: object, tool: str, step: str | None = None) -> str:
    """The fingerprint of an action: its tool, its step and its arguments (see the module's
    account of the encoding); what a reservation stores and a conflict names.

    Raises:
        MissingIdentity: the tool name is missing or empty.
        InvalidName: the tool name or step id is not valid text (a lone surrogate).
        NotJSON: the arguments are not plain JSON.
    """
    _check_part("tool name", tool)
    if step is not None:
        _check_part("step id", step)
    return _fingerprint(tool, step, canonical_json(args))


def legacy_fingerprint(args: object) -> str:
    """The version 1 fingerprint of ``args`` (the SHA-256 hex of their canonical JSON alone),
    as reservations made before version 2 stored it."""
    canonical = canonical_json(args)
    return hashlib.sha256(b"agentlease-args/1\x00" + canonical).hexdigest()


def fingerprint_names(fp: str) -> tuple[str, str | None] | None:
    """The tool and step a fingerprint names (cut to 100 characters), or ``None`` for a
    version 1 fingerprint or a string that is not a fingerprint."""
    version, _, rest = fp.partition(":")
    if version != str(FINGERPRINT_VERSION):
        return None
    label = rest.partition(":")[2]
    try:
        names = orjson.loads(label)
    except orjson.JSONDecodeError:
        return None
    if (
        isinstance(names, list)
        and len(names) == 2
        and isinstance(names[0], str)
        and (names[1] is None or isinstance(names[1], str))
    ):
        return names[0], names[1]
    return None


def derive_key(task_id: str, step_id: str, tool: str, args: object) -> str:
    """The idempotency key of one action (hex SHA-256).

    Args:
        task_id: the task the action belongs to (a worker's job supplies it).
        step_id: which step of the task this is, stable across attempts.
        tool: the tool's name.
        args: the tool's arguments, plain JSON.

    Raises:
        MissingIdentity: the task, step or tool is missing or empty.
        InvalidName: one of them is not valid text (a lone surrogate).
        NotJSON: the arguments are not plain JSON.
    """
    return key_and_fingerprint(task_id, step_id, tool, args)[0]


def key_and_fingerprint(task_id: str, step_id: str, tool: str, args: object) -> tuple[str, str]:
    """:func:`derive_key` and :func:`fingerprint` together, encoding the arguments once."""
    for what, part in (("task id", task_id), ("step id", step_id), ("tool name", tool)):
        _check_part(what, part)
    canonical = canonical_json(args)
    key = hashlib.sha256(_key_head(task_id, step_id, tool) + canonical + b"]").hexdigest()
    return key, _fingerprint(tool, step_id, canonical)


@lru_cache(maxsize=1024)
def _key_head(task_id: str, step_id: str, tool: str) -> bytes:
    """What the key's hash reads before the arguments' encoding: the domain, then the canonical
    JSON of [version, task, step, tool, args] up to the arguments (compact JSON: the array's
    closing bracket is its last byte). A task's calls of one tool in one step share it."""
    identity = orjson.dumps([KEY_VERSION, task_id, step_id, tool])[:-1] + b","
    return b"agentlease-key/%d\x00" % KEY_VERSION + identity


def _check_part(what: str, part: object) -> None:
    if not isinstance(part, str) or not part:
        raise MissingIdentity(
            f"an idempotent action needs a {what}, got {part!r}: without it two different"
            " actions could share a key"
        )
    if not part.isascii():
        try:
            part.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8, so nothing to hash
            raise InvalidName(f"{what} {part!r} is not valid text: {exc.reason}") from None


def _fingerprint(tool: str, step: str | None, canonical: bytes) -> str:
    head, label = _fingerprint_parts(tool, step)
    return f"{FINGERPRINT_VERSION}:{hashlib.sha256(head + canonical + b']').hexdigest()}:{label}"


@lru_cache(maxsize=1024)
def _fingerprint_parts(tool: str, step: str | None) -> tuple[bytes, str]:
    """What a fingerprint's hash reads before the arguments' encoding (the domain, then the
    canonical JSON of [version, tool, step, args] up to the arguments), and its label: the same
    for every call of one tool in one step."""
    head = orjson.dumps([FINGERPRINT_VERSION, tool, step])[:-1] + b","
    label = orjson.dumps([tool[:_LABEL], None if step is None else step[:_LABEL]]).decode()
    return b"agentlease-args/%d\x00" % FINGERPRINT_VERSION + head, label


def check_key(key: object) -> str:
    """Validate a caller-supplied key (for example an upstream ``Idempotency-Key`` header).

    Raises:
        InvalidName: not a string of 1 to 256 printable ASCII characters without spaces.
    """
    if (
        not isinstance(key, str)
        or not 0 < len(key) <= _MAX_KEY
        or not key.isascii()
        or not key.isprintable()
        or " " in key
    ):
        raise InvalidName(
            f"idempotency key {key!r} must be 1 to {_MAX_KEY} printable ASCII characters"
            " without spaces"
        )
    return key


def reservable(
    *,
    state: str,
    fingerprint: str,
    stored_fingerprint: str,
    held: bool,
    expires_at: float | None,
    purge_at: float,
    now: float,
) -> bool:
    """Whether a reserve may take a stored key: past its window (a new action), or in flight
    with its in-flight lease run out and either the same arguments or no holder (released).

    The rule every backend's ``reserve_key`` applies, in its own language where it must.
    """
    if purge_at <= now:
        return True
    expired = state == "in_flight" and expires_at is not None and expires_at <= now
    return expired and (stored_fingerprint == fingerprint or not held)
