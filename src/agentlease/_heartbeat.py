"""The heartbeat: keeps every lease of a worker alive, and a watchdog that gives up on time.

The heartbeat runs on its own thread with its own synchronous connection, so a handler that
blocks (a slow LLM SDK call, CPU-bound parsing, even one that blocks the event loop) cannot starve
it. Every interval (a third of the shortest of the lease and the progress timeout, with jitter) it
extends all held leases in one round trip.

Every lease also has a local deadline on the monotonic clock: the time its last successful claim
or extension was *sent*, plus the time granted, less a safety margin. The store's expiry can
never come before it. A watchdog thread, which makes no store calls, treats a lease past its local
deadline as lost, whatever the store says later: so a heartbeat call that hangs (a silent
network partition, a stalled server, a SQLite writer holding the lock) cannot hide the loss while
another worker already runs the task. A lease is also lost when the store rejects its extension,
or when this worker claims the same task again (the store gave it a new lease: the old one ran
out). Each lease is tracked by task id *and* token, so attempt 1 of a task and its re-claimed
attempt 2 are never confused.

A task cancelled while leased (:meth:`~agentlease.Queue.cancel`) is not renewed: the store ends
it ``cancelled`` in the extension that finds it flagged. The heartbeat then reads the task once
to tell a cancellation from any other loss, and keeps its reason on the lease
(``Held.cancel_reason``), so that the handler's ``ctx.check()`` raises
:class:`~agentlease.errors.TaskCancelled` with it.

Neither thread runs user code or logging I/O: events go to an
:class:`~agentlease._events.EventDispatcher`, and a lost lease's ``on_lost`` callback only
schedules the handler's cancellation.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from agentlease import _clock
from agentlease._events import EventDispatcher, Events
from agentlease._records import Lease
from agentlease.backends.base import Backend
from agentlease.errors import AgentLeaseError

__all__ = ["Heartbeat", "Held", "safety_margin"]

LeaseKey = tuple[str, str]


def safety_margin(lease_for: float) -> float:
    """How long before the granted time a lease is treated as lost locally: a tenth of the lease,
    at most a second (clock rates and scheduling delays between this process and the store)."""
    return min(1.0, lease_for / 10)


@dataclass(slots=True, eq=False)
class Held:
    """One lease this process holds, as the heartbeat tracks it.

    Attributes:
        lease: the lease as last renewed (its token never changes).
        on_lost: called once, from a heartbeat thread, when the lease is lost.
        ok_at: monotonic time the last successful claim or extension was sent.
        deadline: monotonic time past which the lease is treated as lost locally.
        lost_reason: why it was lost, once it is.
        cancel_reason: the task's cancel reason, when it was lost because the task was cancelled.
        lost: set once the lease is lost; the job's writes are refused from then on.
    """

    lease: Lease
    on_lost: Callable[[str], None]
    ok_at: float
    deadline: float
    lost_reason: str | None = None
    cancel_reason: str | None = None
    lost: threading.Event = field(default_factory=threading.Event)

    @property
    def key(self) -> LeaseKey:
        """The lease's identity: task id and token."""
        return (self.lease.task_id, self.lease.token)


class Heartbeat:
    """Extends every held lease from a thread no handler can block, and watches their deadlines.

    Args:
        backend: a synchronous backend used only by this heartbeat's thread.
        lease_for: the seconds each extension grants.
        events: where ``extended``, ``zombie_rejected`` and ``lease_lost`` go.
        interval: seconds between beats (default: a third of the lease).
        rand: the jitter's random stream.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        lease_for: float,
        events: Events | EventDispatcher,
        interval: float | None = None,
        rand: random.Random | None = None,
    ) -> None:
        self._backend = backend
        self._lease_for = lease_for
        self._margin = safety_margin(lease_for)
        self._events = events
        self._interval = lease_for / 3 if interval is None else interval
        self._rand = rand or random.Random()
        self._held: dict[LeaseKey, Held] = {}
        self._latest: dict[str, Held] = {}  # task id -> its newest lease here
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beating = threading.Thread(target=self._run, name="agentlease-heartbeat", daemon=True)
        self._watching = threading.Thread(
            target=self._watch, name="agentlease-watchdog", daemon=True
        )

    def start(self) -> None:
        """Start beating and watching."""
        self._beating.start()
        self._watching.start()

    def stop(self, timeout: float = 1.0) -> bool:
        """Stop both threads, waiting at most ``timeout`` seconds for a store call in flight.

        Returns:
            Whether the beating thread ended (``False``: it is still inside a store call; it is a
            daemon thread and ends with the process).
        """
        self._stop.set()
        deadline = _clock.monotonic() + timeout
        for thread in (self._watching, self._beating):
            if thread.is_alive():
                thread.join(max(0.0, deadline - _clock.monotonic()))
        return not self._beating.is_alive()

    def add(self, lease: Lease, on_lost: Callable[[str], None], sent_at: float) -> Held:
        """Track a lease claimed by a request sent at monotonic time ``sent_at``.

        An older lease of the same task that this process still tracks is lost from now on: the
        store gave the task a new lease, so the old one had run out.
        """
        granted = max(0.0, min(self._lease_for, lease.expires_at - lease.leased_at))
        held = Held(lease, on_lost, sent_at, sent_at + granted - self._margin)
        with self._lock:
            older = self._latest.get(lease.task_id)
            self._latest[lease.task_id] = held
            self._held[held.key] = held
        if older is not None and self._held.get(older.key) is older:
            self._lose(older, f"this worker claimed the task again (attempt {lease.attempt})")
        return held

    def remove(self, held: Held) -> None:
        """Stop tracking a lease (its job finished or gave it back)."""
        with self._lock:
            if self._held.get(held.key) is held:
                del self._held[held.key]
            if self._latest.get(held.lease.task_id) is held:
                del self._latest[held.lease.task_id]

    def lose(self, held: Held, reason: str) -> None:
        """Treat ``held`` as lost now (for the worker's own reasons, such as shutdown)."""
        self._lose(held, reason)

    def beat(self) -> None:
        """Extend every held lease once, in one round trip, and judge the ones not renewed."""
        with self._lock:
            held = [h for h in self._held.values() if not h.lost.is_set()]
        if not held:
            return
        sent_at = _clock.monotonic()
        try:
            renewed = self._backend.extend([h.lease for h in held], self._lease_for)
        except AgentLeaseError:
            # The store did not answer: the watchdog loses each lease at its local deadline.
            return
        deadline = sent_at + self._lease_for - self._margin
        for h, lease in zip(held, renewed, strict=True):
            if h.lost.is_set():
                continue  # lost meanwhile (the watchdog, a re-claim): stays lost
            if lease is None:
                with self._lock:
                    if self._held.get(h.key) is not h:
                        continue  # its job finished while the beat was on its way
                old = h.lease
                cancelled = self._cancel_reason(old)
                if cancelled is not None:
                    h.cancel_reason = cancelled
                    self._lose(h, f"task cancelled: {cancelled}")
                    continue
                self._events.emit(
                    "zombie_rejected", old.queue, old.task_id, old.attempt, write="extend"
                )
                self._lose(h, "extension rejected by the store")
            else:
                h.lease = lease
                h.ok_at = sent_at
                h.deadline = deadline
                self._events.emit(
                    "extended",
                    lease.queue,
                    lease.task_id,
                    lease.attempt,
                    expires_at=lease.expires_at,
                )

    def _cancel_reason(self, lease: Lease) -> str | None:
        """The reason a lease not renewed was cancelled with, or ``None`` if it was lost
        otherwise (or the store cannot tell now)."""
        try:
            task = self._backend.get(lease.task_id)
        except AgentLeaseError:
            return None
        if task.state != "cancelled" or task.attempt != lease.attempt:
            return None
        return task.cancel_reason

    def check_deadlines(self) -> None:
        """Lose every held lease whose local deadline has passed."""
        now = _clock.monotonic()
        with self._lock:
            late = [h for h in self._held.values() if not h.lost.is_set() and now >= h.deadline]
        for h in late:
            self._lose(
                h,
                f"not renewed within its lease ({self._lease_for:g}s): the store did not answer "
                "in time",
            )

    def _lose(self, held: Held, reason: str) -> None:
        with self._lock:
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

    def _watch(self) -> None:
        tick = max(0.01, min(self._interval / 2, self._margin))
        while not self._stop.wait(tick):
            self.check_deadlines()
