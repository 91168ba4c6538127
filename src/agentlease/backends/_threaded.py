"""The asyncio face of a backend whose driver is synchronous (memory, SQLite).

Memory primitives never block, so they run inline on the event loop. SQLite primitives may wait
for the database lock, so they run on one dedicated thread that owns the connection; the event
loop never blocks on the store. Once closed, every primitive raises BackendUnavailable, as the
other stores do (never the executor's RuntimeError).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from agentlease._cursor import Key
from agentlease._records import (
    BreakerState,
    BudgetState,
    Cancellation,
    Enqueued,
    FinishedState,
    Job,
    KeyHold,
    KeyRecord,
    Lease,
    LeaseInfo,
    LeaseTerms,
    ListedState,
    LockBusy,
    NewTask,
    PlanRead,
    PlanReceipt,
    PlanWrite,
    QueueStats,
    Reaped,
    RecordWrite,
    StaleRead,
    StateRecord,
    Task,
    WorkerInfo,
)
from agentlease.errors import BackendUnavailable, LeaseLost, UnknownTask

if TYPE_CHECKING:
    from agentlease.backends.base import Backend

__all__ = ["ThreadedAsyncBackend"]

P = ParamSpec("P")
R = TypeVar("R")


class ThreadedAsyncBackend:
    """Awaitable primitives over a synchronous backend.

    Args:
        sync: the backend that does the work.
        inline: run primitives directly on the loop (only for stores that never block).
        sync_factory: makes the synchronous twin for heartbeat threads; defaults to ``sync``
            itself, which suits a thread-safe store.
    """

    def __init__(
        self,
        sync: Backend,
        *,
        inline: bool = False,
        sync_factory: Callable[[float | None], Backend] | None = None,
    ) -> None:
        self.url = sync.url
        self._sync = sync
        self._inline = inline
        self._factory = sync_factory
        self._executor = (
            None
            if inline
            else ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentlease-store")
        )
        self._closed = False

    async def _run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        if self._executor is None:
            return fn(*args, **kwargs)
        if self._closed:
            raise BackendUnavailable(f"{self.url}: this backend is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def now(self) -> float:
        return await self._run(self._sync.now)

    async def enqueue(self, tasks: Sequence[NewTask]) -> list[Enqueued]:
        return await self._run(self._sync.enqueue, tasks)

    async def claim(self, queue: str, n: int, terms: LeaseTerms) -> tuple[list[Job], list[Reaped]]:
        return await self._run(self._sync.claim, queue, n, terms)

    async def extend(self, leases: Sequence[Lease], lease_for: float) -> list[Lease | None]:
        return await self._run(self._sync.extend, leases, lease_for)

    async def complete(self, lease: Lease, result_json: bytes | None) -> None:
        await self._run(self._sync.complete, lease, result_json)

    async def complete_many(
        self, items: Sequence[tuple[Lease, bytes | None]]
    ) -> list[LeaseLost | UnknownTask | None]:
        return await self._run(self._sync.complete_many, items)

    async def complete_and_claim(
        self, items: Sequence[tuple[Lease, bytes | None]], queue: str, n: int, terms: LeaseTerms
    ) -> tuple[list[LeaseLost | UnknownTask | None], list[Job], list[Reaped]]:
        return await self._run(self._sync.complete_and_claim, items, queue, n, terms)

    async def fail(self, lease: Lease, error_json: bytes, retry_in: float | None) -> Task:
        return await self._run(self._sync.fail, lease, error_json, retry_in)

    async def release(self, lease: Lease, front: bool) -> None:
        await self._run(self._sync.release, lease, front)

    async def progress(
        self, lease: Lease, progress_json: bytes | None, checkpoint_json: bytes | None
    ) -> None:
        await self._run(self._sync.progress, lease, progress_json, checkpoint_json)

    async def reap(self, queue: str, front: bool) -> list[Reaped]:
        return await self._run(self._sync.reap, queue, front)

    async def get(self, task_id: str) -> Task:
        return await self._run(self._sync.get, task_id)

    async def stats(self, queue: str) -> QueueStats:
        return await self._run(self._sync.stats, queue)

    async def queues(self) -> list[str]:
        return await self._run(self._sync.queues)

    async def inspect(self, queue: str, limit: int) -> list[LeaseInfo]:
        return await self._run(self._sync.inspect, queue, limit)

    async def dead(self, queue: str, limit: int) -> list[Task]:
        return await self._run(self._sync.dead, queue, limit)

    async def requeue_dead(self, queue: str, task_ids: Sequence[str] | None, front: bool) -> int:
        return await self._run(self._sync.requeue_dead, queue, task_ids, front)

    async def cancel(self, task_id: str, reason: str, error_json: bytes) -> Cancellation:
        return await self._run(self._sync.cancel, task_id, reason, error_json)

    async def delete_queue(self, queue: str, limit: int, force: bool) -> tuple[int, bool]:
        return await self._run(self._sync.delete_queue, queue, limit, force)

    async def reserve_key(
        self, key: str, fingerprint: str, holder: str, hold_for: float, window: float
    ) -> KeyHold | KeyRecord:
        return await self._run(self._sync.reserve_key, key, fingerprint, holder, hold_for, window)

    async def extend_key(self, hold: KeyHold, hold_for: float) -> KeyHold:
        return await self._run(self._sync.extend_key, hold, hold_for)

    async def complete_key(self, hold: KeyHold, result_json: bytes | None, window: float) -> None:
        await self._run(self._sync.complete_key, hold, result_json, window)

    async def fail_key(self, hold: KeyHold, error_json: bytes, window: float) -> None:
        await self._run(self._sync.fail_key, hold, error_json, window)

    async def release_key(self, hold: KeyHold) -> None:
        await self._run(self._sync.release_key, hold)

    async def get_key(self, key: str) -> KeyRecord | None:
        return await self._run(self._sync.get_key, key)

    async def purge_tasks(
        self, queue: str, state: FinishedState, older_than: float, limit: int
    ) -> int:
        return await self._run(self._sync.purge_tasks, queue, state, older_than, limit)

    async def list_tasks(
        self, queue: str, state: ListedState, limit: int, after: Key | None
    ) -> tuple[list[Task], Key | None]:
        return await self._run(self._sync.list_tasks, queue, state, limit, after)

    async def purge_keys(self, limit: int) -> int:
        return await self._run(self._sync.purge_keys, limit)

    async def get_record(self, key: str) -> StateRecord | None:
        return await self._run(self._sync.get_record, key)

    async def write_record(self, key: str, write: RecordWrite) -> StateRecord:
        return await self._run(self._sync.write_record, key, write)

    async def add_counter(self, name: str, delta: int, low: int | None, high: int | None) -> int:
        return await self._run(self._sync.add_counter, name, delta, low, high)

    async def get_counter(self, name: str) -> int:
        return await self._run(self._sync.get_counter, name)

    async def get_counter_version(self, name: str) -> tuple[int, int]:
        return await self._run(self._sync.get_counter_version, name)

    @property
    def plan_pins(self) -> bool:
        return self._sync.plan_pins

    async def plan_secret(self) -> bytes:
        return await self._run(self._sync.plan_secret)

    async def act_plan(
        self,
        plan_id: str,
        reads: Sequence[PlanRead],
        writes: Sequence[PlanWrite],
        approved_by: str,
        keep_for: float,
        not_after: float | None,
    ) -> PlanReceipt | list[StaleRead]:
        return await self._run(
            self._sync.act_plan, plan_id, reads, writes, approved_by, keep_for, not_after
        )

    async def hold_counter(self, name: str, token: str, units: int, high: int, ttl: float) -> int:
        return await self._run(self._sync.hold_counter, name, token, units, high, ttl)

    async def extend_hold(self, name: str, token: str, ttl: float) -> bool:
        return await self._run(self._sync.extend_hold, name, token, ttl)

    async def release_hold(self, name: str, token: str) -> bool:
        return await self._run(self._sync.release_hold, name, token)

    async def commit_hold(self, name: str, token: str, units: int | None = None) -> bool:
        return await self._run(self._sync.commit_hold, name, token, units)

    async def acquire_locks(
        self, names: Sequence[str], owner: str, ttl: float
    ) -> list[int] | LockBusy:
        return await self._run(self._sync.acquire_locks, names, owner, ttl)

    async def extend_locks(self, names: Sequence[str], owner: str, ttl: float) -> list[str]:
        return await self._run(self._sync.extend_locks, names, owner, ttl)

    async def release_locks(self, names: Sequence[str], owner: str) -> list[str]:
        return await self._run(self._sync.release_locks, names, owner)

    async def lock_holders(self, names: Sequence[str]) -> list[tuple[str, float] | None]:
        return await self._run(self._sync.lock_holders, names)

    async def sweep_locks(self, limit: int) -> int:
        return await self._run(self._sync.sweep_locks, limit)

    async def purge_state(self, limit: int) -> int:
        return await self._run(self._sync.purge_state, limit)

    async def retry_budget(
        self, key: str, calls: int, retry: bool, ratio: float, minimum: int, ttl: float
    ) -> BudgetState:
        return await self._run(self._sync.retry_budget, key, calls, retry, ratio, minimum, ttl)

    async def breaker_admit(self, key: str, trial_for: float, ttl: float) -> BreakerState:
        return await self._run(self._sync.breaker_admit, key, trial_for, ttl)

    async def breaker_record(
        self, key: str, fence: int, ok: bool, threshold: int, cooldown: float, ttl: float
    ) -> BreakerState:
        return await self._run(self._sync.breaker_record, key, fence, ok, threshold, cooldown, ttl)

    async def register_worker(self, worker_id: str, info_json: bytes, ttl: float) -> float:
        return await self._run(self._sync.register_worker, worker_id, info_json, ttl)

    async def workers(self) -> list[WorkerInfo]:
        return await self._run(self._sync.workers)

    async def unregister_worker(self, worker_id: str) -> bool:
        return await self._run(self._sync.unregister_worker, worker_id)

    async def close(self) -> None:
        if self._executor is None:
            self._sync.close()
            return
        if self._closed:
            return
        try:
            await self._run(self._sync.close)
        finally:
            self._closed = True
            self._executor.shutdown(wait=False)

    async def wait_for_work(self, queue: str, timeout: float) -> None:
        """No notifications here: wait out the timeout (the worker's poll interval)."""
        await asyncio.sleep(timeout)

    def open_sync(self, *, call_timeout: float | None = None) -> Backend:
        return self._sync if self._factory is None else self._factory(call_timeout)
