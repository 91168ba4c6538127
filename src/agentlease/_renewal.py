"""Keeping leases alive while their holders work: in-flight reservations and lock sets.

One renewer per client renews every open lease of that client whose last renewal is a third of
its length old, so a holder that finishes sooner (most of them) costs no renewal and no thread
start. A new lease wakes a sleeping renewer only when it is shorter than the leases the renewer
sleeps for; otherwise the renewer's next tick is soon enough, so holders in quick succession
cost no wake-up each.

A renewal that finds the lease gone (:class:`~agentlease.errors.ReservationLost`,
:class:`~agentlease.errors.LockLost`) stops that lease's renewals and is kept, so the holder's
next write (or the end of its block) reports it; a store outage is retried at the next tick, since
a lease outlives two missed renewals. The async face renews from one task on the event loop, the
sync face from one daemon thread (the holders' own code may block either); each stops when
nothing is left to renew.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agentlease.errors import BackendError, GuardError, IdempotencyError

__all__ = ["AsyncRenewals", "Renewals", "Renewing", "async_sleep", "sync_sleep"]

async_sleep = asyncio.sleep
sync_sleep = time.sleep
_LOST = (IdempotencyError, GuardError)  # the lease is gone: renewing again cannot help


@dataclass(slots=True, eq=False)
class Renewing:
    """One lease being renewed.

    Attributes:
        lease: what is renewed (a reservation's hold, a lock set); a renewal may replace it.
        every: seconds between renewals (a third of the lease's length).
        renewed_at: when it was last renewed (``time.monotonic``).
        lost: the refusal that stopped its renewals, if one did.
    """

    lease: Any
    every: float
    renewed_at: float = field(default_factory=time.monotonic)
    lost: Exception | None = None


class _Base:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[Renewing] = set()
        self._wakes_at = 0.0  # when the renewer wakes next (time.monotonic)

    def _add(self, lease: object, every: float) -> Renewing:
        entry = Renewing(lease, every)
        with self._lock:
            self._open.add(entry)
        return entry

    def _due(self) -> list[Renewing]:
        now = time.monotonic()
        with self._lock:
            return [r for r in self._open if r.renewed_at + r.every <= now]

    def _tick(self) -> float:
        """Seconds until the next renewal may be due (half the shortest interval)."""
        with self._lock:
            tick = min((r.every for r in self._open), default=1.0) / 2
            self._wakes_at = time.monotonic() + tick
            return tick

    def _too_late(self, entry: Renewing) -> bool:
        """Whether the renewer sleeps past the time ``entry`` needs it (it must be woken):
        only a lease shorter than those it renews, so a new holder rarely costs a wake."""
        return entry.renewed_at + entry.every / 2 < self._wakes_at

    def _closed(self, entry: Renewing) -> Any:
        with self._lock:
            self._open.discard(entry)
        if entry.lost is not None:
            raise entry.lost
        return entry.lease

    def _lost(self, entry: Renewing, exc: Exception) -> None:
        entry.lost = exc
        with self._lock:
            self._open.discard(entry)

    def _idle(self) -> bool:
        with self._lock:
            return not self._open


class AsyncRenewals(_Base):
    """Renews a client's open leases from one asyncio task.

    Args:
        renew: renews one lease (it may replace ``entry.lease``); raises ReservationLost or a
            guard error when the lease is gone.
    """

    def __init__(self, renew: Callable[[Renewing], Awaitable[None]]) -> None:
        super().__init__()
        self._renew = renew
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    def open(self, lease: object, every: float) -> Renewing:
        """Start renewing ``lease`` every ``every`` seconds (call on the event loop)."""
        entry = self._add(lease, every)
        loop = asyncio.get_running_loop()
        task = self._task
        if task is None or task.done() or task.get_loop() is not loop:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run(self._wake))
        elif self._wake is not None and self._too_late(entry):
            self._wake.set()
        return entry

    async def close(self, entry: Renewing) -> Any:
        """Stop renewing; the latest lease, or raise the refusal that stopped the renewals."""
        return self._closed(entry)

    async def _run(self, wake: asyncio.Event) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self._tick())
            wake.clear()
            for entry in self._due():
                try:
                    await self._renew(entry)
                    entry.renewed_at = time.monotonic()
                except _LOST as exc:
                    self._lost(entry, exc)
                except BackendError:
                    continue
            if self._idle():
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
    """Renews a client's open leases from one daemon thread; see :class:`AsyncRenewals`."""

    def __init__(self, renew: Callable[[Renewing], None]) -> None:
        super().__init__()
        self._renew = renew
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._wake = threading.Event()

    def open(self, lease: object, every: float) -> Renewing:
        """Start renewing ``lease`` every ``every`` seconds."""
        entry = self._add(lease, every)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="agentlease-renewals", daemon=True
                )
                self._thread.start()
            elif self._too_late(entry):
                self._wake.set()
        return entry

    def close(self, entry: Renewing) -> Any:
        """Stop renewing; the latest lease, or raise the refusal that stopped the renewals."""
        return self._closed(entry)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._tick())
            self._wake.clear()
            if self._stopped.is_set():
                return
            for entry in self._due():
                try:
                    self._renew(entry)
                    entry.renewed_at = time.monotonic()
                except _LOST as exc:
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
        self._wake.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
