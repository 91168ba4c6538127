"""The janitor: what a worker purges on a timer, so that nothing in the store grows for ever.

Every ``WorkerSettings.purge_every`` seconds (jittered, first round soon after start) a worker's
janitor runs one round on its store:

* done, dead and cancelled tasks of the worker's queue past the queue's ``done_retention`` and
  ``dead_retention`` (which cancelled tasks share) (``purge_tasks``), which frees their ids and
  dedup keys;
* idempotency keys past their dedup window (``purge_keys``; Redis expires them itself);
* expired lock leases (``sweep_locks``);
* retry budgets and circuit breakers past their expiry (``purge_state``; Redis expires them
  itself).

Each kind is purged in batches of ``purge_batch``, each batch one atomic step on the store, and
a round takes at most :data:`ROUNDS` full batches of a kind before it waits for the next round,
so a backlog is worked off steadily without starving the claim loop. Several workers on one
store share the work: each step deletes what it finds, and on PostgreSQL skips rows another
transaction holds. A store error in a round is logged (rate-limited) and the round ends; the
worker goes on running tasks either way.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable

from agentlease import _clock
from agentlease._async.queue import AsyncQueue
from agentlease._events import logger
from agentlease._records import FINISHED
from agentlease.errors import AgentLeaseError, BackendUnavailable

__all__ = ["ROUNDS", "Janitor"]

ROUNDS = 10  # full batches of one kind a round takes at most
_FIRST = 5.0  # the first round starts within this many seconds (or purge_every if shorter)
_LOG_EVERY = 300.0  # seconds between two logs of failing rounds


class Janitor:
    """Purges one worker's queue, and its store's expired keys, locks and budgets, on a timer.

    Args:
        queue: the worker's queue client (its settings give the retentions).
        name: the worker's queue.
        every: seconds between rounds (jittered by +-25%).
        batch: the most rows or keys one step deletes.
        rand: the jitter's random stream.
    """

    def __init__(
        self, queue: AsyncQueue, name: str, every: float, batch: int, rand: random.Random
    ) -> None:
        self.queue = queue
        self.name = name
        self.every = every
        self.batch = batch
        self._rand = rand
        self._logged_at = -_LOG_EVERY
        self.purged: dict[str, int] = {}
        """Totals of what this janitor purged, by kind (``done``, ``dead``, ``keys``,
        ``locks``, ``state``)."""

    async def run(self) -> None:
        """Run rounds until cancelled."""
        await asyncio.sleep(self._rand.uniform(0.0, min(self.every, _FIRST)))
        while True:
            await self.round()
            await asyncio.sleep(self.every * self._rand.uniform(0.75, 1.25))

    async def round(self) -> dict[str, int]:
        """One round; returns what it purged, by kind."""
        backend = self.queue.backend
        steps: list[tuple[str, Callable[[], Awaitable[int]]]] = [
            *(
                (
                    state,
                    functools.partial(self.queue.purge, self.name, state=state, limit=self.batch),
                )
                for state in FINISHED
            ),
            ("keys", lambda: backend.purge_keys(self.batch)),
            ("locks", lambda: backend.sweep_locks(self.batch)),
            ("state", lambda: backend.purge_state(self.batch)),
        ]
        counts: dict[str, int] = {}
        try:
            for kind, step in steps:
                for _ in range(ROUNDS):
                    n = await step()
                    counts[kind] = counts.get(kind, 0) + n
                    if n < self.batch:
                        break
        except AgentLeaseError as exc:
            now = _clock.monotonic()
            if now - self._logged_at >= _LOG_EVERY:
                self._logged_at = now
                logger.log(
                    logging.WARNING if isinstance(exc, BackendUnavailable) else logging.ERROR,
                    "purging on %s (queue %r) failed: %s: %s; retrying in %gs",
                    backend.url,
                    self.name,
                    type(exc).__name__,
                    exc,
                    self.every,
                )
        for kind, n in counts.items():
            self.purged[kind] = self.purged.get(kind, 0) + n
        if any(counts.values()):
            logger.debug("purged on queue %r: %s", self.name, counts)
        return counts
