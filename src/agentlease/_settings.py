"""Queue, worker and idempotency settings: right defaults, nothing unbounded."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentlease._codec import DEFAULT_MAX_BYTES
from agentlease._policy.retry import RetryPolicy
from agentlease._records import LeaseTerms
from agentlease._validate import duration, integer, non_negative, optional_duration
from agentlease.errors import RetentionTooShort, WorkerError

__all__ = [
    "MIN_RETENTION",
    "IdempotencySettings",
    "QueueSettings",
    "WorkerSettings",
    "heartbeat_interval",
]

MIN_RETENTION = 60.0
"""The shortest retention of finished tasks a queue accepts (seconds), and never less than the
lease: a worker whose final write's reply was lost reads the task back to see whether the write
was applied (``FinalWrites._applied``), for as long as it holds the lease, so the record must
outlive that check. ``AsyncQueue.purge`` takes any ``older_than`` (0 too: tests, soaks and
administrators who know no worker is running)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueSettings:
    """How a queue client leases, reaps and limits.

    Attributes:
        lease_for: seconds a claim holds its task unless extended (the worker heartbeats every
            third of it).
        max_lease: the longest a lease may be held in total, however often it is extended.
        progress_timeout: if set, a lease with no progress for this long stops being extended
            and is reaped: an alive-but-looping agent cannot hold a task forever.
        max_reclaims: expiries a task survives; one more dead-letters it with the reason.
        reap_front: reaped tasks go to the front of their priority (``False``: to the back).
        max_payload_bytes: the largest encoded payload, result, progress value or checkpoint.
        done_retention: seconds a done task (and its result) is kept after it finished; then
            workers purge it, freeing its id and its dedup key: a task's dedup window is its
            retention. At least :data:`MIN_RETENTION` and ``lease_for``, else
            :class:`~agentlease.errors.RetentionTooShort`.
        dead_retention: the same for dead letters and cancelled tasks (default 30 days: time to
            look at them and requeue the dead ones).
    """

    lease_for: float = 30.0
    max_lease: float = 3600.0
    progress_timeout: float | None = None
    max_reclaims: int = 5
    reap_front: bool = True
    max_payload_bytes: int = DEFAULT_MAX_BYTES
    done_retention: float = 7 * 86_400.0
    dead_retention: float = 30 * 86_400.0

    def __post_init__(self) -> None:
        duration(self.lease_for, "lease_for")
        floor = max(MIN_RETENTION, self.lease_for)
        for what in ("done_retention", "dead_retention"):
            given = duration(getattr(self, what), what)
            if given < floor:
                raise RetentionTooShort(what, given, floor)
        duration(self.max_lease, "max_lease")
        optional_duration(self.progress_timeout, "progress_timeout")
        integer(self.max_reclaims, "max_reclaims", low=0, high=1_000_000)
        integer(self.max_payload_bytes, "max_payload_bytes", low=16, high=512 * 1024 * 1024)

    def terms(self, lease_for: float | None = None) -> LeaseTerms:
        """The lease terms of one claim."""
        return LeaseTerms(
            lease_for=self.lease_for if lease_for is None else lease_for,
            max_total=self.max_lease,
            progress_timeout=self.progress_timeout,
            reap_front=self.reap_front,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class IdempotencySettings:
    """How idempotent actions hold their keys and how long outcomes are kept.

    Attributes:
        window: seconds an outcome (result or permanent failure) is replayed after it was
            recorded; past it the key is purged and the same action would run again.
        hold_for: the in-flight lease of a reservation, renewed every third of it while the
            action runs. A holder that crashes is taken over this long after its last renewal.
        max_result_bytes: the largest encoded result; a larger one is refused (and stored as a
            permanent failure, since the side effect did happen).
        purge_every: seconds between this client's purges of keys past the window: a use of the
            client (a new reservation or a replay) purges when one is due, and every use purges
            again while a purge finds a full batch (stores with their own expiry, such as
            Redis, need none).
        purge_batch: the most keys one purge deletes.
    """

    window: float = 86_400.0
    hold_for: float = 30.0
    max_result_bytes: int = DEFAULT_MAX_BYTES
    purge_every: float = 60.0
    purge_batch: int = 1000

    def __post_init__(self) -> None:
        duration(self.window, "window")
        duration(self.hold_for, "hold_for")
        duration(self.purge_every, "purge_every")
        integer(self.max_result_bytes, "max_result_bytes", low=16, high=512 * 1024 * 1024)
        integer(self.purge_batch, "purge_batch", low=1, high=1_000_000)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    """How a worker runs.

    Attributes:
        concurrency: handlers running at once.
        batch: claim up to all free slots in one step, and send the completions of handlers
            that return while a write is in flight together in the next one, before the next
            claim (``False``: one task per claim, one completion per write).
        prefetch: the most tasks claimed ahead of a free slot, to start as soon as a handler
            returns (default: as many as ``concurrency``; 0: none). Tasks are claimed ahead only
            while recent handlers took less than 50 ms each: a prefetched task holds its lease
            (kept alive by the heartbeat) while it waits, so long tasks are never held back
            from other workers. Shutdown gives unstarted tasks back to the front of the queue.
        retry: what happens when a handler raises.
        poll_interval: the longest idle wait between claims on an empty queue (seconds).
        shutdown_grace: seconds running handlers get to finish after a stop.
        heartbeat_interval: seconds between heartbeats (default: a third of the shorter of
            the lease and the queue's ``progress_timeout``). It must leave at least two beats
            in each of them, or the worker refuses to start with :class:`WorkerError`.
        seed: seeds the jitter of backoff and heartbeats (for reproducible runs).
        task_timeout: the time limit of each attempt in seconds, for tasks enqueued without a
            ``timeout`` of their own (``None``: no limit). Past it an async handler is
            cancelled, a sync one sees ``ctx.cancelled`` (its result is not accepted), and the
            attempt fails with :class:`~agentlease.errors.TaskTimeout`, retried per ``retry``.
        purge_every: seconds between this worker's rounds of purging (``None``: it purges
            nothing): done and dead tasks of its queue past the queue's retention, idempotency
            keys past their window, expired lock leases, retry budgets and circuit breakers.
            Every round is bounded batches, each one atomic step; several workers purging the
            same store share the work.
        purge_batch: the most tasks (or keys, ...) one purge step deletes (1 to 10,000); a
            round takes up to 10 full batches of each kind, then waits for the next.
    """

    concurrency: int = 1
    batch: bool = True
    prefetch: int | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    poll_interval: float = 0.5
    shutdown_grace: float = 30.0
    heartbeat_interval: float | None = None
    seed: int | None = None
    task_timeout: float | None = None
    purge_every: float | None = 60.0
    purge_batch: int = 1000

    def __post_init__(self) -> None:
        optional_duration(self.purge_every, "purge_every")
        integer(self.purge_batch, "purge_batch", low=1, high=10_000)
        integer(self.concurrency, "concurrency", low=1, high=10_000)
        optional_duration(self.task_timeout, "task_timeout")
        if self.prefetch is not None:
            integer(self.prefetch, "prefetch", low=0, high=10_000)
        duration(self.poll_interval, "poll_interval")
        non_negative(self.shutdown_grace, "shutdown_grace")
        optional_duration(self.heartbeat_interval, "heartbeat_interval")


def heartbeat_interval(worker: WorkerSettings, queue: QueueSettings) -> float:
    """Seconds between heartbeats: a third of the shorter of the lease and the progress timeout,
    so a task that reports progress stays alive whatever the two settings are.

    Raises:
        WorkerError: an explicit interval leaves fewer than two beats in the lease or in the
            progress timeout.
    """
    window = queue.lease_for
    if queue.progress_timeout is not None:
        window = min(window, queue.progress_timeout)
    if worker.heartbeat_interval is None:
        return window / 3
    if worker.heartbeat_interval * 2 > window:
        raise WorkerError(
            f"heartbeat_interval={worker.heartbeat_interval:g}s cannot keep a lease alive: "
            f"it must be at most half of lease_for ({queue.lease_for:g}s)"
            + (
                f" and of progress_timeout ({queue.progress_timeout:g}s)"
                if queue.progress_timeout is not None
                else ""
            )
        )
    return worker.heartbeat_interval
