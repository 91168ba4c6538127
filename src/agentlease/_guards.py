"""What the shared-state guards share: names, the locks held by the current context, and the
marker that refuses a model call while a lock is held.

Locks held by a lock set are recorded in a context variable for as long as the set is held, so
code running for that task (and only it) sees them. :func:`model_call` checks it: holding a lock
across a model call makes every other agent wait seconds for the model, and a stuck model hold
the lock until its TTL; by default entering one raises
:class:`~agentlease.errors.LockHeldAcrossModelCall`, or only warns with ``on_lock="warn"``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar, overload

import orjson

from agentlease import _validate as check
from agentlease.errors import InvalidInput, InvalidName, LockHeldAcrossModelCall

__all__ = [
    "ModelCall",
    "decoded",
    "drop_locks",
    "field_name",
    "held_locks",
    "hold_locks",
    "lock_name",
    "model_call",
    "record_key",
]

logger = logging.getLogger("agentlease.guards")
P = ParamSpec("P")
R = TypeVar("R")
_FIELD = re.compile(r"[A-Za-z0-9_.:@/+=-]{1,200}")
_HELD: ContextVar[tuple[str, ...]] = ContextVar("agentlease_held_locks", default=())


def record_key(value: object) -> str:
    """A record, counter or lock name: the rules of a task id (1 to 200 of ``[\\w.:@/+=-]``)."""
    try:
        return check.task_id(value)
    except InvalidName as exc:
        raise InvalidName(str(exc).replace("task id", "name")) from None


lock_name = record_key


def field_name(value: object) -> str:
    """A record field's name."""
    if not isinstance(value, str) or not _FIELD.fullmatch(value):
        raise InvalidName(
            f"invalid field name {value!r}: 1 to 200 characters from letters, digits and _.:@/+=-"
        )
    return value


def decoded(data: bytes) -> object:
    """A stored JSON value, decoded."""
    return orjson.loads(data)


def hold_locks(names: tuple[str, ...]) -> Token[tuple[str, ...]]:
    """Record that the current context holds ``names`` (until :func:`drop_locks`)."""
    return _HELD.set(_HELD.get() + names)


def drop_locks(token: object) -> None:
    """Undo :func:`hold_locks`."""
    _HELD.reset(token)  # type: ignore[arg-type]


def held_locks() -> tuple[str, ...]:
    """The locks the current context holds through lock sets."""
    return _HELD.get()


class ModelCall:
    """The model-call marker: a context manager (sync or async) and a decorator; see
    :func:`model_call`."""

    def __init__(self, on_lock: Literal["raise", "warn"] = "raise") -> None:
        if on_lock not in ("raise", "warn"):
            raise InvalidInput(f"on_lock must be 'raise' or 'warn', not {on_lock!r}")
        self._on_lock = on_lock

    _on_lock: Literal["raise", "warn"]

    def check(self) -> None:
        """Refuse (or warn about) a model call while locks are held."""
        held = _HELD.get()
        if not held:
            return
        if self._on_lock == "raise":
            raise LockHeldAcrossModelCall(held)
        logger.warning(
            "model call entered while holding locks %s",
            list(held),
            extra={"agentlease_locks": held},
        )

    def __enter__(self) -> ModelCall:
        self.check()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    async def __aenter__(self) -> ModelCall:
        self.check()
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(fn):
            afn: Callable[P, Awaitable[Any]] = fn

            @functools.wraps(fn)
            async def awrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                self.check()
                return await afn(*args, **kwargs)

            return awrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            self.check()
            return fn(*args, **kwargs)

        return wrapper


@overload
def model_call(fn: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def model_call(*, on_lock: Literal["raise", "warn"] = "raise") -> ModelCall: ...
def model_call(
    fn: Callable[P, R] | None = None, /, *, on_lock: Literal["raise", "warn"] = "raise"
) -> Callable[P, R] | ModelCall:
    """Mark a model call, as a decorator (sync or async) or a context manager::

        @agentlease.model_call
        async def plan(messages): ...

        with agentlease.model_call(on_lock="warn"):
            reply = client.responses.create(...)

    Entering it while the current task holds locks raises
    :class:`~agentlease.errors.LockHeldAcrossModelCall` (``on_lock="raise"``, the default) or
    logs a warning on the ``agentlease.guards`` logger (``on_lock="warn"``).
    """
    marker = ModelCall(on_lock)
    return marker if fn is None else marker(fn)
