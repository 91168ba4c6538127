"""The heartbeat: one thread per worker that keeps every lease of the process alive.

It runs on its own thread with its own synchronous connection, so a handler that blocks (a slow
LLM SDK call, CPU-bound parsing, even one that blocks the event loop) cannot starve it. Every
``lease_for / 3`` (with jitter) it extends all held leases in one round trip. A lease is lost when
the store rejects its extension, or when the last successful extension is older than the lease
(the store was unreachable for a whole lease); then the job's ``on_lost`` callback runs.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agentlease._events import Events
from agentlease._records import Lease
from agentlease.backends.base import Backend
from agentlease.errors import AgentLeaseError

__all__ = ["Heartbeat", "Held"]


@dataclass(slots=True)
class Held:
    """One lease this process holds, as the heartbeat tracks it."""

    lease: Lease
    on_lost: Callable[[str], None]
    ok_at: float  # monotonic time the last successful claim or extension was sent
    lost_reason: str | None = None
    lost: threading.Event = field(default_factory=threading.Event)


class Heartbeat:
    """Extends every held lease from a thread no handler can block.

    Args:
        backend: a synchronous backend used only by this thread.
        lease_for: the seconds each extension grants.
        events: where ``extended`` and ``lease_lost`` go.
        interval: seconds between beats (default: a third of the lease).
        rand: the jitter's random stream.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        lease_for: float,
        events: Events,
        interval: float | None = None,
        rand: random.Random | None = None,
    ) -> None:
        self._backend = backend
        self._lease_for = lease_for
        self._events = events
        self._interval = lease_for / 3 if interval is None else interval
        self._rand = rand or random.Random()
        self._held: dict[str, Held] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentlease-heartbeat", daemon=True)

    def start(self) -> None:
        """Start beating."""
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and wait for the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def add(self, lease: Lease, on_lost: Callable[[str], None], sent_at: float) -> Held:
        """Track a lease claimed by a request sent at monotonic time ``sent_at``."""
        held = Held(lease, on_lost, sent_at)
        with self._lock:
            self._held[lease.task_id] = held
        return held

    def remove(self, held: Held) -> None:
        """Stop tracking a lease (its job finished or gave it back)."""
        with self._lock:
            if self._held.get(held.lease.task_id) is held:
                del self._held[held.lease.task_id]

    def beat(self) -> None:
        """Extend every held lease once, in one round trip, and judge the ones not renewed."""
        with self._lock:
            held = [h for h in self._held.values() if not h.lost.is_set()]
        if not held:
            return
        sent_at = time.monotonic()
        try:
            renewed = self._backend.extend([h.lease for h in held], self._lease_for)
        except AgentLeaseError as exc:
            # The store did not answer: a lease is lost once a whole lease passed unrenewed.
            now = time.monotonic()
            for h in held:
                if now - h.ok_at >= self._lease_for:
                    self._lose(h, f"store unreachable for a whole lease ({exc})")
            return
        for h, lease in zip(held, renewed, strict=True):
            if lease is None:
                old = h.lease
                self._events.emit(
                    "zombie_rejected", old.queue, old.task_id, old.attempt, write="extend"
                )
                self._lose(h, "extension rejected by the store")
            else:
                h.lease = lease
                h.ok_at = sent_at
                self._events.emit(
                    "extended",
                    lease.queue,
                    lease.task_id,
                    lease.attempt,
                    expires_at=lease.expires_at,
                )

    def _lose(self, held: Held, reason: str) -> None:
        if held.lost.is_set():
            return
        held.lost_reason = reason
        held.lost.set()
        lease = held.lease
        self._events.emit("lease_lost", lease.queue, lease.task_id, lease.attempt, reason=reason)
        held.on_lost(reason)

    def _run(self) -> None:
        while not self._stop.wait(self._interval * self._rand.uniform(0.8, 1.0)):
            self.beat()
