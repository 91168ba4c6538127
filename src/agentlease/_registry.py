"""A worker's entry among the store's live workers (``agentlease workers``).

The worker registers when it starts: its id, host, pid, queues, concurrency, start time and the
ids of the tasks in its hands, under a TTL on the store's clock. It registers again on a timer
(its registry heartbeat), each time with the tasks it holds then, and removes its entry when it
stops cleanly. A worker that dies (SIGKILL, a lost machine) stops registering: its entry lapses
after the TTL, is no longer listed, and the next registration of any worker deletes it.

The registry is information for operators, never a condition of work: a failed registration is
logged and tried again at the next beat, and the worker goes on claiming and running tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from collections.abc import Callable

from agentlease._async.queue import AsyncQueue
from agentlease._codec import JSON
from agentlease._events import logger
from agentlease.errors import AgentLeaseError

__all__ = ["MAX_LISTED_TASKS", "Registration", "new_worker_id"]

MAX_LISTED_TASKS = 1000
"""The most task ids one registration lists (a worker holds at most its concurrency plus its
prefetch; the bound keeps a misconfigured one's entry small)."""


def new_worker_id() -> str:
    """A worker id unique in the store: ``host:pid:<6 random hex digits>``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Registration:
    """Keeps one worker's entry alive in the store while the worker runs.

    Args:
        queue: the worker's queue client (its store holds the entry).
        worker_id: the worker's id (also the holder its claims name).
        queues: the queues it serves.
        concurrency: how many handlers it runs at once.
        every: seconds between registrations.
        ttl: seconds an entry lives unless registered again (longer than ``every``).
        call_timeout: the bound of one registration call.
        tasks: the ids of the tasks in the worker's hands now.
    """

    def __init__(
        self,
        queue: AsyncQueue,
        worker_id: str,
        *,
        queues: list[str],
        concurrency: int,
        every: float,
        ttl: float,
        call_timeout: float,
        tasks: Callable[[], list[str]],
    ) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self._info: dict[str, JSON] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": list(queues),
            "concurrency": concurrency,
            "started": time.time(),
        }
        self._every, self._ttl, self._timeout = every, ttl, call_timeout
        self._tasks = tasks
        self._loop: asyncio.Task[None] | None = None
        self._failing = False

    async def start(self) -> None:
        """Register once, then keep registering every ``every`` seconds until :meth:`stop`."""
        await self.beat()
        self._loop = asyncio.create_task(self._run(), name=f"registry {self.worker_id}")

    async def beat(self) -> None:
        """Register now, with the tasks in hand; a failure is logged (once until it heals)."""
        tasks: list[JSON] = list(sorted(self._tasks())[:MAX_LISTED_TASKS])
        info: dict[str, JSON] = {**self._info, "tasks": tasks}
        try:
            async with asyncio.timeout(self._timeout):
                await self.queue.register_worker(self.worker_id, info, ttl=self._ttl)
        except (AgentLeaseError, TimeoutError) as exc:
            if not self._failing:
                logger.warning(
                    "worker %s could not register at %s: %s: %s",
                    self.worker_id,
                    self.queue.backend.url,
                    type(exc).__name__,
                    exc,
                )
            self._failing = True
        else:
            self._failing = False

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            await self.beat()

    async def stop(self) -> None:
        """Stop registering and remove the entry (a clean shutdown)."""
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None
        try:
            async with asyncio.timeout(self._timeout):
                await self.queue.unregister_worker(self.worker_id)
        except (AgentLeaseError, TimeoutError) as exc:
            logger.warning(
                "worker %s could not remove its entry at %s (it lapses after %gs): %s",
                self.worker_id,
                self.queue.backend.url,
                self._ttl,
                exc,
            )
