"""The monotonic clock the library measures local time with: leases' local deadlines, renewals,
deadlines, retry and lock waits, breaker staleness.

It is ``time.monotonic`` unless a context says otherwise: the fault-injection harness runs a
whole run on the memory store in virtual time by setting this context variable for the run's
tasks (and the event loop's clock), so other threads of the process keep the real clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["monotonic", "using"]

_MONOTONIC: ContextVar[Callable[[], float]] = ContextVar(
    "agentlease_monotonic", default=time.monotonic
)


def monotonic() -> float:
    """Seconds on the monotonic clock in force (``time.monotonic`` by default)."""
    return _MONOTONIC.get()()


@contextmanager
def using(clock: Callable[[], float]) -> Iterator[None]:
    """Measure local time with ``clock`` in this context (and the tasks it starts)."""
    token = _MONOTONIC.set(clock)
    try:
        yield
    finally:
        _MONOTONIC.reset(token)
