"""The threads sync handlers run on: a small pool of daemon threads.

Unlike :class:`concurrent.futures.ThreadPoolExecutor`, whose threads the interpreter joins at exit,
these are daemon threads: a sync handler that ignores its cancel token cannot keep the process
alive after the worker has stopped (its lease is kept, so it expires and the task is reaped as
after a crash). A submitted call that has not started yet can still be cancelled through its
future, which is how the worker knows that no code of that handler ever ran.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

__all__ = ["HandlerThreads"]

T = TypeVar("T")
_Work = tuple[Future[object], Callable[[], object]]


class HandlerThreads:
    """Runs calls on up to ``size`` daemon threads, started as they are needed.

    Args:
        size: the most calls running at once.
        name: the threads' name prefix.
    """

    def __init__(self, size: int, *, name: str = "agentlease-handler") -> None:
        self._size = size
        self._name = name
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._waiting = 0  # threads blocked waiting for work
        self._closed = False

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on a pool thread; its future can be cancelled until it starts."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the handler threads are shut down")
            self._work.put((future, fn))  # type: ignore[arg-type]
            if self._work.qsize() > self._waiting and len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return future

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
            item = self._work.get()
            with self._lock:
                self._waiting -= 1
            if item is None:
                return
            future, fn = item
            if future.set_running_or_notify_cancel():
                try:
                    result = fn()
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
                del future, fn, item
