"""A stop flag a loop sleeps on, and the SIGTERM/SIGINT handlers that raise it, for both faces.

:class:`AsyncWakeup` and :class:`Wakeup` have the same methods, so a loop written once for asyncio
(the scheduler in ``_async/scheduler.py``) reads the same in its generated synchronous twin.
``set`` is safe from any thread and from a signal handler.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

__all__ = ["AsyncWakeup", "Wakeup"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class AsyncWakeup:
    """A stop flag for a loop on asyncio."""

    def __init__(self) -> None:
        self._set = False
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def set(self) -> None:
        self._set = True
        event, loop = self._event, self._loop
        if event is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def is_set(self) -> bool:
        return self._set

    async def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds or until set; return whether it is set."""
        if self._event is None:
            self._event = asyncio.Event()
            self._loop = asyncio.get_running_loop()
        if self._set:
            return True
        with suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        return self._set

    @contextmanager
    def signals(self, handler: Callable[[signal.Signals], None]) -> Iterator[None]:
        """Call ``handler`` on SIGTERM and SIGINT while inside (on the main thread's loop)."""
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                loop.add_signal_handler(sig, handler, sig)
                installed.append(sig)
        try:
            yield
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)


class Wakeup:
    """A stop flag for a loop on a thread.

    It takes no lock: ``set`` runs in signal handlers, which interrupt the main thread anywhere
    (a ``threading.Event`` set there deadlocks if the signal lands while the same thread holds
    the event's lock inside ``wait``). ``wait`` sleeps in short slices and looks at the flag
    between them.
    """

    SLICE = 0.05  # seconds: how soon a wait notices the flag

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds or until set; return whether it is set."""
        end = time.monotonic() + timeout
        while not self._set:
            left = end - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(self.SLICE, left))
        return self._set

    @contextmanager
    def signals(self, handler: Callable[[signal.Signals], None]) -> Iterator[None]:
        """Call ``handler`` on SIGTERM and SIGINT while inside (main thread only)."""
        saved: dict[signal.Signals, object] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                saved[sig] = signal.signal(
                    sig, lambda signum, _frame: handler(signal.Signals(signum))
                )
        try:
            yield
        finally:
            for sig, previous in saved.items():
                signal.signal(sig, previous)  # type: ignore[arg-type]
