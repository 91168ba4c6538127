"""``@idempotent``: make a side-effecting function run at most once per action.

The decorated function's arguments (bound to its signature, defaults applied, ``exclude``
removed) are the action's arguments; the task comes from the running worker's job or
:func:`agentlease.idempotency_scope`, the step from ``step=`` or the scope. Sync functions need an
:class:`~agentlease.Idempotency`, async ones an :class:`~agentlease.AsyncIdempotency`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any, Generic, ParamSpec, TypeVar, overload

from agentlease._async.idempotency import AsyncIdempotency
from agentlease._outcomes import ErrorTypes, Outcome, error_types
from agentlease._sync.idempotency import Idempotency
from agentlease.errors import InvalidInput

__all__ = ["AsyncIdempotentFunction", "IdempotentFunction", "idempotent"]

P = ParamSpec("P")
R = TypeVar("R")


class _Bound:
    """What the wrappers share: the function's signature and the action's settings."""

    def __init__(
        self,
        fn: Callable[..., Any],
        tool: str,
        step: str | None,
        exclude: Collection[str],
        wait: float | None,
        fail_on: ErrorTypes,
        release_on: ErrorTypes,
    ) -> None:
        self.signature = inspect.signature(fn)
        if isinstance(exclude, str | bytes) or not isinstance(exclude, Iterable):
            raise InvalidInput(f"exclude must be a collection of parameter names, not {exclude!r}")
        unknown = set(exclude) - set(self.signature.parameters)
        if unknown:
            raise InvalidInput(
                f"exclude names no parameter of {fn.__qualname__}: {sorted(unknown)}"
            )
        self.tool = tool
        self.step = step
        self.exclude = frozenset(exclude)
        self.options: dict[str, Any] = {
            "tool": tool,
            "step": step,
            "wait": wait,
            "fail_on": error_types(fail_on, "fail_on"),
            "release_on": error_types(release_on, "release_on"),
        }
        # A signature of plain parameters (no *args, **kwargs, positional- or keyword-only)
        # binds by name and position without inspect: the arguments of most tools.
        params = self.signature.parameters.values()
        plain = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)
        self._names = tuple(p.name for p in params) if plain else None
        self._defaults = {p.name: p.default for p in params if p.default is not p.empty}

    def args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The action's arguments: bound to the signature, defaults applied, ``exclude`` left
        out (the key's canonical JSON sorts them, so their order does not matter).

        Raises:
            TypeError: the arguments do not fit the signature (as calling the function would).
        """
        names = self._names
        if names is not None and len(args) <= len(names):
            out = dict(zip(names, args, strict=False))  # the rest: by name or default
            if len(args) < len(names) or kwargs:
                used = 0
                for name in names[len(args) :]:
                    if name in kwargs:
                        out[name] = kwargs[name]
                        used += 1
                    elif name in self._defaults:
                        out[name] = self._defaults[name]
                    else:
                        return self._bind(args, kwargs)  # missing: inspect says which
                if used != len(kwargs):
                    return self._bind(args, kwargs)  # unknown or repeated: inspect says which
            if self.exclude:
                for name in self.exclude:
                    del out[name]
            return out
        return self._bind(args, kwargs)

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return {k: v for k, v in bound.arguments.items() if k not in self.exclude}


class IdempotentFunction(Generic[P, R]):
    """A sync function that runs at most once per action; call it as the function itself."""

    def __init__(self, fn: Callable[P, R], store: Idempotency, bound: _Bound) -> None:
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._store = store
        self._bound = bound

    def _identity(self) -> dict[str, Any]:
        """The task and step of this call where they do not come from the decorator's options
        and the scope (an adapter's function names them from its framework's run)."""
        return {}

    def outcome(self, *args: P.args, **kwargs: P.kwargs) -> Outcome[R]:
        """Call, and say whether the result was a replay."""
        return self._store.call(
            functools.partial(self._fn, *args, **kwargs),
            args=self._bound.args(args, kwargs),
            **{**self._bound.options, **self._identity()},
        )

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.outcome(*args, **kwargs).value


class AsyncIdempotentFunction(Generic[P, R]):
    """An async function that runs at most once per action; await it as the function itself."""

    def __init__(
        self, fn: Callable[P, Awaitable[R]], store: AsyncIdempotency, bound: _Bound
    ) -> None:
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._store = store
        self._bound = bound

    def _identity(self) -> dict[str, Any]:
        """As :meth:`IdempotentFunction._identity`."""
        return {}

    async def outcome(self, *args: P.args, **kwargs: P.kwargs) -> Outcome[R]:
        """Call, and say whether the result was a replay."""

        async def run() -> R:
            return await self._fn(*args, **kwargs)

        return await self._store.call(
            run, args=self._bound.args(args, kwargs), **{**self._bound.options, **self._identity()}
        )

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return (await self.outcome(*args, **kwargs)).value


class _Decorator:
    # What it wraps functions in (an adapter's decorator names its own subclasses).
    sync_type: type[IdempotentFunction[Any, Any]] = IdempotentFunction
    async_type: type[AsyncIdempotentFunction[Any, Any]] = AsyncIdempotentFunction

    def __init__(
        self,
        store: Idempotency | AsyncIdempotency,
        tool: str,
        step: str | None,
        exclude: Collection[str],
        wait: float | None,
        fail_on: ErrorTypes,
        release_on: ErrorTypes,
    ) -> None:
        self._store = store
        self._spec = (tool, step, exclude, wait, fail_on, release_on)

    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, fn: Callable[P, Awaitable[R]]
    ) -> AsyncIdempotentFunction[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R]) -> IdempotentFunction[P, R]: ...
    def __call__(
        self, fn: Callable[P, Any]
    ) -> AsyncIdempotentFunction[P, Any] | IdempotentFunction[P, Any]:
        bound = _Bound(fn, *self._spec)
        if inspect.iscoroutinefunction(fn):
            if not isinstance(self._store, AsyncIdempotency):
                raise InvalidInput(
                    f"async function {fn.__qualname__} needs an AsyncIdempotency store"
                )
            return self.async_type(fn, self._store, bound)
        if not isinstance(self._store, Idempotency):
            raise InvalidInput(f"function {fn.__qualname__} needs an Idempotency store (sync)")
        return self.sync_type(fn, self._store, bound)


def idempotent(
    *,
    tool: str,
    store: Idempotency | AsyncIdempotency,
    step: str | None = None,
    exclude: Collection[str] = (),
    wait: float | None = None,
    fail_on: ErrorTypes = (),
    release_on: ErrorTypes = (),
) -> _Decorator:
    """Make a side-effecting function run at most once per action::

        keys = agentlease.Idempotency.connect("sqlite:///agents.db")

        @agentlease.idempotent(tool="send_email", store=keys, step="welcome")
        def send_email(to: str, body: str) -> dict[str, str]:
            key = agentlease.current_key()  # pass it on: Idempotency-Key header
            return mailer.send(to, body, idempotency_key=key)

    Args:
        tool: the tool's name (part of the key).
        store: where keys live; :class:`~agentlease.Idempotency` for sync functions,
            :class:`~agentlease.AsyncIdempotency` for async ones.
        step: the step id (part of the key); if omitted, the current
            :func:`~agentlease.idempotency_scope` must name one.
        exclude: parameters left out of the key (a client object, a logger).
        wait: seconds to wait for a concurrent attempt before raising DuplicateInFlight (by
            default none, except inside a worker's job: see :meth:`Idempotency.begin`).
        fail_on: errors that are permanent: stored, and raised again by every later call.
        release_on: errors known to mean the side effect did not happen: the key is released.

    Raises:
        InvalidInput: the store's face does not match the function, ``exclude`` names no
            parameter (or is a lone str), or ``fail_on``/``release_on`` is not a tuple of
            exception classes.
    """
    return _Decorator(store, tool, step, exclude, wait, fail_on, release_on)
