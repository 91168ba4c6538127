"""A job's final write: how a completion or a failure reaches the store.

Each try is bounded (a third of the lease, by default): one that hangs is abandoned and tried
again. While the store is unavailable and the lease is still held, the write is retried with
jittered backoff, so an outage shorter than the lease does not make the task run again; once the
lease is lost or the worker is forced to stop, it is given up (the lease expires and the task is
reaped, as after a crash). A retry refused with ``LeaseLost`` may follow a first try that was
applied but whose reply was lost: the task's record tells which. A write the store refuses for
good (:class:`~agentlease.errors.BackendRefused`: a missing privilege) is kept in ``refused``,
and the worker stops on it.

A write refused with :class:`~agentlease.errors.TaskCancelled` (the task was cancelled while its
handler ran, before the heartbeat told it) is followed by one extension of the lease: the store
ends the task ``cancelled`` in it (see :meth:`FinalWrites.end_cancelled`), so the task does not
wait for its lease to run out.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Callable

from agentlease._async.queue import AsyncQueue
from agentlease._events import logger
from agentlease._heartbeat import Held
from agentlease._records import Lease
from agentlease.errors import (
    AgentLeaseError,
    BackendError,
    BackendRefused,
    BackendUnavailable,
    LeaseLost,
    TaskCancelled,
    UnknownTask,
)

__all__ = ["FinalWrites"]


class FinalWrites:
    """Sends the final writes of one worker's jobs.

    Args:
        queue: the worker's queue client.
        timeout: the bound of each try (seconds).
        forced: set when the worker stops without waiting: writes are tried once more, no more.
        rand: the jitter's random stream.
    """

    def __init__(
        self,
        queue: AsyncQueue,
        timeout: float,
        forced: threading.Event,
        rand: random.Random,
    ) -> None:
        self.queue = queue
        self._timeout = timeout
        self._forced = forced
        self._rand = rand
        self.refused: BackendRefused | None = None
        """The first write the store refused for good (a missing privilege, ...): the worker
        stops on it rather than run tasks whose outcomes it cannot record."""

    async def one(self, held: Held, write: Callable[[], Awaitable[object]]) -> bool:
        """Send a job's final write (complete or fail) and say whether the store accepted it.

        While the store is unavailable and the lease is still held, the write is retried with
        jittered backoff, so an outage shorter than the lease does not make the task run again.
        Each try is bounded by a third of the lease: one that hangs is abandoned and tried again.
        A retry refused with LeaseLost may follow a first try that was applied but whose reply
        was lost; the task's record tells which.
        """
        delay, retried = 0.05, False
        while True:
            try:
                async with asyncio.timeout(self._timeout):
                    await write()
                return True
            except TaskCancelled:
                await self.end_cancelled(held)
                return False
            except LeaseLost:
                return retried and await self._applied(held.lease)
            except (BackendUnavailable, TimeoutError) as exc:
                if held.lost.is_set() or self._forced.is_set():
                    logger.warning(
                        "giving up a write for %s: %s", held.lease.task_id, exc or "timed out"
                    )
                    return False
                retried = True
                await asyncio.sleep(delay * self._rand.uniform(0.5, 1.0))
                delay = min(1.0, delay * 2)
            except BackendError as exc:
                logger.error("write for %s failed: %s", held.lease.task_id, exc)
                if isinstance(exc, BackendRefused) and self.refused is None:
                    self.refused = exc
                return False

    async def many(
        self,
        helds: list[Held],
        write: Callable[[], Awaitable[list[LeaseLost | UnknownTask | None]]],
        *,
        retried: bool = False,
    ) -> list[bool]:
        """Send the completions of several jobs in one write (as :meth:`one` sends one) and
        say, per job, whether the store accepted it. ``retried``: an earlier try may have been
        applied."""
        delay = 0.05
        while True:
            try:
                async with asyncio.timeout(self._timeout):
                    outcomes = await write()
                break
            except (BackendUnavailable, TimeoutError) as exc:
                if self._forced.is_set() or all(h.lost.is_set() for h in helds):
                    logger.warning(
                        "giving up the completion of %s: %s",
                        ", ".join(h.lease.task_id for h in helds),
                        exc or "timed out",
                    )
                    return [False] * len(helds)
                retried = True
                await asyncio.sleep(delay * self._rand.uniform(0.5, 1.0))
                delay = min(1.0, delay * 2)
            except BackendError as exc:
                logger.error(
                    "completion of %s failed: %s", ", ".join(h.lease.task_id for h in helds), exc
                )
                if isinstance(exc, BackendRefused) and self.refused is None:
                    self.refused = exc
                return [False] * len(helds)
        return await self.accepted(helds, outcomes, retried=retried)

    async def accepted(
        self, helds: list[Held], outcomes: list[LeaseLost | UnknownTask | None], *, retried: bool
    ) -> list[bool]:
        """Per job, whether the store accepted its completion."""
        accepted = []
        for held, outcome in zip(helds, outcomes, strict=True):
            if outcome is None:
                accepted.append(True)
            elif isinstance(outcome, TaskCancelled):
                await self.end_cancelled(held)
                accepted.append(False)
            elif isinstance(outcome, LeaseLost):
                # A retry refused may follow a first try that was applied but whose reply was lost.
                accepted.append(retried and await self._applied(held.lease))
            else:
                logger.error("completion of %s refused: %s", held.lease.task_id, outcome)
                accepted.append(False)
        return accepted

    async def end_cancelled(self, held: Held) -> None:
        """Tell the store this lease's holder knows its task was cancelled: one extension of
        the lease, which the store refuses and, in the same step, uses to end the task
        ``cancelled`` (as the heartbeat's would). Best effort: if it fails, the next heartbeat
        or the reaper does the same."""
        try:
            async with asyncio.timeout(self._timeout):
                await self.queue.extend([held.lease])
        except (AgentLeaseError, TimeoutError) as exc:
            logger.info("cancelled task %s is left to the reaper: %s", held.lease.task_id, exc)

    async def _applied(self, lease: Lease) -> bool:
        """Whether the store shows this lease's own final write (no later claim happened)."""
        try:
            task = await self.queue.get(lease.task_id)
        except AgentLeaseError:
            return False
        return task.attempt == lease.attempt and task.state in ("done", "failed", "dead")
