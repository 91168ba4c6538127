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

Every lease also has a **local deadline** on the monotonic clock: the time the request of its
last successful acquisition or renewal was *sent* (the store set its expiry no earlier) plus its
length, less a small margin (:data:`MARGIN`). Once that passes with no renewal confirmed (a store
outage, a renewer starved of time), the lease counts as lost for good, whatever the store says
later: :meth:`_Base.check` and the end of the holder's block raise the holder's typed error, and
a renewal whose reply arrives after the deadline does not revive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agentlease import _clock
from agentlease.errors import BackendError, GuardError, IdempotencyError

__all__ = ["MARGIN", "AsyncRenewals", "Renewals", "Renewing", "async_sleep", "sync_sleep"]

async_sleep = asyncio.sleep
sync_sleep = time.sleep
_LOST = (IdempotencyError, GuardError)  # the lease is gone: renewing again cannot help

MARGIN = 0.02
"""The share of a lease's length its holder gives up at the end of it, so that a local deadline
falls before the store's expiry even if the two clocks run at slightly different rates."""


@dataclass(slots=True, eq=False)
class Renewing:
    """One lease being renewed.

    Attributes:
        lease: what is renewed (a reservation's hold, a lock set); a renewal may replace it.
        length: the lease's length in seconds (the store's TTL of it).
        renewed_at: when the request of its last successful acquisition or renewal was sent
            (``time.monotonic``): the store's expiry is at least ``length`` after it.
        lost: the refusal that stopped its renewals, if one did (kept: it never comes back).
    """

    lease: Any
    length: float
    renewed_at: float
    lost: Exception | None = None

    @property
    def every(self) -> float:
        """Seconds between renewals: a third of the lease's length."""
        return self.length / 3

    @property
    def deadline(self) -> float:
        """The local deadline (``time.monotonic``): past it the holder has lost the lease."""
        return self.renewed_at + self.length * (1 - MARGIN)


class _Base:
    def __init__(self, lapsed: Callable[[Any], Exception]) -> None:
        self._lock = threading.Lock()
        self._open: set[Renewing] = set()
        self._wakes_at = 0.0  # when the renewer wakes next (time.monotonic)
        self._lapsed = lapsed

    def _add(self, lease: object, length: float, sent: float | None) -> Renewing:
        entry = Renewing(lease, length, _clock.monotonic() if sent is None else sent)
        with self._lock:
            self._open.add(entry)
        return entry

    def check(self, entry: Renewing) -> None:
        """Raise the refusal that stopped ``entry``'s renewals, or the holder's error for a
        lease whose local deadline passed unrenewed (from then on, for good)."""
        with self._lock:
            if entry.lost is None and _clock.monotonic() >= entry.deadline:
                entry.lost = self._lapsed(entry.lease)
                self._open.discard(entry)
            lost = entry.lost
        if lost is not None:
            raise lost

    def _renewed(self, entry: Renewing, sent: float) -> None:
        """Record a renewal sent at ``sent`` that succeeded, unless its reply came after the
        local deadline: by then the holder may already have been told the lease is lost."""
        with self._lock:
            if entry.lost is not None:
                return
            if _clock.monotonic() >= entry.deadline:
                entry.lost = self._lapsed(entry.lease)
                self._open.discard(entry)
            else:
                entry.renewed_at = sent

    def _due(self) -> list[Renewing]:
        now = _clock.monotonic()
        with self._lock:
            for r in [r for r in self._open if r.lost is None and now >= r.deadline]:
                r.lost = self._lapsed(r.lease)
                self._open.discard(r)
            return [r for r in self._open if r.renewed_at + r.every <= now]

    def _tick(self) -> float:
        """Seconds until the next renewal may be due (half the shortest interval)."""
        with self._lock:
            tick = min((r.every for r in self._open), default=1.0) / 2
            self._wakes_at = _clock.monotonic() + tick
            return tick

    def _too_late(self, entry: Renewing) -> bool:
        """Whether the renewer sleeps past the time ``entry`` needs it (it must be woken):
        only a lease shorter than those it renews, so a new holder rarely costs a wake."""
        return entry.renewed_at + entry.every / 2 < self._wakes_at

    def _closed(self, entry: Renewing) -> Any:
        with self._lock:
            if entry.lost is None and _clock.monotonic() >= entry.deadline:
                entry.lost = self._lapsed(entry.lease)
            self._open.discard(entry)
            lost = entry.lost
        if lost is not None:
            raise lost
        return entry.lease

    def _lost(self, entry: Renewing, exc: Exception) -> None:
        with self._lock:
            if entry.lost is None:
                entry.lost = exc
            self._open.discard(entry)

    def _idle(self) -> bool:
        with self._lock:
            return not self._open


class AsyncRenewals(_Base):
    """Renews a client's open leases from one asyncio task.

    Args:
        renew: renews one lease (it may replace ``entry.lease``); raises ReservationLost or a
            guard error when the lease is gone.
        lapsed: the holder's error for a lease (``entry.lease``) whose local deadline passed.
    """

    def __init__(
        self,
        renew: Callable[[Renewing], Awaitable[None]],
        lapsed: Callable[[Any], Exception],
    ) -> None:
        super().__init__(lapsed)
        self._renew = renew
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    def open(self, lease: object, length: float, *, sent: float | None = None) -> Renewing:
        """Start renewing ``lease``, which lasts ``length`` seconds from ``sent`` (the
        ``time.monotonic`` at which its acquisition was sent; now if not given), every third of
        it (call on the event loop)."""
        entry = self._add(lease, length, sent)
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
                sent = _clock.monotonic()
                try:
                    await self._renew(entry)
                    self._renewed(entry, sent)
                except _LOST as exc:
                    self._lost(entry, exc)
                except BackendError:
                    continue
            if self._idle():
                self._task = None
                return

    async def stop(self, timeout: float = 1.0) -> None:
        """Stop the renewing task (the client is closing), waiting at most ``timeout`` seconds
        for a renewal in flight to unwind."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(RuntimeError):  # a task of a loop that is gone
                await asyncio.wait({task}, timeout=timeout)


class Renewals(_Base):
    """Renews a client's open leases from one daemon thread; see :class:`AsyncRenewals`."""

    def __init__(
        self, renew: Callable[[Renewing], None], lapsed: Callable[[Any], Exception]
    ) -> None:
        super().__init__(lapsed)
        self._renew = renew
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._wake = threading.Event()

    def open(self, lease: object, length: float, *, sent: float | None = None) -> Renewing:
        """Start renewing ``lease``, which lasts ``length`` seconds from ``sent``; see
        :meth:`AsyncRenewals.open`."""
        entry = Renewing(lease, length, _clock.monotonic() if sent is None else sent)
        with self._lock:
            self._open.add(entry)
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
                sent = _clock.monotonic()
                try:
                    self._renew(entry)
                    self._renewed(entry, sent)
                except _LOST as exc:
                    self._lost(entry, exc)
                except BackendError:
                    continue
            with self._lock:
                if not self._open:
                    self._thread = None
                    return

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the renewing thread (the client is closing), waiting at most ``timeout`` seconds
        for a renewal in flight (the thread is a daemon: a hung call cannot hang shutdown)."""
        self._stopped.set()
        self._wake.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
