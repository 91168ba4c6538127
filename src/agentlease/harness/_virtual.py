"""Virtual time for runs on the memory store: the same seed, the same interleaving.

A run on ``memory://`` never waits on real I/O, so time can be simulated: an event loop whose
selector, when every task is waiting on a timer, moves the clock to that timer at once instead of
sleeping. ``time.monotonic`` (which asyncio, leases, locks and deadlines all read) and the store's
clock are both this clock for the length of the run, and the process's ``random`` is seeded, so
one seed replays one interleaving and one verdict, and a run that simulates minutes of leases and
freezes takes milliseconds.

A few lines of our own rather than a test-time plugin: the harness needs the clock as the memory
store's clock too, and must restore ``time.monotonic`` when the run ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import selectors
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

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


@contextlib.contextmanager
def _patched(clock: VirtualClock, seed: int) -> Iterator[None]:
    saved_monotonic, saved_random = time.monotonic, random.getstate()
    time.monotonic = clock.monotonic
    random.seed(seed)
    try:
        yield
    finally:
        time.monotonic = saved_monotonic
        random.setstate(saved_random)


def run_virtual(main: Callable[[VirtualClock], Coroutine[Any, Any, T]], *, seed: int) -> T:
    """Run ``main(clock)`` to its end on a fresh loop in virtual time, seeded with ``seed``."""
    clock = VirtualClock()
    with _patched(clock, seed):
        loop = asyncio.SelectorEventLoop(_Selector(clock))
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
