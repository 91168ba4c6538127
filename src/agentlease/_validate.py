"""Argument checks shared by both faces; each raises a typed error and writes nothing."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import TypeVar

from agentlease._records import Lease
from agentlease.errors import InvalidDuration, InvalidInput, InvalidName

__all__ = [
    "EXACT_INT",
    "LONGEST",
    "batch_size",
    "duration",
    "flag",
    "items",
    "lease",
    "optional_duration",
    "queue_name",
    "task_id",
]

T = TypeVar("T")

# The longest duration accepted anywhere (100 years): every store's clock arithmetic and every
# wait of a thread (threading.TIMEOUT_MAX, about 292 years on Linux) takes it. PostgreSQL's
# timestamps end in the year 294276, and a renewal thread told to wait 1e308 s died of it.
LONGEST = 100 * 365.25 * 86_400

# The largest integer every store compares exactly: Redis's Lua scripts hold numbers as doubles,
# which are exact integers only up to 2**53. Counter amounts, limits and values, versions and
# fencing tokens stay within +-EXACT_INT on every backend, so that all of them behave alike.
EXACT_INT = 2**53 - 1

# Queue names become parts of Redis keys and SQL values; braces, spaces and control characters are
# kept out so that hash tags and key patterns cannot be forged from a name.
_QUEUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}")
_TASK_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@/+=-]{0,199}")
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")


def queue_name(name: object) -> str:
    """Return ``name`` if it is a valid queue name, else raise :class:`InvalidName`."""
    if not isinstance(name, str):
        raise InvalidName(f"queue name must be a str, not {type(name).__name__}")
    if not _QUEUE.fullmatch(name):
        raise InvalidName(
            f"invalid queue name {name!r}: 1 to 128 characters from letters, digits and _.:- "
            "(not starting with . : or -)"
        )
    return name


def task_id(value: object) -> str:
    """Return ``value`` if it is a valid task id, else raise :class:`InvalidName`."""
    if not isinstance(value, str):
        raise InvalidName(f"task id must be a str, not {type(value).__name__}")
    if not _TASK_ID.fullmatch(value):
        raise InvalidName(
            f"invalid task id {value!r}: 1 to 200 characters from letters, digits and _.:@/+=-"
        )
    return value


MAX_REASON = 1000
"""The longest cancel reason accepted, in characters."""


def reason(value: object) -> str:
    """Return ``value`` if it is a cancel reason: a str of 1 to :data:`MAX_REASON` characters
    with no control characters (it is shown in one line) and no lone surrogates (it is stored
    as UTF-8), else raise :class:`InvalidInput`."""
    if not isinstance(value, str):
        raise InvalidInput(f"reason must be a str, not {type(value).__name__}")
    if not value.strip() or len(value) > MAX_REASON:
        raise InvalidInput(f"reason must be 1 to {MAX_REASON} characters, not {len(value)}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidInput("reason must not hold control characters (newlines included)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("reason must be valid Unicode (no lone surrogates)") from None
    return value


def duration(value: object, what: str) -> float:
    """Return ``value`` as seconds if it is a positive finite number."""
    seconds = _seconds(value, what)
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidDuration(f"{what} must be a positive finite number of seconds, not {value!r}")
    return seconds


def _seconds(value: object, what: str) -> float:
    """``value`` as a float of seconds, refused past :data:`LONGEST` (an int past the float
    range is infinite, and refused by the callers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidDuration(f"{what} must be a number of seconds, not {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:
        return math.inf
    if LONGEST < seconds < math.inf:
        raise InvalidDuration(f"{what} must be at most {LONGEST:.0f} s (100 years), not {value!r}")
    return seconds


def optional_duration(value: object, what: str) -> float | None:
    """Like :func:`duration`, but ``None`` passes through."""
    return None if value is None else duration(value, what)


def non_negative(value: object, what: str) -> float:
    """Return ``value`` as seconds if it is a finite number >= 0."""
    seconds = _seconds(value, what)
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidDuration(f"{what} must be a finite number of seconds >= 0, not {value!r}")
    return seconds


def batch_size(value: object, *, limit: int = 10_000) -> int:
    """Return ``value`` if it is an int in 1..limit."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"n must be an int, not {type(value).__name__}")
    if not 1 <= value <= limit:
        raise InvalidInput(f"n must be between 1 and {limit}, not {value}")
    return value


def integer(value: object, what: str, *, low: int, high: int) -> int:
    """Return ``value`` if it is an int in low..high."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{what} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidInput(f"{what} must be between {low} and {high}, not {value}")
    return value


def worker_id(value: object) -> str:
    """A worker's id (a lease's holder): a str of 1 to 200 printable characters."""
    if not isinstance(value, str) or not 0 < len(value) <= 200 or not value.isprintable():
        raise InvalidInput("a worker id must be a str of 1 to 200 printable characters")
    return value


def partition(value: object) -> str:
    """Return ``value`` if it is a valid partition key (the rules of a task id)."""
    try:
        return task_id(value)
    except InvalidName as exc:
        raise InvalidName(str(exc).replace("task id", "partition key")) from None


def lease(value: object) -> Lease:
    """Return ``value`` if it is a :class:`Lease` whose fields could have come from a claim.

    A lease made by hand with a field of the wrong type or form is refused here, before any
    store sees it (a store would only find that it holds nothing, after a round trip, or fail
    in its driver).
    """
    if type(value) is not Lease:
        raise InvalidInput(f"a lease must be a Lease from claim(), not {type(value).__name__}")
    try:
        task_id(value.task_id)
        queue_name(value.queue)
    except InvalidName as exc:
        raise InvalidName(f"lease {exc}") from None
    if not isinstance(value.token, str) or not _TOKEN.fullmatch(value.token):
        raise InvalidInput("lease token must be the str a claim returned (1 to 128 of [\\w-])")
    integer(value.attempt, "lease attempt", low=0, high=EXACT_INT)
    for what in ("leased_at", "expires_at"):
        t = getattr(value, what)
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
            raise InvalidInput(f"lease {what} must be a finite number, not {t!r}")
    return value


def items(value: Iterable[T], what: str) -> list[T]:
    """The items of ``value``, an iterable of them; a str, bytes or a mapping is refused (its
    letters, bytes or keys would be taken one by one, which no caller means)."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        kind = type(value).__name__
        raise InvalidInput(f"{what} must be a list (an iterable of items), not {kind}")
    return list(value)


def flag(value: object, what: str) -> bool:
    """Return ``value`` if it is a bool."""
    if not isinstance(value, bool):
        raise InvalidInput(f"{what} must be True or False, not {value!r}")
    return value
