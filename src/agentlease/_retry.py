"""Retries: ``al.retry(...)``, full-jitter backoff that never sleeps past the deadline, with a
shared retry budget and a circuit breaker as hooks.

agentlease has its own small engine rather than building on stamina or tenacity. stamina's jitter
is added to the exponential delay rather than spread over it, and it has no hook that may reach a
store (let alone an awaited one) before a call and before each retry; tenacity could carry the
hooks as callbacks, but giving up before a sleep that would cross the current deadline, the list
of errors that are never retried and the budget's refusal would all be written on top of it, in
more lines than the engine itself, for a new dependency.

One engine serves both faces: the decorator runs the attempts of the iterator (``for attempt in
retry(...): with attempt: ...``, or ``async for`` ... ``async with attempt:``), and each attempt
goes through these steps:

1. the deadline is checked (:class:`~agentlease.errors.DeadlineExceeded` if it has passed);
2. ``breaker.before()`` (may raise :class:`~agentlease.errors.CircuitOpen`: never retried);
3. on the first attempt of a call only, ``budget.record_call()`` (a retry is not a new call, and
   a call the breaker refused never reached the dependency, so it is not counted);
4. the attempt; then ``breaker.success()``, or for an error that ``on`` names
   ``breaker.failure(exc)`` (only those count as the dependency failing: an error that is not
   retried is the caller's bug or a refusal, and says nothing of the dependency's health);
5. for a retry: the backoff is chosen, uniform in ``[0, min(cap, base * 2**retry)]``; if sleeping
   it would reach the deadline, :class:`~agentlease.errors.DeadlineExceeded` is raised at once
   (the last error as its ``__cause__``); else ``budget.acquire_retry()``, which raises
   :class:`~agentlease.errors.RetryBudgetExhausted` to stop (the last error as its
   ``__context__``); then the sleep.

After the last attempt, the last error propagates unchanged. Errors outside ``on`` propagate at
once, and these are never retried whatever ``on`` says: every
:class:`~agentlease.errors.ToolUnavailable` (deadline, open circuit, spent budgets),
:class:`~agentlease.errors.Cancelled`, :class:`asyncio.CancelledError`, :class:`KeyboardInterrupt`,
:class:`SystemExit` and :class:`GeneratorExit`. On the async face the hooks are awaited (a hook
may also be a plain method); on the sync face they must be plain methods.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, ParamSpec, Protocol, TypeVar, overload

from agentlease import _clock
from agentlease._deadline import current_deadline
from agentlease._policy.retry import full_jitter
from agentlease._validate import duration, flag, integer
from agentlease.errors import Cancelled, DeadlineExceeded, InvalidInput, ToolUnavailable

__all__ = [
    "NEVER_RETRIED",
    "AsyncBreakerHook",
    "AsyncBudgetHook",
    "Attempt",
    "BreakerHook",
    "BudgetHook",
    "Retrying",
    "retry",
]

P = ParamSpec("P")
R = TypeVar("R")

# Never retried, whatever ``on`` says: refusals meant to stop (and reach a planner), and the
# exceptions that end a task, a thread or the process.
NEVER_RETRIED: tuple[type[BaseException], ...] = (
    ToolUnavailable,
    Cancelled,
    asyncio.CancelledError,
    KeyboardInterrupt,
    SystemExit,
    GeneratorExit,
)

MAX_ATTEMPTS = 10_000


class BudgetHook(Protocol):
    """A retry budget as the sync face calls it (a store round trip each, or none if cached)."""

    def record_call(self) -> object:
        """Count a new call (before the first attempt of each call, never before a retry)."""

    def acquire_retry(self) -> object:
        """Take one retry from the budget, or raise
        :class:`~agentlease.errors.RetryBudgetExhausted`."""


class AsyncBudgetHook(Protocol):
    """A retry budget as the async face awaits it."""

    async def record_call(self) -> object:
        """Count a new call (before the first attempt of each call, never before a retry)."""

    async def acquire_retry(self) -> object:
        """Take one retry from the budget, or raise
        :class:`~agentlease.errors.RetryBudgetExhausted`."""


class BreakerHook(Protocol):
    """A circuit breaker as the sync face calls it."""

    def before(self) -> object:
        """Admit an attempt, or raise :class:`~agentlease.errors.CircuitOpen`."""

    def success(self) -> object:
        """The attempt succeeded."""

    def failure(self, exc: BaseException) -> object:
        """The attempt failed with an error that ``on`` names (the dependency failed)."""


class AsyncBreakerHook(Protocol):
    """A circuit breaker as the async face awaits it."""

    async def before(self) -> object:
        """Admit an attempt, or raise :class:`~agentlease.errors.CircuitOpen`."""

    async def success(self) -> object:
        """The attempt succeeded."""

    async def failure(self, exc: BaseException) -> object:
        """The attempt failed with an error that ``on`` names (the dependency failed)."""


Budget = BudgetHook | AsyncBudgetHook
Breaker = BreakerHook | AsyncBreakerHook
On = type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]


def _error_types(on: object) -> tuple[type[BaseException], ...] | None:
    """``on`` as a tuple of exception types, or ``None`` if it is a predicate."""
    kinds = on if isinstance(on, tuple) else (on,)
    if isinstance(on, tuple) and not on:
        raise InvalidInput("on must name at least one exception type")
    if not isinstance(on, tuple) and not isinstance(on, type) and callable(on):
        return None
    for kind in kinds:
        if not isinstance(kind, type) or not issubclass(kind, BaseException):
            raise InvalidInput(
                "on must be an exception type, a tuple of them or a predicate "
                f"(exception -> bool), not {kind!r}"
            )
        if kind in (Exception, BaseException):
            raise InvalidInput(
                f"on={kind.__name__} would retry every error, bugs included: name the "
                "errors that are worth retrying (or pass a predicate)"
            )
        if issubclass(kind, NEVER_RETRIED):
            raise InvalidInput(f"{kind.__name__} is never retried: it means stop")
    return kinds


def _hooks(value: object, what: str, methods: tuple[str, ...]) -> None:
    if value is None:
        return
    for name in methods:
        if not callable(getattr(value, name, None)):
            raise InvalidInput(f"{what} must have a {name}() method ({type(value).__name__})")


def _past_deadline(what: str, message: str) -> DeadlineExceeded:
    # The deadline has not passed yet: the next sleep would reach it. Say so.
    return DeadlineExceeded(what, message=message)


class Retrying:
    """What :func:`retry` returns: a decorator, and an iterator of attempts (sync and async).

    Reusable and safe to share: each decorated call or each loop over it is a run of its own.
    """

    def __init__(
        self,
        on: On,
        *,
        attempts: int,
        base: float,
        cap: float,
        jitter: bool,
        budget: Budget | None,
        breaker: Breaker | None,
        rand: random.Random | None,
    ) -> None:
        self._types = _error_types(on)
        self._predicate: Callable[[BaseException], bool] | None = None
        if self._types is None and not isinstance(on, type | tuple):
            self._predicate = on
        self.attempts = integer(attempts, "attempts", low=1, high=MAX_ATTEMPTS)
        self.base = duration(base, "base")
        self.cap = duration(cap, "cap")
        self.jitter = flag(jitter, "jitter")
        if rand is not None and not isinstance(rand, random.Random):
            raise InvalidInput(f"rand must be a random.Random, not {type(rand).__name__}")
        self._rand = rand
        _hooks(budget, "budget", ("record_call", "acquire_retry"))
        _hooks(breaker, "breaker", ("before", "success", "failure"))
        self.budget = budget
        self.breaker = breaker
        self._awaited = _awaited_hooks(self)  # once: a guarded call must stay cheap

    def retryable(self, exc: BaseException) -> bool:
        """Whether ``exc`` is retried (and counts as the dependency failing)."""
        if isinstance(exc, NEVER_RETRIED):
            return False
        if self._types is not None:
            return isinstance(exc, self._types)
        assert self._predicate is not None
        return bool(self._predicate(exc))

    def backoff(self, retry: int) -> float:
        """The delay before retry number ``retry`` (0 for the first retry)."""
        if self.jitter:
            return full_jitter(retry, base=self.base, cap=self.cap, rand=self._rand)
        return min(self.cap, self.base * (2.0 ** min(retry, 62)))

    def __iter__(self) -> SyncAttempts:
        return SyncAttempts(self)

    def __aiter__(self) -> AsyncAttempts:
        return AsyncAttempts(self)

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]: ...
    @overload
    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]: ...
    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        if not callable(fn):
            raise InvalidInput(f"retry(...) decorates a function, not {type(fn).__name__}")
        name = getattr(fn, "__qualname__", repr(fn))
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                async for attempt in AsyncAttempts(self, name):
                    async with attempt:
                        return await fn(*args, **kwargs)
                raise AssertionError("unreachable: the last attempt returns or raises")

            return run_async

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> Any:
            for attempt in SyncAttempts(self, name):
                with attempt:
                    return fn(*args, **kwargs)
            raise AssertionError("unreachable: the last attempt returns or raises")

        return run


class Attempt:
    """One attempt of a run: enter it around the call (``with attempt:``; ``async with
    attempt:`` on the async face).

    A retryable error is swallowed by the block (the loop goes on to the next attempt); after
    the last attempt, and for every other error, it propagates unchanged.

    Attributes:
        number: 1 for the first attempt, 2 for the first retry, ...
        delay: the backoff slept before this attempt, in seconds (0.0 for the first).
    """

    __slots__ = ("_run", "delay", "number")

    def __init__(self, run: _Attempts, number: int, delay: float) -> None:
        self._run = run
        self.number = number
        self.delay = delay

    def __repr__(self) -> str:
        return f"<Attempt {self.number} after {self.delay:.3f} s>"

    def __enter__(self) -> Attempt:
        self._run.enter_sync()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self._run.settle_sync(exc)

    async def __aenter__(self) -> Attempt:
        self._run.enter_async()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return await self._run.settle_async(exc)


def _chained(exc: BaseException, last: BaseException | None) -> None:
    """Record ``last`` (the error being retried) as the context of a refusal that stops it."""
    if last is not None and exc is not last and exc.__cause__ is None and exc.__context__ is None:
        exc.__context__ = last


class _Attempts:
    """The state of one run: the attempt number, the error to retry, whether it ended."""

    def __init__(self, spec: Retrying, what: str = "the retried call") -> None:
        self._spec = spec
        self._what = what
        self._number = 0
        self._failed: BaseException | None = None
        self._done = False

    def _next_delay(self) -> tuple[BaseException | None, float]:
        """The error to retry (``None`` before the first attempt) and the backoff before the
        next attempt; raises if the run has ended or the sleep would reach the deadline."""
        failed, self._failed = self._failed, None
        if self._done or (self._number and failed is None):
            self._done = True
            raise _Ended
        if failed is None:
            return None, 0.0
        delay = self._spec.backoff(self._number - 1)
        at = current_deadline()
        if at is not None:
            left = at - _clock.monotonic()
            if left <= delay:
                self._done = True
                raise _past_deadline(
                    self._what,
                    f"the deadline of {self._what} is {max(0.0, left):.3f} s away, within "
                    f"the next backoff of {delay:.3f} s: giving up on {type(failed).__name__} "
                    f"after {self._number} attempts",
                ) from failed
        return failed, delay

    def _check_deadline(self, failed: BaseException | None) -> None:
        at = current_deadline()
        if at is not None:
            now = _clock.monotonic()
            if now >= at:
                self._done = True
                raise DeadlineExceeded(self._what, overdue_s=now - at) from failed

    def _classify(self, exc: BaseException | None) -> bool | None:
        """After an attempt: ``None`` if it succeeded, ``True`` if ``exc`` is retried, ``False``
        if it propagates now."""
        if exc is None:
            self._done = True
            return None
        if not self._spec.retryable(exc):
            self._done = True
            return False
        return True

    def _after_failure(self, exc: BaseException) -> bool:
        if self._number >= self._spec.attempts:
            self._done = True
            return False
        self._failed = exc
        return True

    # The sync face.

    def enter_sync(self) -> None:
        pass

    def settle_sync(self, exc: BaseException | None) -> bool:
        verdict = self._classify(exc)
        breaker = self._spec.breaker
        if verdict is None:
            if breaker is not None:
                _call(breaker.success)
            return False
        if not verdict:
            return False
        assert exc is not None
        if breaker is not None:
            _call(breaker.failure, exc)
        return self._after_failure(exc)

    def start_sync(self) -> Attempt:
        failed, delay = self._next_delay()
        spec = self._spec
        try:
            if failed is not None:
                if spec.budget is not None:
                    _call(spec.budget.acquire_retry)
                time.sleep(delay)
            self._check_deadline(failed)
            if spec.breaker is not None:
                _call(spec.breaker.before)
            if self._number == 0 and spec.budget is not None:
                _call(spec.budget.record_call)
        except BaseException as refused:
            self._done = True
            _chained(refused, failed)
            raise
        self._number += 1
        return Attempt(self, self._number, delay)

    # The async face.

    def enter_async(self) -> None:
        pass

    async def settle_async(self, exc: BaseException | None) -> bool:
        verdict = self._classify(exc)
        breaker = self._spec.breaker
        if verdict is None:
            if breaker is not None:
                await _acall(breaker.success)
            return False
        if not verdict:
            return False
        assert exc is not None
        if breaker is not None:
            await _acall(breaker.failure, exc)
        return self._after_failure(exc)

    async def start_async(self) -> Attempt:
        failed, delay = self._next_delay()
        spec = self._spec
        try:
            if failed is not None:
                if spec.budget is not None:
                    await _acall(spec.budget.acquire_retry)
                await asyncio.sleep(delay)
            self._check_deadline(failed)
            if spec.breaker is not None:
                await _acall(spec.breaker.before)
            if self._number == 0 and spec.budget is not None:
                await _acall(spec.budget.record_call)
        except BaseException as refused:
            self._done = True
            _chained(refused, failed)
            raise
        self._number += 1
        return Attempt(self, self._number, delay)


class _Ended(Exception):
    """The run is over (internal: becomes StopIteration / StopAsyncIteration)."""


class SyncAttempts(_Attempts):
    """The attempts of one run on the sync face: ``for attempt in retry(...):``."""

    def __init__(self, spec: Retrying, what: str = "the retried call") -> None:
        super().__init__(spec, what)
        awaited = spec._awaited
        if awaited:
            raise InvalidInput(
                f"{', '.join(awaited)} must be awaited: on the sync face the hooks must be "
                "plain methods (use async for, or decorate an async def)"
            )

    def __iter__(self) -> SyncAttempts:
        return self

    def __next__(self) -> Attempt:
        try:
            return self.start_sync()
        except _Ended:
            raise StopIteration from None

    def enter_async(self) -> None:
        raise InvalidInput("an attempt of a sync loop is entered with `with attempt:`")


class AsyncAttempts(_Attempts):
    """The attempts of one run on the async face: ``async for attempt in retry(...):``."""

    def __aiter__(self) -> AsyncAttempts:
        return self

    async def __anext__(self) -> Attempt:
        try:
            return await self.start_async()
        except _Ended:
            raise StopAsyncIteration from None

    def enter_sync(self) -> None:
        # A plain `with` cannot await the breaker's success or failure: a success returned from
        # inside the block would go unrecorded, so an awaited breaker needs `async with`.
        if any(name in self._spec._awaited for name in ("breaker.success", "breaker.failure")):
            raise InvalidInput(
                "the breaker's hooks are awaited: enter the attempt with `async with attempt:`"
            )


def _awaited_hooks(spec: Retrying) -> list[str]:
    found = []
    for what, hooks, names in (
        ("budget", spec.budget, ("record_call", "acquire_retry")),
        ("breaker", spec.breaker, ("before", "success", "failure")),
    ):
        for name in names:
            if hooks is not None and inspect.iscoroutinefunction(getattr(hooks, name)):
                found.append(f"{what}.{name}")
    return found


def _call(hook: Callable[..., object], *args: object) -> None:
    result = hook(*args)
    if result is not None and inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise InvalidInput(
            f"{getattr(hook, '__qualname__', hook)} returned an awaitable: on the sync face "
            "the hooks must be plain methods"
        )


async def _acall(hook: Callable[..., object], *args: object) -> None:
    result = hook(*args)
    if inspect.isawaitable(result):
        await result


def retry(
    on: On,
    *,
    attempts: int = 3,
    base: float = 0.1,
    cap: float = 10.0,
    jitter: bool = True,
    budget: Budget | None = None,
    breaker: Breaker | None = None,
    rand: random.Random | None = None,
) -> Retrying:
    """Retry the errors named in ``on``, with full-jitter exponential backoff, within the
    deadline in force::

        @agentlease.retry(on=httpx.TransportError, attempts=4)
        def fetch(url: str) -> bytes: ...

        async for attempt in agentlease.retry(on=TimeoutError):
            async with attempt:
                await call_the_model()

    Decorates a function or an ``async def`` (the wrapper keeps its name and signature), or is
    iterated for attempts: ``for attempt in retry(...): with attempt: call()`` (``async for``
    and ``async with attempt:`` on the async face; a plain ``with`` works there too unless the
    breaker's hooks are awaited).

    Args:
        on: the errors worth retrying: an exception type, a tuple of them, or a predicate
            ``(exc) -> bool``. ``Exception`` and ``BaseException`` are refused, and the
            refusals of :data:`NEVER_RETRIED` are never retried.
        attempts: the most attempts of one call, first one included (1 means no retry).
        base: the upper bound of the first backoff, in seconds.
        cap: the largest upper bound of a backoff, in seconds.
        jitter: ``True`` (the default) sleeps uniform in ``[0, min(cap, base * 2**retry)]``;
            ``False`` sleeps exactly that bound (a synchronised wave: for comparison only).
        budget: a shared retry budget: ``record_call()`` before each call's first attempt,
            ``acquire_retry()`` before each retry's sleep (raising
            :class:`~agentlease.errors.RetryBudgetExhausted` stops at once).
        breaker: a circuit breaker: ``before()`` before every attempt (raising
            :class:`~agentlease.errors.CircuitOpen` stops at once), ``success()`` after a
            success, ``failure(exc)`` after an error that ``on`` names.
        rand: the random stream of the jitter (seed it in tests).

    Raises:
        InvalidInput: an argument is refused (``InvalidDuration`` for ``base`` and ``cap``).
        DeadlineExceeded: (from a call) the deadline has passed, or the next backoff would
            reach it; the last error is its ``__cause__``.
    """
    return Retrying(
        on,
        attempts=attempts,
        base=base,
        cap=cap,
        jitter=jitter,
        budget=budget,
        breaker=breaker,
        rand=rand,
    )
