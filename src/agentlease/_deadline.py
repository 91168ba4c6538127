"""Deadlines that propagate and cancel, and the root task that work belongs to.

A deadline is a point on this process's monotonic clock, kept in a context variable, so it
follows the code that runs for a request: into asyncio tasks (which copy the context), into the
worker's thread pool (sync handlers run in a copy of the context), into ``@idempotent`` calls,
retry sleeps and lock acquisition timeouts, and into tasks enqueued from inside a handler, which
carry it as an absolute time on the **store's** clock (so machines whose clocks disagree agree on
it) and turn it back into a monotonic point when a worker claims them.

Nested deadlines only ever shorten: the effective deadline is the earliest of those in force.

``with deadline(s):`` sets it for sync code, which learns of it through :func:`check_deadline`,
:func:`remaining`, :func:`call_timeout` (an HTTP client's timeout) and everything agentlease
does on its behalf. ``async with deadline(s):`` also cancels the block when the deadline passes
(asyncio cancellation, as :func:`asyncio.timeout` does) and raises
:class:`~agentlease.errors.DeadlineExceeded` in its place.

A deadline ends the whole tree of work (a worker dead-letters a task whose deadline has passed,
with reason ``deadline``); it is not a per-attempt time limit, after which an attempt would fail
and be retried.

The root task is the task a request started as: every task enqueued from a handler inherits its
root (a task enqueued from outside any handler is its own root), and root-scoped retry and spend
budgets are keyed on it, so a fan-out of subagents in other processes shares one budget.
"""

from __future__ import annotations

import asyncio
import math
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import TracebackType

from agentlease import _clock
from agentlease._validate import duration
from agentlease.errors import DeadlineExceeded

__all__ = [
    "Propagated",
    "call_timeout",
    "cap",
    "check_deadline",
    "current_deadline",
    "current_root",
    "deadline",
    "enter_work",
    "leave_work",
    "remaining",
]

_DEADLINE: ContextVar[float | None] = ContextVar("agentlease_deadline", default=None)


@dataclass(frozen=True, slots=True)
class Propagated:
    """What a task hands on to the tasks enqueued from its handler.

    Attributes:
        root: the root task's id.
        store_offset: the store's clock minus this process's monotonic clock, as measured at
            the claim (so a monotonic deadline converts to the store's clock without a round
            trip), or ``None`` if unknown.
    """

    root: str
    store_offset: float | None = None


_WORK: ContextVar[Propagated | None] = ContextVar("agentlease_work", default=None)


def current_deadline() -> float | None:
    """The deadline in force, on the monotonic clock (``_clock.monotonic()``), or ``None``."""
    return _DEADLINE.get()


def current_root() -> Propagated | None:
    """The root task of the work running now (set by the worker around each handler)."""
    return _WORK.get()


def remaining() -> float | None:
    """Seconds left before the deadline in force (0.0 once it has passed), or ``None`` if there
    is no deadline."""
    at = _DEADLINE.get()
    if at is None:
        return None
    return max(0.0, at - _clock.monotonic())


def call_timeout(default: float | None = None) -> float | None:
    """A timeout for a call that must end by the deadline (an HTTP client's ``timeout=``): the
    smaller of ``default`` and :func:`remaining`, or ``None`` if neither bounds it.

    Raises:
        DeadlineExceeded: the deadline has passed already (do not start the call).
    """
    check_deadline()
    left = remaining()
    if left is None:
        return default
    return left if default is None else min(default, left)


def cap(give_up: float) -> float:
    """``give_up`` (a monotonic time) or the deadline in force, whichever comes first: a wait
    that ends at it then calls :func:`check_deadline`, which raises if it was the deadline."""
    at = _DEADLINE.get()
    return give_up if at is None else min(give_up, at)


def check_deadline(what: str = "the work") -> None:
    """Raise if the deadline in force has passed: call it between steps of long sync work.

    Raises:
        DeadlineExceeded: the deadline has passed.
    """
    at = _DEADLINE.get()
    if at is not None:
        now = _clock.monotonic()
        if now >= at:
            raise DeadlineExceeded(what, overdue_s=now - at)


def enter_work(
    root: str, store_offset: float | None, at: float | None
) -> tuple[Token[Propagated | None], Token[float | None]]:
    """Set the root task and deadline (monotonic) of the current context; the worker does this
    around each handler. Undo with :func:`leave_work`."""
    outer = _DEADLINE.get()
    if at is not None and outer is not None:
        at = min(at, outer)
    elif at is None:
        at = outer
    return _WORK.set(Propagated(root, store_offset)), _DEADLINE.set(at)


def leave_work(tokens: tuple[Token[Propagated | None], Token[float | None]]) -> None:
    """Undo :func:`enter_work`."""
    _DEADLINE.reset(tokens[1])
    _WORK.reset(tokens[0])


class deadline:
    """Bound the work inside the block to ``seconds`` from now (or to the deadline already in
    force, if that is earlier).

    ``with deadline(5):`` sets the deadline for sync code; ``async with deadline(5):`` also
    cancels the block when it passes and raises :class:`~agentlease.errors.DeadlineExceeded`.
    The object is single-use.

    Attributes:
        at: the effective deadline on the monotonic clock, once entered.

    Raises:
        InvalidDuration: ``seconds`` is not a positive finite number.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = duration(seconds, "seconds")
        self.at: float | None = None
        self._token: Token[float | None] | None = None
        self._timeout: asyncio.Timeout | None = None

    def _enter(self) -> None:
        if self._token is not None:
            raise RuntimeError("a deadline object can only be entered once at a time")
        at = _clock.monotonic() + self.seconds
        outer = _DEADLINE.get()
        self.at = at if outer is None else min(at, outer)
        self._token = _DEADLINE.set(self.at)

    def _exit(self) -> None:
        token, self._token = self._token, None
        if token is not None:
            _DEADLINE.reset(token)

    @property
    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return self.at is not None and _clock.monotonic() >= self.at

    def __enter__(self) -> deadline:
        self._enter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit()

    async def __aenter__(self) -> deadline:
        self._enter()
        assert self.at is not None
        loop = asyncio.get_running_loop()
        # asyncio.timeout_at takes the loop's clock, which is _clock.monotonic() by default.
        self._timeout = asyncio.timeout_at(loop.time() + (self.at - _clock.monotonic()))
        await self._timeout.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        timer, self._timeout = self._timeout, None
        self._exit()
        assert timer is not None
        try:
            await timer.__aexit__(exc_type, exc, tb)
        except TimeoutError as timed_out:
            at = self.at if self.at is not None else _clock.monotonic()
            raise DeadlineExceeded(overdue_s=_clock.monotonic() - at) from timed_out


def store_time(at: float, store_offset: float) -> float:
    """A monotonic deadline as an absolute time on the store's clock."""
    return at + store_offset


def monotonic_time(store_at: float, store_now: float) -> float:
    """An absolute deadline on the store's clock as a monotonic point, given the store's clock
    now (for a claimed task: its lease's ``leased_at``)."""
    if not math.isfinite(store_at):
        raise ValueError("a deadline must be finite")
    return _clock.monotonic() + (store_at - store_now)
