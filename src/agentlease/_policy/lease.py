"""Lease arithmetic shared by every backend that computes in Python (memory, SQLite).

Redis and PostgreSQL compute the same formulas inside their scripts and statements; the contract
suite holds all of them to these definitions.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["FRONT_OFFSET", "front_seq", "is_live", "lease_expiry", "lost_reason", "reap_outcome"]

# Sequence numbers order tasks of one priority. A task sent to the front keeps its relative order
# among other front tasks by subtracting a constant far larger than any sequence ever issued.
FRONT_OFFSET = 1 << 62


def lease_expiry(
    now: float,
    lease_for: float,
    deadline: float,
    progressed_at: float,
    progress_timeout: float | None,
) -> float:
    """The expiry of a lease claimed or extended at ``now``.

    Never past the lease's total deadline, nor past the progress deadline when one is set.
    """
    expiry = min(now + lease_for, deadline)
    if progress_timeout is not None:
        expiry = min(expiry, progressed_at + progress_timeout)
    return expiry


def is_live(now: float, expires_at: float) -> bool:
    """A lease is live strictly before its expiry; at the instant of expiry it is gone."""
    return now < expires_at


def reap_outcome(reclaims: int, max_reclaims: int) -> Literal["requeued", "dead"]:
    """What to do with a task whose lease expired, given its expiries so far (this one included)."""
    return "dead" if reclaims > max_reclaims else "requeued"


def front_seq(seq: int) -> int:
    """The sequence number that puts a task ahead of every task not yet sent to the front."""
    return seq - FRONT_OFFSET if seq >= 0 else seq


def lost_reason(state: str, token_matches: bool, live: bool) -> str:
    """Why a holder write was fenced off, for :class:`~agentlease.errors.LeaseLost`."""
    if state != "leased":
        return f"task is {state}"
    if not token_matches:
        return "token replaced"
    if not live:
        return "lease expired"
    return "lease no longer held"
