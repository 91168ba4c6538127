"""The threads sync handlers run on: a small pool of daemon threads.

Unlike :class:`concurrent.futures.ThreadPoolExecutor`, whose threads the interpreter joins at exit,
these are daemon threads: a sync handler that ignores its cancel token cannot keep the process
alive after the worker has stopped (its lease is kept, so it expires and the task is reaped as
after a crash). A submitted call that has not started yet can still be cancelled, which is how the
worker knows that no code of that handler ever ran.

A call is a :class:`Call`, lighter than a :class:`concurrent.futures.Future` (no condition
variable: nobody waits on it): when it ends, or is cancelled before it starts, its ``on_done``
callback runs once, on the pool thread (or on the thread that cancelled it).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Call", "HandlerThreads"]

T = TypeVar("T")

_QUEUED, _RUNNING, _DONE, _CANCELLED = range(4)


class Call(Generic[T]):
    """One call submitted to :class:`HandlerThreads`: its state, then its result or error."""

    __slots__ = ("_fn", "_lock", "_on_done", "_state", "error", "result")

    def __init__(
        self, fn: Callable[[], T], on_done: Callable[[Call[T]], None], lock: threading.Lock
    ) -> None:
        self._fn = fn
        self._on_done = on_done
        self._lock = lock
        self._state = _QUEUED
        self.result: T | None = None
        self.error: BaseException | None = None

    def cancel(self) -> bool:
        """Cancel the call if it has not started (then ``on_done`` runs now); whether it was."""
        with self._lock:
            if self._state != _QUEUED:
                return self._state == _CANCELLED
            self._state = _CANCELLED
        self._on_done(self)
        return True

    def cancelled(self) -> bool:
        """Whether it was cancelled before it started."""
        return self._state == _CANCELLED

    def running(self) -> bool:
        """Whether it started and has not ended."""
        return self._state == _RUNNING

    def done(self) -> bool:
        """Whether it ended or was cancelled."""
        return self._state in (_DONE, _CANCELLED)

    def _run(self) -> None:
        with self._lock:
            if self._state != _QUEUED:
                return
            self._state = _RUNNING
        try:
            self.result = self._fn()
        except BaseException as exc:  # handed to on_done, like a future's exception
            self.error = exc
        self._state = _DONE
        self._on_done(self)


class HandlerThreads:
    """Runs calls on up to ``size`` daemon threads, started as they are needed.

    Args:
        size: the most calls running at once.
        name: the threads' name prefix.
    """

    def __init__(self, size: int, *, name: str = "agentlease-handler") -> None:
        self._size = size
        self._name = name
        self._work: queue.SimpleQueue[Call[object] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._waiting = 0  # threads blocked waiting for work
        self._closed = False

    def submit(self, fn: Callable[[], T], on_done: Callable[[Call[T]], None]) -> Call[T]:
        """Run ``fn`` on a pool thread, then ``on_done`` there; it can be cancelled until it
        starts."""
        call = Call(fn, on_done, self._lock)
        with self._lock:
            if self._closed:
                raise RuntimeError("the handler threads are shut down")
            self._work.put(call)  # type: ignore[arg-type]
            if self._work.qsize() > self._waiting and len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return call

    def shutdown(self) -> None:
        """Stop taking work; idle threads end, running calls go on (their threads are daemons)."""
        with self._lock:
            self._closed = True
            for _ in self._threads:
                self._work.put(None)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._waiting += 1
            call = self._work.get()
            with self._lock:
                self._waiting -= 1
            if call is None:
                return
            call._run()
            del call
