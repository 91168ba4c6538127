"""Keeping in-flight reservations alive while their actions run, on both faces.

One renewer per client renews every open reservation of that client whose last renewal is a third
of ``hold_for`` old, so an action that finishes sooner (most of them) costs no renewal and no
thread start. A renewal refused with :class:`~agentlease.errors.ReservationLost` stops that
reservation's renewals and is kept, so the action's outcome write (which would be refused too)
reports it; a store outage is retried at the next tick, since the lease outlives two missed
renewals. The async face renews from one task on the event loop, the sync face from one daemon
thread (the actions' own code may block either); each stops when nothing is left to renew.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agentlease._records import KeyHold
from agentlease.errors import BackendError, ReservationLost

__all__ = [
    "AsyncRenewals",
    "AsyncTicker",
    "Renewals",
    "Renewing",
    "Ticker",
    "async_sleep",
    "sync_sleep",
]

async_sleep = asyncio.sleep
sync_sleep = time.sleep


@dataclass(slots=True, eq=False)
class Renewing:
    """One reservation being renewed: its latest hold, and the refusal that stopped it."""

    hold: KeyHold
    renewed_at: float = field(default_factory=time.monotonic)
    lost: ReservationLost | None = None


class _Base:
    def __init__(self, hold_for: float) -> None:
        self._hold_for = hold_for
        self._lock = threading.Lock()
        self._open: set[Renewing] = set()

    def _due(self) -> list[Renewing]:
        cutoff = time.monotonic() - self._hold_for / 3
        with self._lock:
            return [r for r in self._open if r.renewed_at <= cutoff]

    def _closed(self, entry: Renewing) -> KeyHold:
        with self._lock:
            self._open.discard(entry)
        if entry.lost is not None:
            raise entry.lost
        return entry.hold

    def _lost(self, entry: Renewing, exc: ReservationLost) -> None:
        entry.lost = exc
        with self._lock:
            self._open.discard(entry)


class AsyncRenewals(_Base):
    """Renews a client's open reservations from one asyncio task."""

    def __init__(
        self, extend: Callable[[KeyHold, float], Awaitable[KeyHold]], hold_for: float
    ) -> None:
        super().__init__(hold_for)
        self._extend = extend
        self._task: asyncio.Task[None] | None = None

    def open(self, hold: KeyHold) -> Renewing:
        """Start renewing ``hold`` (call on the event loop)."""
        entry = Renewing(hold)
        with self._lock:
            self._open.add(entry)
        loop = asyncio.get_running_loop()
        task = self._task
        if task is None or task.done() or task.get_loop() is not loop:
            self._task = loop.create_task(self._run())
        return entry

    async def close(self, entry: Renewing) -> KeyHold:
        """Stop renewing; the latest hold, or raise the refusal that stopped the renewals."""
        return self._closed(entry)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._hold_for / 6)
            for entry in self._due():
                try:
                    entry.hold = await self._extend(entry.hold, self._hold_for)
                    entry.renewed_at = time.monotonic()
                except ReservationLost as exc:
                    self._lost(entry, exc)
                except BackendError:
                    continue
            with self._lock:
                if not self._open:
                    self._task = None
                    return

    async def stop(self) -> None:
        """Stop the renewing task (the client is closing)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await task


class Renewals(_Base):
    """Renews a client's open reservations from one daemon thread."""

    def __init__(self, extend: Callable[[KeyHold, float], KeyHold], hold_for: float) -> None:
        super().__init__(hold_for)
        self._extend = extend
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def open(self, hold: KeyHold) -> Renewing:
        """Start renewing ``hold``."""
        entry = Renewing(hold)
        with self._lock:
            self._open.add(entry)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="agentlease-key-renewals", daemon=True
                )
                self._thread.start()
        return entry

    def close(self, entry: Renewing) -> KeyHold:
        """Stop renewing; the latest hold, or raise the refusal that stopped the renewals."""
        return self._closed(entry)

    def _run(self) -> None:
        while not self._stopped.wait(self._hold_for / 6):
            for entry in self._due():
                try:
                    entry.hold = self._extend(entry.hold, self._hold_for)
                    entry.renewed_at = time.monotonic()
                except ReservationLost as exc:
                    self._lost(entry, exc)
                except BackendError:
                    continue
            with self._lock:
                if not self._open:
                    self._thread = None
                    return

    def stop(self) -> None:
        """Stop the renewing thread (the client is closing)."""
        self._stopped.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()


class AsyncTicker:
    """Calls ``tick`` every ``every`` seconds from an asyncio task until stopped; keeps the
    first error it raised (and stops ticking then)."""

    def __init__(self, tick: Callable[[], Awaitable[None]], every: float) -> None:
        self.error: BaseException | None = None
        self._tick = tick
        self._every = every
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            try:
                await self._tick()
            except BackendError:
                continue  # a store outage: the next tick tries again
            except Exception as exc:
                self.error = exc
                return

    async def stop(self) -> None:
        """Stop ticking (waits for a tick in progress)."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class Ticker:
    """Calls ``tick`` every ``every`` seconds from a daemon thread until stopped; keeps the
    first error it raised (and stops ticking then)."""

    def __init__(self, tick: Callable[[], None], every: float) -> None:
        self.error: BaseException | None = None
        self._tick = tick
        self._every = every
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentlease-ticker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._every):
            try:
                self._tick()
            except BackendError:
                continue
            except Exception as exc:
                self.error = exc
                return

    def stop(self) -> None:
        """Stop ticking (waits for a tick in progress)."""
        self._stopped.set()
        self._thread.join()
