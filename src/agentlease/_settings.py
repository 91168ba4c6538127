"""Queue and idempotency settings: right defaults, nothing unbounded."""

from __future__ import annotations

from dataclasses import dataclass

from agentlease._codec import DEFAULT_MAX_BYTES
from agentlease._records import LeaseTerms
from agentlease._validate import duration, integer, optional_duration

__all__ = ["IdempotencySettings", "QueueSettings"]


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
    """

    lease_for: float = 30.0
    max_lease: float = 3600.0
    progress_timeout: float | None = None
    max_reclaims: int = 5
    reap_front: bool = True
    max_payload_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        duration(self.lease_for, "lease_for")
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
        purge_every: seconds between this client's purges of keys past the window (stores
            with their own expiry, such as Redis, need none).
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
