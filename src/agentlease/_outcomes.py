"""The outcomes of idempotent actions: what a call returns, and stored failures raised again.

Shared by both faces of :mod:`agentlease._async.idempotency`, so ``NotApplied`` and ``Outcome``
are one class each whichever face raises or returns them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

import orjson

from agentlease import errors
from agentlease._codec import JSON
from agentlease.errors import InvalidInput, ReplayedFailure

__all__ = ["ErrorTypes", "NotApplied", "Outcome", "error_json", "error_types", "rebuild"]

T = TypeVar("T")
ErrorTypes = tuple[type[BaseException], ...]


def error_types(value: object, what: str) -> ErrorTypes:
    """``value`` as a tuple of exception classes (``fail_on``, ``release_on``), checked before
    the action runs: a wrong one found only when the action raised would come after its side
    effect."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidInput(f"{what} must be a tuple of exception classes, not {value!r}")
    types = tuple(value)
    for t in types:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise InvalidInput(f"{what} must hold exception classes, not {t!r}")
    return types


class NotApplied(Exception):
    """Raise (or subclass) inside an idempotent action to say its side effect did not happen:
    the reservation is released and a retry acts at once."""


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """What an idempotent call returned and whether it was a replay.

    Attributes:
        value: the action's result; on a replay, the stored JSON (tuples come back as lists).
        replayed: the action had already run; nothing was done this time.
        key: the action's idempotency key.
    """

    value: T
    replayed: bool
    key: str


def _type_name(cls: type[BaseException]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def error_json(exc: BaseException) -> bytes:
    """How a permanent failure is stored: its type's qualified name and its message."""
    return orjson.dumps({"type": _type_name(type(exc)), "message": str(exc)})


def rebuild(key: str, error: JSON, known: ErrorTypes) -> BaseException:
    """A stored permanent failure as an exception of its own type, when ``known`` (or
    agentlease's own errors) name it; else :class:`~agentlease.errors.ReplayedFailure`.

    Types are only ever looked up among those given, never imported by name from the store.
    """
    info = error if isinstance(error, dict) else {}
    name, message = str(info.get("type", "")), str(info.get("message", ""))
    ours = [getattr(errors, n) for n in errors.__all__]
    for cls in (*known, *ours):
        if _type_name(cls) == name:
            try:
                return cls(message)  # type: ignore[no-any-return]
            except TypeError:  # a constructor with other arguments: keep type and message
                exc: BaseException = cls.__new__(cls)
                BaseException.__init__(exc, message)
                return exc
    return ReplayedFailure(key, name, message)
