"""The in-memory backend: tests and the fault harness; deterministic under a fake clock.

Each primitive runs under one lock, so it is one atomic step for every thread of the process.
Ready tasks sit in a heap per queue, ordered by (priority descending, sequence); scheduled tasks
and leases sit in heaps by time. Heap entries are validated when popped (lazy deletion), so claim,
extend and complete cost O(log n) and the reaper's cost grows with the expired leases only.
Finished tasks sit in a heap per (queue, state) by finished time, which ``purge_tasks`` pops
(a requeued dead letter's entry is skipped). A heap entry outlives what it stands for until its
time comes (a lease that ended stays in the lease heap until its expiry, when the next claim
drops it), so the heaps hold at most one lease's worth of stale entries.
Idempotency keys live in a :class:`~agentlease.backends._memory_keys.KeyTable`, versioned
records, counters and locks in a :class:`~agentlease.backends._memory_state.StateTables`, under
the same lock; their primitives are the bases MemoryKeys and MemoryState.

Cancellation: a row's ``cancel_reason`` (on its task) flags a live lease; ``_fenced`` refuses
every holder write on it with :class:`~agentlease.errors.TaskCancelled`, and ``extend`` and the
reaper end it cancelled. Each queue's lane keeps the ids of its tasks, so ``delete_queue``
deletes a batch of them without visiting other queues' tasks.
"""

from __future__ import annotations

import heapq
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import orjson

from agentlease import _cursor
from agentlease._cursor import Key
from agentlease._policy.lease import front_seq, is_live, lease_expiry, lost_reason, reap_outcome
from agentlease._records import (
    FINISHED,
    Cancellation,
    Enqueued,
    FinishedState,
    Job,
    Lease,
    LeaseInfo,
    LeaseTerms,
    ListedState,
    NewTask,
    QueueStats,
    Reaped,
    Task,
    TaskState,
    WorkerInfo,
    close_attempt,
    error_type,
    open_attempt,
)
from agentlease.backends._memory_keys import KeyTable, MemoryKeys
from agentlease.backends._memory_state import MemoryState, StateTables
from agentlease.backends._threaded import ThreadedAsyncBackend
from agentlease.backends.base import AsyncBackend
from agentlease.errors import LeaseLost, QueueInUse, TaskCancelled, UnknownQueue, UnknownTask

__all__ = ["MemoryBackend"]

HOT = 5  # partitions listed as hot in stats
WORKERS_SWEPT = 100  # lapsed worker entries deleted per register_worker


@dataclass(slots=True)
class _Row:
    task: Task
    seq: int
    token: str | None = None
    deadline: float = 0.0
    progress_timeout: float | None = None
    progressed_at: float = 0.0


@dataclass(slots=True)
class _Lane:
    ready: list[tuple[int, int, str]]
    waiting: list[tuple[float, str]]
    leased: list[tuple[float, str, str]]
    ids: dict[str, None] = field(default_factory=dict)  # every task of the queue


class MemoryBackend(MemoryKeys, MemoryState):
    """Tasks held in this process's memory.

    Args:
        clock: the store's clock; pass a fake clock for deterministic tests.
        url: how the backend is named in messages.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time, url: str = "memory://") -> None:
        self.url = url
        self._clock = clock
        self._lock = threading.RLock()
        self._rows: dict[str, _Row] = {}
        self._lanes: dict[str, _Lane] = {}
        self._dedup: dict[tuple[str, str], str] = {}
        self._seq = 0
        self._keys = KeyTable()
        self._state = StateTables()
        # Partitions: the busy tasks of each (queue, partition), and its parked tasks by sequence.
        self._busy: dict[tuple[str, str], set[str]] = {}
        self._parked: dict[tuple[str, str], list[tuple[int, str]]] = {}
        # Retention: finished tasks of each (queue, state) by finished_at, lazily validated.
        self._ended: dict[tuple[str, str], list[tuple[float, str]]] = {}
        # Live workers: id -> (info JSON, beat_at, expires_at); the holder of each lease.
        self._workers: dict[str, tuple[bytes, float, float]] = {}
        self._holders: dict[str, str | None] = {}

    # -- helpers (called with the lock held) ---------------------------------------------------

    def _lane(self, queue: str) -> _Lane:
        lane = self._lanes.get(queue)
        if lane is None:
            raise UnknownQueue(queue)
        return lane

    def _push_ready(self, lane: _Lane, row: _Row) -> None:
        heapq.heappush(lane.ready, (-row.task.priority, row.seq, row.task.id))

    def _fenced(self, lease: Lease, now: float) -> _Row:
        row = self._rows.get(lease.task_id)
        if row is None:
            raise UnknownTask(lease.task_id)
        t = row.task
        if t.cancel_reason is not None and t.state in ("leased", "cancelled"):
            raise TaskCancelled(
                lease.task_id, t.cancel_reason, attempt=lease.attempt, current_attempt=t.attempt
            )
        if (
            t.state != "leased"
            or row.token != lease.token
            or t.expires_at is None
            or not is_live(now, t.expires_at)
        ):
            live = t.expires_at is not None and is_live(now, t.expires_at)
            reason = lost_reason(t.state, row.token == lease.token, live)
            raise LeaseLost(lease.task_id, lease.attempt, t.attempt, t.state, reason=reason)
        return row

    def _promote(self, lane: _Lane, now: float) -> None:
        while lane.waiting and lane.waiting[0][0] <= now:
            run_at, task_id = heapq.heappop(lane.waiting)
            row = self._rows.get(task_id)
            if (
                row is not None
                and row.task.state in ("scheduled", "failed")
                and row.task.run_at == run_at
            ):
                row.task = replace(row.task, state="queued")
                self._push_ready(lane, row)

    def _reap(self, queue: str, lane: _Lane, now: float, front: bool) -> list[Reaped]:
        reaped: list[Reaped] = []
        while lane.leased and lane.leased[0][0] <= now:
            expires_at, task_id, token = heapq.heappop(lane.leased)
            row = self._rows.get(task_id)
            if row is None:
                continue
            t = row.task
            if t.state != "leased" or row.token != token or t.expires_at != expires_at:
                continue
            if t.cancel_reason is not None:  # its holder is gone: the cancel is carried out
                self._cancelled(row, now)
                reaped.append(Reaped(task_id, queue, t.attempt, "cancelled"))
                continue
            reclaims = t.reclaims + 1
            outcome = reap_outcome(reclaims, t.max_reclaims)
            row.token = None
            t = replace(t, attempts=close_attempt(t.attempts, t.attempt, now, "expired"))
            if outcome == "dead":
                error = orjson.dumps(
                    {"type": "LeaseExpired", "message": f"lease expired {reclaims} times"}
                )
                row.task = replace(
                    t,
                    state="dead",
                    reclaims=reclaims,
                    finished_at=now,
                    error_json=error,
                    expires_at=None,
                )
                self._finished(row, now)
            else:
                if front:
                    row.seq = front_seq(row.seq)
                else:
                    self._seq += 1
                    row.seq = self._seq
                row.task = replace(t, state="queued", reclaims=reclaims, expires_at=None)
                self._push_ready(lane, row)
            reaped.append(Reaped(task_id, queue, t.attempt, outcome))
        return reaped

    def _start(self, lane: _Lane, row: _Row, now: float) -> None:
        """Make a new, requeued or unparked task runnable (queued, or scheduled if its time has
        not come) and count it busy for its partition."""
        t = row.task
        if t.partition is not None:
            self._busy.setdefault((t.queue, t.partition), set()).add(t.id)
        if t.run_at > now:
            row.task = replace(t, state="scheduled")
            heapq.heappush(lane.waiting, (t.run_at, t.id))
        else:
            row.task = replace(t, state="queued")
            self._push_ready(lane, row)

    def _park(self, row: _Row) -> bool:
        """Park a task whose partition is busy (True), else leave it be (False)."""
        t = row.task
        if t.partition is None or not self._busy.get((t.queue, t.partition)):
            return False
        row.task = replace(t, state="parked")
        heapq.heappush(self._parked.setdefault((t.queue, t.partition), []), (row.seq, t.id))
        return True

    def _finished(self, row: _Row, now: float) -> None:
        """A task became done or dead: index it by finished time (for purging) and, if its
        partition is now idle, unpark the next one."""
        t = row.task
        heapq.heappush(self._ended.setdefault((t.queue, t.state), []), (now, t.id))
        if t.partition is None:
            return
        key = (t.queue, t.partition)
        busy = self._busy.get(key)
        if busy is not None:
            busy.discard(t.id)
            if busy:
                return
            del self._busy[key]
        parked = self._parked.get(key)
        while parked:
            _seq, task_id = heapq.heappop(parked)
            nxt = self._rows.get(task_id)
            if nxt is not None and nxt.task.state == "parked":
                self._start(self._lanes[t.queue], nxt, now)
                break
        if not parked:
            self._parked.pop(key, None)

    def _cancelled(self, row: _Row, now: float) -> None:
        """End a task cancelled (its reason and error already on it, or given by the caller)
        and free its partition; a lease's running attempt ends cancelled."""
        row.token = None
        t = row.task
        attempts = close_attempt(t.attempts, t.attempt, now, "cancelled")
        row.task = replace(
            t, state="cancelled", finished_at=now, expires_at=None, attempts=attempts
        )
        self._finished(row, now)

    def _set_lease(self, lane: _Lane, row: _Row) -> None:
        t = row.task
        assert t.expires_at is not None
        assert row.token is not None
        heapq.heappush(lane.leased, (t.expires_at, t.id, row.token))

    # -- primitives -----------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock()

    def enqueue(self, tasks: Sequence[NewTask]) -> list[Enqueued]:
        with self._lock:
            now = self._clock()
            out: list[Enqueued] = []
            batch: dict[str, str] = {}
            for spec in tasks:
                existing = self._rows.get(spec.id) or (
                    self._rows.get(self._dedup.get((spec.queue, spec.dedup_key), ""))
                    if spec.dedup_key is not None
                    else None
                )
                if existing is not None:
                    out.append(Enqueued(existing.task.id, False))
                    continue
                if spec.id in batch:
                    out.append(Enqueued(spec.id, False))
                    continue
                lane = self._lanes.setdefault(spec.queue, _Lane([], [], []))
                self._seq += 1
                state: TaskState = "parked"
                row = _Row(
                    Task(
                        id=spec.id,
                        queue=spec.queue,
                        state=state,
                        priority=spec.priority,
                        payload_json=spec.payload_json,
                        attempt=0,
                        reclaims=0,
                        failures=0,
                        max_reclaims=spec.max_reclaims,
                        created_at=now,
                        run_at=now + spec.delay,
                        dedup_key=spec.dedup_key,
                        partition=spec.partition,
                        context_json=spec.context_json,
                    ),
                    seq=self._seq,
                )
                self._rows[spec.id] = row
                lane.ids[spec.id] = None
                batch[spec.id] = spec.id
                if spec.dedup_key is not None:
                    self._dedup[(spec.queue, spec.dedup_key)] = spec.id
                if not self._park(row):
                    self._start(lane, row, now)
                out.append(Enqueued(spec.id, True))
            return out

    def claim(self, queue: str, n: int, terms: LeaseTerms) -> tuple[list[Job], list[Reaped]]:
        with self._lock:
            lane = self._lanes.get(queue)
            if lane is None:
                return [], []
            now = self._clock()
            self._promote(lane, now)
            reaped = self._reap(queue, lane, now, terms.reap_front)
            jobs: list[Job] = []
            while lane.ready and len(jobs) < n:
                neg_priority, seq, task_id = heapq.heappop(lane.ready)
                row = self._rows.get(task_id)
                if row is None:
                    continue
                t = row.task
                if t.state != "queued" or row.seq != seq or t.priority != -neg_priority:
                    continue
                row.token = secrets.token_hex(16)
                row.deadline = now + terms.max_total
                row.progress_timeout = terms.progress_timeout
                row.progressed_at = now
                expires = lease_expiry(
                    now, terms.lease_for, row.deadline, now, terms.progress_timeout
                )
                row.task = replace(
                    t,
                    state="leased",
                    attempt=t.attempt + 1,
                    leased_at=now,
                    expires_at=expires,
                    attempts=open_attempt(t.attempts, t.attempt + 1, terms.holder, now),
                )
                self._holders[task_id] = terms.holder
                self._set_lease(lane, row)
                lease = Lease(task_id, queue, row.token, t.attempt + 1, now, expires)
                jobs.append(
                    Job(
                        lease,
                        t.payload_json,
                        t.checkpoint_json,
                        t.priority,
                        t.failures,
                        t.reclaims,
                        t.context_json,
                        t.run_at,
                    )
                )
            return jobs, reaped

    def extend(self, leases: Sequence[Lease], lease_for: float) -> list[Lease | None]:
        with self._lock:
            now = self._clock()
            out: list[Lease | None] = []
            for lease in leases:
                try:
                    row = self._fenced(lease, now)
                except TaskCancelled:
                    flagged = self._rows[lease.task_id]
                    if flagged.task.state == "leased" and flagged.token == lease.token:
                        self._cancelled(flagged, now)  # the holder is told now
                    out.append(None)
                    continue
                except (LeaseLost, UnknownTask):
                    out.append(None)
                    continue
                expires = lease_expiry(
                    now, lease_for, row.deadline, row.progressed_at, row.progress_timeout
                )
                if expires != row.task.expires_at:
                    row.task = replace(row.task, expires_at=expires)
                    self._set_lease(self._lanes[row.task.queue], row)
                out.append(replace(lease, expires_at=expires))
            return out

    def complete(self, lease: Lease, result_json: bytes | None) -> None:
        with self._lock:
            now = self._clock()
            row = self._fenced(lease, now)
            row.token = None
            t = row.task
            row.task = replace(
                t,
                state="done",
                result_json=result_json,
                finished_at=now,
                expires_at=None,
                attempts=close_attempt(t.attempts, t.attempt, now, "done"),
            )
            self._finished(row, now)

    def complete_and_claim(
        self, items: Sequence[tuple[Lease, bytes | None]], queue: str, n: int, terms: LeaseTerms
    ) -> tuple[list[LeaseLost | UnknownTask | None], list[Job], list[Reaped]]:
        with self._lock:
            outcomes = self.complete_many(items)
            jobs, reaped = self.claim(queue, n, terms)
        return outcomes, jobs, reaped

    def complete_many(
        self, items: Sequence[tuple[Lease, bytes | None]]
    ) -> list[LeaseLost | UnknownTask | None]:
        out: list[LeaseLost | UnknownTask | None] = []
        with self._lock:
            for lease, result_json in items:
                try:
                    self.complete(lease, result_json)
                except (LeaseLost, UnknownTask) as exc:
                    out.append(exc)
                else:
                    out.append(None)
        return out

    def fail(self, lease: Lease, error_json: bytes, retry_in: float | None) -> Task:
        with self._lock:
            now = self._clock()
            row = self._fenced(lease, now)
            row.token = None
            t = row.task
            t = replace(
                t,
                attempts=close_attempt(
                    t.attempts, t.attempt, now, "failed", error_type(error_json)
                ),
            )
            if retry_in is None:
                row.task = replace(
                    t,
                    state="dead",
                    failures=t.failures + 1,
                    error_json=error_json,
                    finished_at=now,
                    expires_at=None,
                )
                self._finished(row, now)
            else:
                row.task = replace(
                    t,
                    state="failed",
                    failures=t.failures + 1,
                    error_json=error_json,
                    run_at=now + retry_in,
                    expires_at=None,
                )
                heapq.heappush(self._lanes[t.queue].waiting, (row.task.run_at, t.id))
            return replace(row.task, attempts=())

    def release(self, lease: Lease, front: bool) -> None:
        with self._lock:
            now = self._clock()
            row = self._fenced(lease, now)
            row.token = None
            if front:
                row.seq = front_seq(row.seq)
            else:
                self._seq += 1
                row.seq = self._seq
            t = row.task
            row.task = replace(
                t,
                state="queued",
                expires_at=None,
                attempts=close_attempt(t.attempts, t.attempt, now, "released"),
            )
            self._push_ready(self._lanes[row.task.queue], row)

    def progress(
        self, lease: Lease, progress_json: bytes | None, checkpoint_json: bytes | None
    ) -> None:
        with self._lock:
            now = self._clock()
            row = self._fenced(lease, now)
            row.progressed_at = now
            t = row.task
            row.task = replace(
                t,
                progress_json=progress_json,
                checkpoint_json=checkpoint_json
                if checkpoint_json is not None
                else t.checkpoint_json,
            )

    def reap(self, queue: str, front: bool) -> list[Reaped]:
        with self._lock:
            lane = self._lanes.get(queue)
            if lane is None:
                return []
            return self._reap(queue, lane, self._clock(), front)

    def get(self, task_id: str) -> Task:
        with self._lock:
            row = self._rows.get(task_id)
            if row is None:
                raise UnknownTask(task_id)
            return row.task

    def stats(self, queue: str) -> QueueStats:
        with self._lock:
            self._lane(queue)
            now = self._clock()
            counts: dict[str, int] = {}
            oldest: float | None = None
            parked: dict[str, int] = {}
            for row in self._rows.values():
                t = row.task
                if t.queue != queue:
                    continue
                counts[t.state] = counts.get(t.state, 0) + 1
                if t.state == "queued":
                    age = now - t.created_at
                    oldest = age if oldest is None else max(oldest, age)
                elif t.state == "parked" and t.partition is not None:
                    parked[t.partition] = parked.get(t.partition, 0) + 1
            hot = tuple(sorted(parked.items(), key=lambda kv: (-kv[1], kv[0]))[:HOT])
            return QueueStats(queue, counts, oldest, now, hot)

    def queues(self) -> list[str]:
        with self._lock:
            return sorted(self._lanes)

    def inspect(self, queue: str, limit: int) -> list[LeaseInfo]:
        with self._lock:
            self._lane(queue)
            now = self._clock()
            live = [
                r.task
                for r in self._rows.values()
                if r.task.queue == queue
                and r.task.state == "leased"
                and r.task.expires_at is not None
                and is_live(now, r.task.expires_at)
            ]
            live.sort(key=lambda t: (t.expires_at, t.id))
            return [
                LeaseInfo(
                    t.id,
                    t.attempt,
                    now - (t.leased_at or now),
                    (t.expires_at or now) - now,
                    t.reclaims,
                    t.failures,
                    self._holders.get(t.id),
                )
                for t in live[:limit]
            ]

    def dead(self, queue: str, limit: int) -> list[Task]:
        with self._lock:
            self._lane(queue)
            rows = [r.task for r in self._rows.values() if r.task.queue == queue]
            dead = [t for t in rows if t.state == "dead"]
            dead.sort(key=lambda t: (-(t.finished_at or 0.0), t.id))
            return [replace(t, attempts=()) for t in dead[:limit]]

    def requeue_dead(self, queue: str, task_ids: Sequence[str] | None, front: bool) -> int:
        with self._lock:
            lane = self._lane(queue)
            now = self._clock()
            wanted = None if task_ids is None else set(task_ids)
            count = 0
            for row in self._rows.values():
                t = row.task
                if t.queue != queue or t.state != "dead":
                    continue
                if wanted is not None and t.id not in wanted:
                    continue
                if front:
                    row.seq = front_seq(row.seq)
                else:
                    self._seq += 1
                    row.seq = self._seq
                row.task = replace(
                    t, state="queued", reclaims=0, failures=0, finished_at=None, run_at=now
                )
                if not self._park(row):
                    self._start(lane, row, now)
                count += 1
            return count

    def purge_tasks(self, queue: str, state: FinishedState, older_than: float, limit: int) -> int:
        with self._lock:
            ended = self._ended.get((queue, state))
            cutoff = self._clock() - older_than
            purged = 0
            while ended and purged < limit and ended[0][0] <= cutoff:
                finished_at, task_id = heapq.heappop(ended)
                row = self._rows.get(task_id)
                if row is None or row.task.state != state or row.task.finished_at != finished_at:
                    continue  # requeued (or purged) since: a stale entry
                del self._rows[task_id]
                self._holders.pop(task_id, None)
                lane = self._lanes.get(queue)
                if lane is not None:
                    lane.ids.pop(task_id, None)
                dedup = row.task.dedup_key
                if dedup is not None and self._dedup.get((queue, dedup)) == task_id:
                    del self._dedup[(queue, dedup)]
                purged += 1
            if ended is not None and not ended:
                del self._ended[(queue, state)]
            return purged

    def list_tasks(
        self, queue: str, state: ListedState, limit: int, after: Key | None
    ) -> tuple[list[Task], Key | None]:
        # The test store sorts the state's tasks of the queue on every call (no index).
        with self._lock:
            rows = [
                r for r in self._rows.values() if r.task.queue == queue and r.task.state == state
            ]
            keys: list[tuple[Key, Task]]
            if state == "queued":
                start = _cursor.key(after, int, int, str)
                keys = [([-r.task.priority, r.seq, r.task.id], r.task) for r in rows]
            elif state == "leased":
                start = _cursor.key(after, float, str)
                keys = [([r.task.expires_at or 0.0, r.task.id], r.task) for r in rows]
            else:
                start = _cursor.key(after, float, str)
                keys = [([r.task.finished_at or 0.0, r.task.id], r.task) for r in rows]
            desc = state in ("done", "dead", "cancelled")
            keys.sort(key=lambda kt: kt[0], reverse=desc)
            if start is not None:
                keys = [kt for kt in keys if (kt[0] < start if desc else kt[0] > start)]
            page = keys[:limit]
            more = len(keys) > limit
            return [t for _, t in page], (page[-1][0] if more else None)

    def register_worker(self, worker_id: str, info_json: bytes, ttl: float) -> float:
        with self._lock:
            now = self._clock()
            lapsed = [w for w, (_, _, until) in self._workers.items() if until <= now]
            for w in lapsed[:WORKERS_SWEPT]:
                del self._workers[w]
            self._workers[worker_id] = (info_json, now, now + ttl)
            return now + ttl

    def workers(self) -> list[WorkerInfo]:
        with self._lock:
            now = self._clock()
            return [
                WorkerInfo(w, info, beat, until)
                for w, (info, beat, until) in sorted(self._workers.items())
                if until > now
            ]

    def unregister_worker(self, worker_id: str) -> bool:
        with self._lock:
            return self._workers.pop(worker_id, None) is not None

    def cancel(self, task_id: str, reason: str, error_json: bytes) -> Cancellation:
        with self._lock:
            now = self._clock()
            row = self._rows.get(task_id)
            if row is None:
                raise UnknownTask(task_id)
            t = row.task
            if t.state in FINISHED:
                return Cancellation(task_id, "finished", t.state, t.cancel_reason)
            current = t.cancel_reason
            if current is None:
                row.task = t = replace(t, cancel_reason=reason, error_json=error_json)
            live = t.expires_at is not None and is_live(now, t.expires_at)
            if t.state == "leased" and live:
                return Cancellation(task_id, "requested", "leased", t.cancel_reason)
            self._cancelled(row, now)
            return Cancellation(task_id, "cancelled", "cancelled", t.cancel_reason)

    def delete_queue(self, queue: str, limit: int, force: bool) -> tuple[int, bool]:
        with self._lock:
            lane = self._lanes.get(queue)
            if lane is None:
                return 0, True
            now = self._clock()
            if not force:
                leased = sum(
                    1
                    for expires, task_id, token in lane.leased
                    if (row := self._rows.get(task_id)) is not None
                    and row.token == token
                    and row.task.state == "leased"
                    and row.task.expires_at == expires
                    and is_live(now, expires)
                )
                if leased:
                    raise QueueInUse(queue, leased)
            deleted = 0
            while lane.ids and deleted < limit:
                task_id = next(iter(lane.ids))
                del lane.ids[task_id]
                row = self._rows.pop(task_id)
                self._holders.pop(task_id, None)
                t = row.task
                if t.dedup_key is not None:
                    self._dedup.pop((queue, t.dedup_key), None)
                if t.partition is not None:
                    busy = self._busy.get((queue, t.partition))
                    if busy is not None:
                        busy.discard(task_id)
                deleted += 1
            if lane.ids:
                return deleted, False
            del self._lanes[queue]
            for key in [k for k in self._busy if k[0] == queue]:
                del self._busy[key]
            for key in [k for k in self._parked if k[0] == queue]:
                del self._parked[key]
            for key in [k for k in self._ended if k[0] == queue]:
                del self._ended[key]
            return deleted, True

    def close(self) -> None:
        """Nothing to release: the tasks live as long as this object."""

    def open_async(self) -> AsyncBackend:
        return ThreadedAsyncBackend(self, inline=True)
