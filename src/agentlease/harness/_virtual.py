"""Virtual time for runs on the memory store: the same seed, the same interleaving.

A run on ``memory://`` never waits on real I/O, so time can be simulated: an event loop whose
selector, when every task is waiting on a timer, moves the clock to that timer at once instead of
sleeping. The loop's clock, the library's monotonic clock (:mod:`agentlease._clock`, a context
variable set for the run's tasks: leases, locks, renewals, deadlines and breakers read it) and the
store's clock are all this clock for the length of the run, so one seed replays one interleaving
and one verdict, and a run that simulates minutes of leases and freezes takes milliseconds.
Nothing global is patched: other threads of the process keep the real clock.

A few lines of our own rather than a test-time plugin: the harness needs the clock as the memory
store's clock too, and only for the run's own tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from agentlease import _clock

__all__ = ["EPOCH", "VirtualClock", "run_virtual"]

T = TypeVar("T")
EPOCH = 1_800_000_000.0  # the wall-clock time a virtual run starts at


class VirtualClock:
    """A clock that moves only when the loop has nothing to do but wait."""

    def __init__(self) -> None:
        self._now = 0.0

    def monotonic(self) -> float:
        """Seconds since the run began."""
        return self._now

    def wall(self) -> float:
        """The store's clock: seconds since the epoch."""
        return EPOCH + self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        if seconds > 0:
            self._now += seconds


class Stalled(RuntimeError):
    """Every task waits and nothing is scheduled: the run can never go on."""


class _Selector(selectors.DefaultSelector):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise Stalled("every task is waiting and nothing is scheduled: the run is stuck")
        self._clock.advance(timeout)
        return []


def run_virtual(main: Callable[[VirtualClock], Coroutine[Any, Any, T]]) -> T:
    """Run ``main(clock)`` to its end on a fresh loop in virtual time."""
    clock = VirtualClock()
    with _clock.using(clock.monotonic):
        loop = asyncio.SelectorEventLoop(_Selector(clock))
        loop.time = clock.monotonic  # type: ignore[method-assign]
        try:
            return loop.run_until_complete(main(clock))
        finally:
            _cancel_leftovers(loop)
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks still pending (background renewals, late requests), as asyncio.run does."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
