# Generated from agentlease/backends/_async/redis_backend.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""The Redis backend: many machines, lowest latency; Redis or Redis Cluster.

Written once for asyncio (``redis.asyncio``, hiredis); ``backends/_sync/redis_backend.py`` is
generated from this file by scripts/unasync.py.

Atomicity. Every primitive on a queue is one Lua script (``backends/lua/*.lua``), so it is one
atomic step on the store: claim promotes due tasks, reaps expired leases, pops and leases in one
script; every holder write compares the lease's token and requires ``now < expires_at`` in the
same script that writes. Every time is ``redis.call('TIME')``, read inside the script: the store's
clock, never this process's. Batches cost one script per queue, sent in one pipeline.

Keys. Every key of one queue shares the hash tag ``{<prefix>:<queue>}`` and is passed in
``KEYS``, so each queue lives on one Redis Cluster shard and many queues spread over a cluster.
A prefix holds no ``:``, so every key of prefix ``P`` starts with ``P:`` or ``{P:`` and
no other prefix's does (a queue ``b:c`` under ``a`` cannot meet a prefix ``a:b``).
The layout is drawn in :mod:`agentlease.backends.lua`.

Task ids are unique across queues: the global hash ``<prefix>:ids`` maps each id to its queue
(``get`` needs no queue). It cannot share a slot with every queue, so enqueue is two steps: the
ids are reserved with HSETNX (pipelined), then the queue's script creates the tasks. The script
trusts its own queue, not the reservation: it creates any task whose id is reserved for this
queue but absent, so an enqueue that crashed between the two steps is completed by a retry of
the same enqueue to the same queue (an id left reserved that way for a queue nobody retries
stays taken: enqueueing it elsewhere reports it as existing). A reservation made for a task the
script did not create (its dedup key was taken) is dropped again.

Retention. ``purge_tasks`` is two steps too: the queue's ``purge`` script deletes the oldest
finished tasks (read from a ZSET by finished time: ``:d`` for dead letters, ``:f`` for done
tasks) and returns their ids, then one pipeline drops those ids from ``<prefix>:ids``. The
script's reply is kept under its request nonce, so a resend after a lost reply frees the same
ids, and the next purge of the queue returns them once more, so ids a client that died between
the steps never freed are freed then; an id re-enqueued to the same queue between the two steps
gets its entry back.

Attempts and workers. A claim records the worker it names (the lease's holder; ``inspect``
reads it) in the queue's hash ``{<prefix>:<queue>}:a``; the scripts that end a lease otherwise
than done (fail, release, a reap, a cancel) record its attempt there, in that same script. The
running attempt and a done task's last one are read from the task record, so a claim and a
completion write no history. Live workers are one hash and one zset under
the hash tag ``{<prefix>:workers}`` (one shard), each primitive one script.

Cancellation. ``cancel`` is one script on the task's queue (found through ``<prefix>:ids``); a
live lease becomes an internal state, ``CANCELLING`` (shown as leased), which no holder write's
fence passes; its next ``extend`` or the reaper ends it cancelled. The reason lives in the task's
error (written by the cancel), so a refused write reads it back for
:class:`~agentlease.errors.TaskCancelled`. ``delete_queue`` deletes a bounded batch of a queue's
tasks per script, and every key of the queue with its last batch; the ids of each batch then
leave ``<prefix>:ids`` and, at the end, the queue leaves ``<prefix>:queues`` (other slots).
The key layout stays at version 1 (old records read the same), but the two new states are
unknown to an agentlease without cancellation: once tasks are cancelled, such clients must no
longer use the store (their reads of a cancelled task fail, and their reaper drops an expired
``CANCELLING`` lease from the index, leaving it for a later ``cancel`` of the task to end).

Version. Before its first call a backend reads ``<prefix>:layout``, the key layout's version
(written on first use), and refuses a store written by a newer agentlease with
:class:`~agentlease.errors.SchemaTooNew`; see :mod:`.redis_layout`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import redis.backoff

from agentlease import _cursor
from agentlease._cursor import Key
from agentlease._records import (
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
    WorkerInfo,
    reason_of,
)
from agentlease.backends import _redis_tls, _redis_url
from agentlease.backends._sync.redis_keys import RedisKeys
from agentlease.backends._sync.redis_layout import CheckedLink
from agentlease.backends._sync.redis_link import Call, Client
from agentlease.backends._sync.redis_state import RedisState
from agentlease.backends.lua import (
    claim_terms,
    enqueued_from,
    jobs_from,
    lease_infos_from,
    queue_keys,
    reaped_from,
    store_time,
    task_from,
    worker_keys,
    workers_from,
)
from agentlease.errors import LeaseLost, QueueInUse, TaskCancelled, UnknownQueue, UnknownTask

__all__ = ["RedisBackend"]

CAP = 1000  # most promotions, reaps or requeues one script does (a script never runs unbounded)
_STATE_NAMES = ("scheduled", "queued", "leased", "failed", "done", "dead")


def _nonce() -> str:
    """A request nonce: lets a script recognise a retry of a write it already applied."""
    return os.urandom(8).hex()


def _flag(value: bool) -> str:
    return "1" if value else "0"


class RedisBackend(RedisKeys, RedisState):
    """Tasks (and idempotency keys, see :class:`RedisKeys`; records, counters and locks, see
    :class:`RedisState`) in Redis (or a Redis Cluster), shared by every process that can reach it.

    Args:
        options: the parsed URL (see :func:`agentlease.backends._redis_url.parse`).
    """

    def __init__(self, options: _redis_url.RedisOptions) -> None:
        self.url = options.url
        self._options = options
        self._prefix = options.prefix
        self._ids = f"{options.prefix}:ids"
        self._queues = f"{options.prefix}:queues"
        retry = _redis_url.redis_sync.retry.Retry(redis.backoff.NoBackoff(), 0)
        try:
            client: Client = (
                _redis_url.redis_sync.RedisCluster(retry=retry, **options.client_kwargs())
                if options.cluster
                else _redis_url.redis_sync.Redis(retry=retry, **options.client_kwargs())
            )
        except _redis_url.DRIVER_ERRORS as exc:  # a cluster client reads the slot map at once
            refused = _redis_tls.tls_refusal(options.client_kwargs(), exc, self.url)
            raise (refused or _redis_url.translate(self.url, exc)) from exc
        self._link = CheckedLink(client, self.url, options.prefix)

    # -- helpers -------------------------------------------------------------------------------

    def _holder_write(
        self, name: str, keys: Sequence[str], lease: Lease, args: Sequence[object]
    ) -> Any:
        """Run a fenced write (retried safely: it carries a nonce, or repeats harmlessly) and
        return its reply; raise if the lease was not held."""
        reply = self._link.script(name, keys, args, retry=True)
        refusal = _refusal(lease, reply)
        if refusal is not None:
            raise self._with_reason(refusal)
        return reply

    def _with_reason(self, refusal: LeaseLost | UnknownTask) -> LeaseLost | UnknownTask:
        """A TaskCancelled refusal with the task's cancel reason (read after the refused
        write: it is kept in the task's error, which nothing changes once it is cancelled)."""
        if not isinstance(refusal, TaskCancelled):
            return refusal
        try:
            task = self.get(refusal.task_id)
        except UnknownTask:
            return refusal
        reason = reason_of(task.error_json) or refusal.reason
        return TaskCancelled(
            refusal.task_id,
            reason,
            attempt=refusal.attempt,
            current_attempt=refusal.current_attempt,
        )

    # -- primitives -----------------------------------------------------------------------------

    def now(self) -> float:
        seconds, micros = self._link.command("TIME")
        return int(seconds) + int(micros) / 1_000_000

    def enqueue(self, tasks: Sequence[NewTask]) -> list[Enqueued]:
        if not tasks:
            return []
        # Step 1: reserve every id for its queue in the global index, and learn each id's owner.
        reserve: list[Call] = []
        for spec in tasks:
            reserve.append(("HSETNX", self._ids, spec.id, spec.queue))
            reserve.append(("HGET", self._ids, spec.id))
        replies = self._link.many(reserve)
        mine = [replies[2 * i] == 1 for i in range(len(tasks))]
        owner = [replies[2 * i + 1] for i in range(len(tasks))]
        out: list[Enqueued | None] = [None] * len(tasks)
        groups: dict[str, list[int]] = {}
        for i, spec in enumerate(tasks):
            if owner[i] == spec.queue.encode():
                groups.setdefault(spec.queue, []).append(i)
            else:  # the id belongs to a task of another queue
                out[i] = Enqueued(spec.id, False)
        # Step 2: one script per queue creates its tasks (the queue is listed first).
        nonce = _nonce()
        calls: list[Call] = []
        for queue, members in groups.items():
            args: list[object] = [nonce, len(members)]
            for i in members:
                spec = tasks[i]
                args += (
                    spec.id,
                    spec.payload_json,
                    spec.priority,
                    spec.delay,
                    spec.dedup_key or "",
                    spec.max_reclaims,
                    spec.partition or "",
                    spec.context_json or b"",
                )
            calls.append(("SADD", self._queues, queue))
            calls.append(("EVALSHA", "enqueue", queue_keys(self._prefix, queue).enqueue, args))
        results = self._link.many(calls)
        # Step 3 (rare): drop reservations of tasks not created; re-point ids created on a
        # reservation this call did not make (a retry after a crash, a concurrent duplicate).
        fix: list[Call] = []
        for (queue, members), reply in zip(groups.items(), results[1::2], strict=True):
            for i, outcome in zip(members, enqueued_from(reply), strict=True):
                out[i] = outcome
                task_id = tasks[i].id
                if mine[i] and not outcome.created and outcome.task_id != task_id:
                    fix.append(("HDEL", self._ids, task_id))
                elif outcome.created and not mine[i]:
                    fix.append(("HSET", self._ids, task_id, queue))
        if fix:
            self._link.many(fix)
        return [e for e in out if e is not None]

    def claim(self, queue: str, n: int, terms: LeaseTerms) -> tuple[list[Job], list[Reaped]]:
        tokens = os.urandom(16 * n).hex()
        seconds, micros, expires, jobs, reaped = self._link.script(
            "claim",
            queue_keys(self._prefix, queue).claim,
            (claim_terms(n, terms, CAP), tokens, terms.holder or ""),
            retry=False,
        )
        now = store_time(seconds, micros)
        return jobs_from(queue, now, expires, tokens, jobs), reaped_from(queue, reaped)

    def extend(self, leases: Sequence[Lease], lease_for: float) -> list[Lease | None]:
        groups: dict[str, list[int]] = {}
        for i, lease in enumerate(leases):
            groups.setdefault(lease.queue, []).append(i)
        calls: list[Call] = []
        for queue, members in groups.items():
            args: list[object] = [lease_for]
            for i in members:
                args += (leases[i].task_id, leases[i].token)
            calls.append(("EVALSHA", "extend", queue_keys(self._prefix, queue).extend, args))
        if len(calls) == 1:
            _, name, keys, args = calls[0]
            replies = [self._link.script(name, keys, args, retry=True)]
        else:
            replies = self._link.many(calls)
        out: list[Lease | None] = [None] * len(leases)
        for members, reply in zip(groups.values(), replies, strict=True):
            for i, expires in zip(members, reply, strict=True):
                if expires is not None:
                    old = leases[i]
                    out[i] = Lease(
                        old.task_id,
                        old.queue,
                        old.token,
                        old.attempt,
                        old.leased_at,
                        float(expires),
                    )
        return out

    def complete(self, lease: Lease, result_json: bytes | None) -> None:
        keys = queue_keys(self._prefix, lease.queue).complete
        args = (lease.task_id, lease.token, _nonce(), result_json or b"")
        self._holder_write("complete", keys, lease, args)

    def complete_many(
        self, items: Sequence[tuple[Lease, bytes | None]]
    ) -> list[LeaseLost | UnknownTask | None]:
        # One complete_many script per queue (a queue's keys share one Redis Cluster slot), all
        # in one round trip. The request's nonce makes a resend safe.
        by_queue: dict[str, list[int]] = {}
        for i, (lease, _) in enumerate(items):
            by_queue.setdefault(lease.queue, []).append(i)
        nonce = _nonce()
        calls: list[Call] = []
        for queue, positions in by_queue.items():
            pairs = " ".join(f"{items[i][0].task_id} {items[i][0].token}" for i in positions)
            args = [nonce, pairs, *(items[i][1] or b"" for i in positions)]
            calls.append(
                ("EVALSHA", "complete_many", queue_keys(self._prefix, queue).complete, args)
            )
        if len(calls) == 1:
            _, name, keys, args = calls[0]
            replies = [self._link.script(name, keys, args, retry=True)]
        else:
            replies = self._link.many(calls)
        out: list[LeaseLost | UnknownTask | None] = [None] * len(items)
        for positions, group in zip(by_queue.values(), replies, strict=True):
            for i, reply in zip(positions, group, strict=True):
                refusal = _refusal(items[i][0], reply)
                out[i] = None if refusal is None else self._with_reason(refusal)
        return out

    def complete_and_claim(
        self, items: Sequence[tuple[Lease, bytes | None]], queue: str, n: int, terms: LeaseTerms
    ) -> tuple[list[LeaseLost | UnknownTask | None], list[Job], list[Reaped]]:
        # Two round trips: a claim is never resent (see claim), so it cannot share the
        # completions' pipeline, which is resent whole after a broken connection.
        outcomes = self.complete_many(items) if items else []
        jobs, reaped = self.claim(queue, n, terms)
        return outcomes, jobs, reaped

    def fail(self, lease: Lease, error_json: bytes, retry_in: float | None) -> Task:
        keys = queue_keys(self._prefix, lease.queue).fail
        wait = "" if retry_in is None else retry_in
        args = (lease.task_id, lease.token, _nonce(), error_json, wait)
        reply = self._holder_write("fail", keys, lease, args)
        return task_from(lease.queue, reply[1])

    def release(self, lease: Lease, front: bool) -> None:
        keys = queue_keys(self._prefix, lease.queue).release
        args = (lease.task_id, lease.token, _nonce(), _flag(front))
        self._holder_write("release", keys, lease, args)

    def progress(
        self, lease: Lease, progress_json: bytes | None, checkpoint_json: bytes | None
    ) -> None:
        keys = queue_keys(self._prefix, lease.queue).progress
        args = (lease.task_id, lease.token, progress_json or b"", checkpoint_json or b"")
        self._holder_write("progress", keys, lease, args)

    def reap(self, queue: str, front: bool) -> list[Reaped]:
        keys = queue_keys(self._prefix, queue).reap
        reaped: list[Reaped] = []
        while True:  # one atomic step per CAP expired leases
            reply = self._link.script("reap", keys, (_flag(front), CAP), retry=True)
            reaped += reaped_from(queue, reply)
            if len(reply) < 3 * CAP:
                return reaped

    def get(self, task_id: str) -> Task:
        queue = self._link.command("HGET", self._ids, task_id)
        if queue is not None:
            name = queue.decode()
            reply = self._link.script(
                "get", queue_keys(self._prefix, name).get, (task_id,), retry=True
            )
            if reply is not None:
                return task_from(name, reply)
        raise UnknownTask(task_id)

    def stats(self, queue: str) -> QueueStats:
        keys = queue_keys(self._prefix, queue).stats
        reply = self._link.script("stats", keys, (), retry=True)
        if reply is None:
            raise UnknownQueue(queue)
        now = float(reply[0])
        counts = {s: n for s, n in zip(_STATE_NAMES, reply[1:7], strict=True) if n}
        oldest = None if reply[7] is None else max(0.0, now - float(reply[7]))
        if reply[8]:
            counts["parked"] = reply[8]
        if len(reply) > 10 and reply[10]:
            counts["cancelled"] = reply[10]
        hot = reply[9]  # partition, minus its parked tasks: most first, ties by name
        hot_partitions = tuple(
            (hot[i].decode(), -int(float(hot[i + 1]))) for i in range(0, len(hot), 2)
        )
        return QueueStats(queue, counts, oldest, now, hot_partitions)

    def queues(self) -> list[str]:
        names = self._link.command("SMEMBERS", self._queues)
        return sorted(n.decode() for n in names)

    def inspect(self, queue: str, limit: int) -> list[LeaseInfo]:
        reply = self._link.script(
            "inspect", queue_keys(self._prefix, queue).inspect, (limit,), retry=True
        )
        if reply is None:
            raise UnknownQueue(queue)
        return lease_infos_from(reply)

    def register_worker(self, worker_id: str, info_json: bytes, ttl: float) -> float:
        keys = worker_keys(self._prefix)
        reply = self._link.script(
            "workers_register", keys, (worker_id, info_json, repr(float(ttl))), retry=True
        )
        return float(reply)

    def workers(self) -> list[WorkerInfo]:
        reply = self._link.script("workers_list", worker_keys(self._prefix), (), retry=True)
        return workers_from(reply)

    def unregister_worker(self, worker_id: str) -> bool:
        keys = worker_keys(self._prefix)
        return bool(self._link.script("workers_unregister", keys, (worker_id,), retry=True))

    def dead(self, queue: str, limit: int) -> list[Task]:
        reply = self._link.script(
            "dead", queue_keys(self._prefix, queue).dead, (limit,), retry=True
        )
        if reply is None:
            raise UnknownQueue(queue)
        return [task_from(queue, t) for t in reply]

    def requeue_dead(self, queue: str, task_ids: Sequence[str] | None, front: bool) -> int:
        keys = queue_keys(self._prefix, queue).requeue_dead
        if task_ids is not None:
            args = (_flag(front), CAP, "ids", *task_ids)
            count = self._link.script("requeue_dead", keys, args, retry=False)
            if count is None:
                raise UnknownQueue(queue)
            return int(count)
        total = 0
        while True:  # one atomic step per CAP dead letters
            args = (_flag(front), CAP, "all")
            count = self._link.script("requeue_dead", keys, args, retry=False)
            if count is None:
                raise UnknownQueue(queue)
            total += int(count)
            if count < CAP:
                return total

    def purge_tasks(
        self,
        queue: str,
        state: FinishedState,
        older_than: float,
        limit: int,
    ) -> int:
        keys = queue_keys(self._prefix, queue)
        args = (state, older_than, limit, _nonce())
        purged, previous = self._link.script("purge", keys.purge[state], args, retry=True)
        freed = [*purged, *previous]  # the previous batch again: its client may have died
        if not freed:
            return 0
        # Step 2: free the ids in the global index (another slot). An id enqueued again to this
        # queue between the two steps has a task again: its entry is put back.
        tasks = keys.purge[state][0]
        replies = self._link.many(
            [("HDEL", self._ids, *freed), *(("HEXISTS", tasks, i) for i in freed)]
        )
        back = [i for i, there in zip(freed, replies[1:], strict=True) if there]
        if back:
            self._link.many([("HSET", self._ids, i, queue) for i in back])
        return len(purged)

    def list_tasks(
        self,
        queue: str,
        state: ListedState,
        limit: int,
        after: Key | None,
    ) -> tuple[list[Task], Key | None]:
        start = _cursor.key(after, str, str)  # the member (queued) or score, and the task id
        args = (state, limit, *(("", "") if start is None else start))
        keys = queue_keys(self._prefix, queue).listing[state]
        reply = self._link.script("list", keys, args, retry=True)
        tasks = [task_from(queue, reply[i]) for i in range(2, len(reply), 2)]
        if not reply[0] or not tasks:
            return tasks, None
        return tasks, [reply[-2].decode(), tasks[-1].id]

    def cancel(self, task_id: str, reason: str, error_json: bytes) -> Cancellation:
        queue = self._link.command("HGET", self._ids, task_id)
        if queue is not None:
            keys = queue_keys(self._prefix, queue.decode()).cancel
            reply = self._link.script("cancel", keys, (task_id, error_json), retry=True)
            if reply[0] != b"unknown":
                outcome, state = reply[0].decode(), reply[1].decode()
                return Cancellation(task_id, outcome, state, reason_of(reply[2]))
        raise UnknownTask(task_id)

    def delete_queue(self, queue: str, limit: int, force: bool) -> tuple[int, bool]:
        keys = queue_keys(self._prefix, queue).delete_queue
        # Not resent after a lost reply: a resend would delete another batch, and the ids of the
        # first would stay in the ids hash.
        reply = self._link.script("delete_queue", keys, (limit, _flag(force)), retry=False)
        if reply[0] == b"busy":
            raise QueueInUse(queue, reply[1])
        ids = reply[1:]
        calls: list[Call] = [
            ("HDEL", self._ids, *ids[i : i + 1000]) for i in range(0, len(ids), 1000)
        ]
        gone = reply[0] == b"gone"
        if gone:
            calls.append(("SREM", self._queues, queue))
        if calls:
            self._link.many(calls)
        return len(ids), gone

    def close(self) -> None:
        self._link.close()

    def wait_for_work(self, queue: str, timeout: float) -> None:
        """No notifications: wait out the timeout (the worker's poll interval)."""
        _redis_url.sync_sleep(timeout)

    def open_sync(self, *, call_timeout: float | None = None) -> _redis_url.SyncFace:
        """A synchronous backend with its own client on the same store (its socket timeouts
        no longer than ``call_timeout``)."""
        return _redis_url.twin_sync(_redis_url.bounded(self._options, call_timeout))

    def open_async(self) -> _redis_url.AsyncFace:
        """An asyncio backend with its own client on the same store."""
        return _redis_url.twin_async(self._options)


def _refusal(lease: Lease, reply: Any) -> LeaseLost | UnknownTask | None:
    """The error a holder write's reply stands for, or None if the write was applied."""
    if reply == 1 or reply[0] in (b"ok", b"replayed"):
        return None
    if reply[0] == b"unknown":
        return UnknownTask(lease.task_id)
    _, attempt, state, reason = reply
    if state == b"cancelled":  # the reason is read by the caller (see _with_reason)
        return TaskCancelled(
            lease.task_id, "cancelled", attempt=lease.attempt, current_attempt=attempt
        )
    return LeaseLost(lease.task_id, lease.attempt, attempt, state.decode(), reason=reason.decode())
