# Generated from agentlease/_async/queue.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""The client of the leased work queue: enqueue, claim, extend, complete, fail, release.

Written once for asyncio; the synchronous face is generated from this file by scripts/unasync.py.

Validation, JSON encoding, events and retry arithmetic happen here, once, above the storage seam;
the backend performs each primitive as one atomic step on the store.
"""

from __future__ import annotations

import traceback
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from types import TracebackType

from agentlease import _clock, _cursor, _telemetry
from agentlease import _validate as check
from agentlease._codec import JSON, encode
from agentlease._deadline import current_deadline, current_root
from agentlease._events import Event, Events
from agentlease._records import (
    FINISHED,
    LISTED,
    Cancellation,
    Enqueued,
    FinishedState,
    Job,
    Lease,
    LeaseInfo,
    ListedState,
    NewTask,
    QueueStats,
    Reaped,
    Task,
    TaskSpec,
    WorkerInfo,
    cancel_error,
    encode_context,
)
from agentlease._settings import QueueSettings
from agentlease.backends import Backend, connect
from agentlease.errors import (
    InvalidInput,
    LeaseLost,
    ToolUnavailable,
    UnknownQueue,
    UnknownTask,
)

# The stored error keeps this much of a message and of the end of a traceback (characters).
MAX_MESSAGE = 4000
MAX_TRACEBACK = 8000

__all__ = ["Queue"]


class Queue:
    """A client of the leased work queue on one store.

    Args:
        backend: the store (see :func:`agentlease.connect`).
        settings: leasing and limits; the defaults suit most agents.
        on_event: called with every :class:`~agentlease.Event` this client sees.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        settings: QueueSettings | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.backend = backend
        self.settings = settings or QueueSettings()
        self.events = Events(on_event)
        self._terms = self.settings.terms()

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        settings: QueueSettings | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> Queue:
        """Open a queue client on the store named by ``url`` (``sqlite:///tasks.db``, ...)."""
        return cls(connect(url), settings=settings, on_event=on_event)

    def __enter__(self) -> Queue:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the store's connections."""
        self.backend.close()

    # -- producing ------------------------------------------------------------------------------

    def _new_task(self, queue: str, spec: TaskSpec) -> NewTask:
        """The validated, encoded task (without its context: see :meth:`_with_context`)."""
        task_id = uuid.uuid4().hex if spec.id is None else check.task_id(spec.id)
        if spec.dedup_key is not None and (
            not isinstance(spec.dedup_key, str) or not 0 < len(spec.dedup_key) <= 500
        ):
            raise InvalidInput("dedup_key must be a str of 1 to 500 characters")
        return NewTask(
            id=task_id,
            queue=queue,
            payload_json=encode(spec.payload, limit=self.settings.max_payload_bytes),
            priority=check.integer(spec.priority, "priority", low=-(2**31), high=2**31 - 1),
            delay=check.non_negative(spec.delay, "delay"),
            dedup_key=spec.dedup_key,
            max_reclaims=self.settings.max_reclaims,
            partition=None if spec.partition is None else check.partition(spec.partition),
        )

    def _enqueue(
        self, queue: str, tasks: list[NewTask], specs: Sequence[TaskSpec]
    ) -> list[Enqueued]:
        """Write the tasks with their context, in a span of their own when traced (the span's
        trace context is stored in each task's context)."""
        telemetry = _telemetry.current()
        if telemetry is None:
            return self.backend.enqueue(self._with_context(tasks, specs))
        with telemetry.enqueuing(queue, tasks) as trace:
            results = self.backend.enqueue(self._with_context(tasks, specs, trace))
            telemetry.enqueued(queue, results)
        return results

    def _with_context(
        self,
        tasks: list[NewTask],
        specs: Sequence[TaskSpec],
        trace: dict[str, str] | None = None,
    ) -> list[NewTask]:
        """The tasks with the context they inherit from the code enqueueing them.

        The root: the root task of the handler running now (none outside a handler: each task
        is its own root). The deadline: the earliest of the deadline in force (monotonic) and
        each spec's own ``deadline`` (seconds from now), turned into an absolute time on the
        store's clock with the offset the worker measured at the claim, or else with one
        :meth:`now` of the store for the whole call. The trace: ``trace`` (the W3C trace
        context of the enqueue's span), if given.
        """
        work = current_root()
        root = None if work is None else work.root
        inherited = current_deadline()
        start = _clock.monotonic()
        deadlines: list[float | None] = []
        timeouts: list[float | None] = []
        for spec in specs:
            at = inherited
            if spec.deadline is not None:
                own = start + check.duration(spec.deadline, "deadline")
                at = own if at is None else min(at, own)
            deadlines.append(at)
            timeouts.append(
                None if spec.timeout is None else check.duration(spec.timeout, "timeout")
            )
        if root is None and all(at is None for at in deadlines) and not any(timeouts) and not trace:
            return tasks
        offset = None if work is None else work.store_offset
        if offset is None and any(at is not None for at in deadlines):
            store_now = self.backend.now()
            offset = store_now - _clock.monotonic()
        out: list[NewTask] = []
        for task, at, timeout in zip(tasks, deadlines, timeouts, strict=True):
            store_at = None if at is None or offset is None else at + offset
            context = encode_context(root, store_at, timeout, trace)
            out.append(replace(task, context_json=context))
        return out

    def enqueue(
        self,
        queue: str,
        payload: JSON = None,
        *,
        id: str | None = None,
        priority: int = 0,
        delay: float = 0.0,
        dedup_key: str | None = None,
        partition: str | None = None,
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> Enqueued:
        """Add one task.

        Inside a handler the task inherits the running task's root task and the deadline in
        force (:func:`agentlease.deadline`, or the one the running task carries); it keeps them
        through retries and reclaims. The deadline is stored as an absolute time on the store's
        clock, so workers on machines whose clocks disagree agree on it. A task whose deadline
        has already passed is still enqueued: no worker runs it, the first to claim it
        dead-letters it with reason ``deadline`` (so that the tree's end shows in the dead
        letters instead of vanishing, and a caller racing the deadline needs no special case).

        Args:
            queue: the queue's name.
            payload: any JSON value.
            id: a caller-given id; enqueueing an id that exists creates nothing.
            priority: higher runs first.
            delay: seconds before it may run.
            dedup_key: a second task with this key in this queue creates nothing.
            partition: the resource the task writes to: while a task of the partition is
                unfinished, later ones wait ``parked``, so one resource has one writer at a
                time (in enqueue order) and different resources run in parallel.
            deadline: seconds from now by which the task's whole tree of work must end (the
                earlier of this and the deadline in force wins). A deadline ends the tree: a
                task past it is dead-lettered, not retried.
            timeout: the time limit of each attempt in seconds (default: the worker's
                ``task_timeout``): past it the handler is cancelled and the attempt fails with
                :class:`~agentlease.errors.TaskTimeout`, retried per the retry policy.

        Returns:
            The task's id, and whether it was created (``False``: it existed already).

        Raises:
            InvalidName: bad queue name or id.
            InvalidDuration: ``deadline`` is not a positive finite number.
            NotJSON, PayloadTooLarge: the payload was refused; nothing was written.
        """
        spec = TaskSpec(
            payload=payload,
            id=id,
            priority=priority,
            delay=delay,
            dedup_key=dedup_key,
            partition=partition,
            deadline=deadline,
            timeout=timeout,
        )
        queue = check.queue_name(queue)
        (result,) = self._enqueue(queue, [self._new_task(queue, spec)], [spec])
        return result

    def enqueue_many(self, queue: str, tasks: Iterable[TaskSpec | JSON]) -> list[Enqueued]:
        """Add many tasks in one atomic step: all are written or, on a refusal, none.

        Each item is a :class:`TaskSpec` or a bare JSON payload. The tasks inherit the root task
        and deadline in force, as with :meth:`enqueue` (the store's clock is read at most once
        for the whole call).
        """
        queue = check.queue_name(queue)
        specs = [
            t if isinstance(t, TaskSpec) else TaskSpec(payload=t)
            for t in check.items(tasks, "tasks")
        ]
        if not specs:
            return []
        return self._enqueue(queue, [self._new_task(queue, spec) for spec in specs], specs)

    # -- consuming ------------------------------------------------------------------------------

    def claim(
        self,
        queue: str,
        n: int = 1,
        *,
        lease_for: float | None = None,
        holder: str | None = None,
    ) -> list[Job]:
        """Lease up to ``n`` ready tasks in one atomic step (reaping expired leases on the way).

        Args:
            queue: the queue's name (an unknown queue has nothing to claim).
            n: the most tasks to lease.
            lease_for: seconds until the leases expire unless extended (default: settings).
            holder: who claims (a worker's id): recorded with each lease (``inspect`` shows it)
                and in each task's attempt history.

        Returns:
            The leased jobs, highest priority first; empty when nothing is ready.
        """
        terms = self._terms
        if lease_for is not None:
            terms = self.settings.terms(check.duration(lease_for, "lease_for"))
        if holder is not None:
            terms = replace(terms, holder=check.worker_id(holder))
        jobs, reaped = self.backend.claim(check.queue_name(queue), check.batch_size(n), terms)
        if reaped:
            self._emit_reaped(reaped)
        return jobs

    def extend(
        self, leases: Sequence[Lease], *, lease_for: float | None = None
    ) -> list[Lease | None]:
        """Extend many leases in one atomic step.

        Returns:
            For each lease, in order, the renewed lease or ``None`` if it is no longer held.
        """
        seconds = self.settings.lease_for if lease_for is None else lease_for
        leases = [check.lease(lease) for lease in check.items(leases, "leases")]
        renewed = self.backend.extend(leases, check.duration(seconds, "lease_for"))
        for old, new in zip(leases, renewed, strict=True):
            if new is None:
                self.events.emit(
                    "zombie_rejected", old.queue, old.task_id, old.attempt, write="extend"
                )
        return renewed

    def complete(self, lease: Lease, result: JSON = None) -> None:
        """Mark the task done with its result, fenced by the lease.

        Raises:
            NotJSON, PayloadTooLarge: the result was refused; the lease is still held.
            LeaseLost: the lease is no longer held; nothing changed.
        """
        lease = check.lease(lease)
        data = (
            None
            if result is None
            else encode(result, what="result", limit=self.settings.max_payload_bytes)
        )
        try:
            self.backend.complete(lease, data)
        except LeaseLost as exc:
            self._rejected(lease, "complete", exc)
            raise

    def encode_result(self, result: JSON) -> bytes | None:
        """A handler's result as :meth:`complete` stores it (``None`` stays ``None``).

        Raises:
            NotJSON, PayloadTooLarge: the result cannot be stored.
        """
        if result is None:
            return None
        return encode(result, what="result", limit=self.settings.max_payload_bytes)

    def complete_encoded(
        self, items: Sequence[tuple[Lease, bytes | None]]
    ) -> list[LeaseLost | UnknownTask | None]:
        """:meth:`complete_many` for results already passed through :meth:`encode_result`."""
        if not items:
            return []
        for lease, _ in items:
            check.lease(lease)
        outcomes = self.backend.complete_many(items)
        for (lease, _), outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, LeaseLost):
                self._rejected(lease, "complete", outcome)
        return outcomes

    def complete_encoded_and_claim(
        self,
        items: Sequence[tuple[Lease, bytes | None]],
        queue: str,
        n: int,
        *,
        holder: str | None = None,
    ) -> tuple[list[LeaseLost | UnknownTask | None], list[Job]]:
        """:meth:`complete_encoded`, then :meth:`claim` of up to ``n`` tasks of ``queue``, in
        as few round trips as the store allows (one transaction on SQLite and PostgreSQL)."""
        for lease, _ in items:
            check.lease(lease)
        terms = self._terms
        if holder is not None:
            terms = replace(terms, holder=check.worker_id(holder))
        outcomes, jobs, reaped = self.backend.complete_and_claim(
            items, check.queue_name(queue), check.batch_size(n), terms
        )
        for (lease, _), outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, LeaseLost):
                self._rejected(lease, "complete", outcome)
        if reaped:
            self._emit_reaped(reaped)
        return outcomes, jobs

    def complete_many(
        self, items: Iterable[tuple[Lease, JSON]]
    ) -> list[LeaseLost | UnknownTask | None]:
        """Complete many leases in one round trip; each is fenced and applied on its own.

        Args:
            items: ``(lease, result)`` pairs.

        Returns:
            Per item, in order: ``None`` if accepted, else the refusal (``LeaseLost`` for a lease
            no longer held, ``UnknownTask``); refused items changed nothing.

        Raises:
            NotJSON, PayloadTooLarge: a result was refused; nothing was written.
        """
        pairs = [_pair(item) for item in check.items(items, "items")]
        return self.complete_encoded(
            [(lease, self.encode_result(result)) for lease, result in pairs]
        )

    def fail(
        self,
        lease: Lease,
        error: BaseException | str,
        *,
        retry_in: float | None,
        reason: str | None = None,
    ) -> Task:
        """Record that the handler raised: retry after ``retry_in`` seconds, or dead-letter
        (``retry_in=None``). Fenced by the lease.

        The error is stored as ``{"type", "message"}``, plus ``"reason"``: the ``reason``
        given (why the task was given up on, e.g. ``"deadline"``), or else that of a
        :class:`~agentlease.errors.ToolUnavailable` error (``DeadlineExceeded``: ``"deadline"``).

        Returns:
            The task as it now stands (``failed`` awaiting retry, or ``dead``).
        """
        lease = check.lease(lease)
        if retry_in is not None:
            retry_in = check.non_negative(retry_in, "retry_in")
        described = _describe(error)
        if reason is not None:
            described["reason"] = str(reason)
        data = encode(described, what="error", limit=self.settings.max_payload_bytes)
        try:
            task = self.backend.fail(lease, data, retry_in)
        except LeaseLost as exc:
            self._rejected(lease, "fail", exc)
            raise
        if task.state == "dead":
            why = {"reason": described["reason"]} if "reason" in described else {}
            self.events.emit(
                "dead_lettered",
                lease.queue,
                lease.task_id,
                lease.attempt,
                error=_headline(described),
                exc_info=error,
                **why,
            )
        else:
            self.events.emit(
                "failed",
                lease.queue,
                lease.task_id,
                lease.attempt,
                retry_in=retry_in,
                error=_headline(described),
                exc_info=error,
            )
        return task

    def release(self, lease: Lease, *, front: bool = True) -> None:
        """Give the task back unrun (not counted as a failure or a reclaim), fenced."""
        lease, front = check.lease(lease), check.flag(front, "front")
        try:
            self.backend.release(lease, front)
        except LeaseLost as exc:
            self._rejected(lease, "release", exc)
            raise
        self.events.emit("released", lease.queue, lease.task_id, lease.attempt, front=front)

    def progress(self, lease: Lease, value: JSON = None, *, checkpoint: JSON = None) -> None:
        """Record progress (and a checkpoint to resume from, if given), fenced.

        Progress resets the progress deadline when the queue has a ``progress_timeout``.
        """
        lease = check.lease(lease)
        limit = self.settings.max_payload_bytes
        progress = None if value is None else encode(value, what="progress", limit=limit)
        saved = None if checkpoint is None else encode(checkpoint, what="checkpoint", limit=limit)
        try:
            self.backend.progress(lease, progress, saved)
        except LeaseLost as exc:
            self._rejected(lease, "progress", exc)
            raise

    def reap(self, queue: str) -> list[Reaped]:
        """Requeue (or dead-letter) every expired lease of the queue now."""
        reaped = self.backend.reap(check.queue_name(queue), self.settings.reap_front)
        self._emit_reaped(reaped)
        return reaped

    # -- reading and administration -----------------------------------------------------------

    def get(self, task_id: str) -> Task:
        """One task as the store holds it; raises UnknownTask."""
        return self.backend.get(check.task_id(task_id))

    def stats(self, queue: str) -> QueueStats:
        """Counts by state and the oldest queued age; raises UnknownQueue."""
        return self.backend.stats(check.queue_name(queue))

    def queues(self) -> list[str]:
        """Every queue ever enqueued to."""
        return self.backend.queues()

    def inspect(self, queue: str, *, limit: int = 100) -> list[LeaseInfo]:
        """Live leases, soonest expiry first; raises UnknownQueue."""
        return self.backend.inspect(check.queue_name(queue), check.batch_size(limit))

    def register_worker(self, worker_id: str, info: dict[str, JSON], *, ttl: float) -> float:
        """Write (or refresh) a live worker's entry, listed for ``ttl`` seconds on the store's
        clock unless registered again; lapsed entries of other workers are collected.

        Args:
            worker_id: the worker's id (1 to 200 characters, e.g. ``host:pid:random``).
            info: what :meth:`workers` shows of it: ``host``, ``pid``, ``queues``,
                ``concurrency``, ``started``, ``tasks`` (JSON).
            ttl: seconds the entry lives.

        Returns:
            When the entry lapses, on the store's clock.
        """
        data = encode(info, limit=self.settings.max_payload_bytes)
        return self.backend.register_worker(
            check.worker_id(worker_id), data, check.duration(ttl, "ttl")
        )

    def workers(self) -> list[WorkerInfo]:
        """The live workers of the store (entries whose TTL has not passed), by id."""
        return self.backend.workers()

    def unregister_worker(self, worker_id: str) -> bool:
        """Remove a worker's entry (a clean shutdown); whether it was there."""
        return self.backend.unregister_worker(check.worker_id(worker_id))

    def dead(self, queue: str, *, limit: int = 100) -> list[Task]:
        """Dead-lettered tasks, most recent first; raises UnknownQueue."""
        return self.backend.dead(check.queue_name(queue), check.batch_size(limit))

    def requeue_dead(
        self, queue: str, task_ids: Sequence[str] | None = None, *, front: bool = False
    ) -> int:
        """Requeue dead tasks (all of the queue's by default) with fresh budgets.

        Returns:
            How many were requeued.
        """
        ids = None if task_ids is None else [check.task_id(t) for t in check.items(task_ids, "ids")]
        return self.backend.requeue_dead(
            check.queue_name(queue), ids, check.flag(front, "front")
        )

    def purge(
        self,
        queue: str,
        *,
        state: FinishedState = "done",
        older_than: float | None = None,
        limit: int = 1000,
    ) -> int:
        """Delete up to ``limit`` of the queue's oldest ``done`` (``dead``, ``cancelled``) tasks
        that finished at least ``older_than`` seconds ago, in one atomic step; workers do this on a
        timer (``WorkerSettings.purge_every``). A purged task's id and dedup key are free again.

        Args:
            queue: the queue.
            state: ``"done"``, ``"dead"`` or ``"cancelled"``.
            older_than: seconds since the task finished (store clock); default: the settings'
                ``done_retention``, or ``dead_retention`` for dead and cancelled tasks. Any value
                >= 0 is taken, 0 too (every finished task): below
                :data:`~agentlease._settings.MIN_RETENTION` a worker whose final write's reply
                was lost may not find its task to check it.
            limit: the most tasks deleted (1 to 10,000); call again while it returns ``limit``.

        Returns:
            How many tasks were deleted (0 for a queue never enqueued to).
        """
        if state not in FINISHED:
            raise InvalidInput(f"state must be one of {', '.join(FINISHED)}, not {state!r}")
        if older_than is None:
            s = self.settings
            seconds = s.done_retention if state == "done" else s.dead_retention
        else:
            seconds = check.non_negative(older_than, "older_than")
        return self.backend.purge_tasks(
            check.queue_name(queue), state, seconds, check.batch_size(limit)
        )

    def tasks(
        self,
        queue: str,
        *,
        state: ListedState = "queued",
        limit: int = 100,
        cursor: str | None = None,
    ) -> tuple[list[Task], str | None]:
        """One page of the queue's tasks in ``state``, read through that state's index.

        Args:
            queue: the queue.
            state: ``"queued"`` (in claim order), ``"leased"`` (soonest expiry first),
                ``"done"`` or ``"dead"`` (most recently finished first).
            limit: the most tasks on the page (1 to 10,000).
            cursor: where the page starts: ``None`` for the first, else the cursor the previous
                page returned.

        Returns:
            The tasks, and the cursor of the next page (``None`` when this one is the last).
            Each page is one snapshot; a task that changes state between pages may be missed
            or listed twice.
        """
        if state not in LISTED:
            raise InvalidInput(
                f"state must be one of {', '.join(LISTED)} (each has an index), not {state!r}"
            )
        after = None if cursor is None else _cursor.decode(cursor, state)
        tasks, key = self.backend.list_tasks(
            check.queue_name(queue), state, check.batch_size(limit), after
        )
        return tasks, None if key is None else _cursor.encode(state, key)

    def cancel(self, task_id: str, reason: str = "cancelled") -> Cancellation:
        """Cancel a task, in one atomic step on the store.

        A task that waits (queued, scheduled, failed waiting for its retry, parked) becomes
        ``cancelled`` at once, with ``reason`` and ``finished_at``, and frees its partition as a
        completion does. A leased task is flagged: its holder's writes (complete, fail, release,
        progress, checkpoint) are refused from now on with
        :class:`~agentlease.errors.TaskCancelled`, its worker learns it at its next heartbeat
        and cancels the handler, and the task ends ``cancelled`` then (or when the reaper finds
        its lease run out, if the holder is gone: never requeued). A task that has already
        ended (done, dead, cancelled) is left as it is: the outcome says ``finished``.

        Args:
            task_id: the task.
            reason: why, 1 to 1000 characters on one line; kept with the task (a reason asked
                for earlier wins).

        Returns:
            What happened: ``outcome`` ``cancelled``, ``requested`` or ``finished``.

        Raises:
            UnknownTask: no task has that id.
            InvalidInput: a bad id or reason (nothing changed).
        """
        task_id, reason = check.task_id(task_id), check.reason(reason)
        return self.backend.cancel(task_id, reason, cancel_error(reason))

    def delete_queue(self, queue: str, *, force: bool = False, batch: int = 1000) -> int:
        """Delete every task of a queue and the queue itself, in atomic batches of ``batch``
        tasks (so a queue of a million tasks never takes one giant step).

        Workers of the queue should be stopped first. Unless ``force``, a batch that finds a
        live lease in the queue raises :class:`~agentlease.errors.QueueInUse` and deletes
        nothing (earlier batches stay deleted). With ``force``, leased tasks are deleted too:
        their holders' later writes are refused (the task is unknown to the store).

        Returns:
            How many tasks were deleted.

        Raises:
            UnknownQueue: nothing was ever enqueued to that queue.
            QueueInUse: a live lease was found and ``force`` is false.
            InvalidInput: a bad queue name or batch size (nothing changed).
        """
        queue = check.queue_name(queue)
        force = check.flag(force, "force")
        batch = check.batch_size(batch)
        if queue not in self.backend.queues():
            raise UnknownQueue(queue)
        total = 0
        while True:
            deleted, gone = self.backend.delete_queue(queue, batch, force)
            total += deleted
            if gone:
                return total

    # -- events ---------------------------------------------------------------------------------

    def _emit_reaped(self, reaped: list[Reaped]) -> None:
        for r in reaped:
            self.events.emit("reaped", r.queue, r.task_id, r.attempt, outcome=r.outcome)
            if r.outcome == "dead":
                self.events.emit("dead_lettered", r.queue, r.task_id, r.attempt, reason="reclaims")

    def _rejected(self, lease: Lease, write: str, exc: LeaseLost) -> None:
        self.events.emit(
            "zombie_rejected",
            lease.queue,
            lease.task_id,
            lease.attempt,
            write=write,
            current_attempt=exc.current_attempt,
            reason=exc.reason,
        )


def _pair(item: object) -> tuple[Lease, JSON]:
    if not isinstance(item, tuple | list) or len(item) != 2:
        raise InvalidInput(f"complete_many takes (lease, result) pairs, not {type(item).__name__}")
    return item[0], item[1]


def _headline(described: dict[str, JSON]) -> str:
    """``Type: message`` of a stored error, for a log line."""
    return f"{described['type']}: {described['message']}"


def _bounded(text: str, limit: int) -> str:
    """``text``, or its last ``limit`` characters after a mark that some were cut."""
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _describe(error: BaseException | str) -> dict[str, JSON]:
    """The stored error: type, message and (for an exception) the end of its traceback."""
    if isinstance(error, str):
        return {"type": "Error", "message": _bounded(error, MAX_MESSAGE)}
    described: dict[str, JSON] = {
        "type": type(error).__qualname__,
        "message": _bounded(str(error), MAX_MESSAGE),
    }
    if error.__traceback__ is not None:
        lines = traceback.format_exception(error)
        described["traceback"] = _bounded("".join(lines), MAX_TRACEBACK)
    if isinstance(error, ToolUnavailable):
        described["reason"] = error.reason
    return described
