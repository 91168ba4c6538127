"""Retry budgets and circuit breakers as stored rows, and each primitive's step on them: the
decisions of ``retry_budget``, ``breaker_admit`` and ``breaker_record`` (see
:mod:`agentlease.backends.base`) as pure functions of the live row and the store's ``now``.

The memory and SQLite backends run these inside their one atomic step (the memory backend's
lock, one ``BEGIN IMMEDIATE`` transaction); the Redis scripts (``lua/budget_*.lua``,
``lua/breaker_*.lua``) and the PostgreSQL functions (``sql/postgres_migrations/0007_budgets.sql``)
decide the same way in their own language. A row whose ``expires_at`` has passed counts as absent
(:func:`live`). Each step returns the row to write (``None``: write nothing) and the state to
report.

A breaker row keeps one time, ``until``: the end of the cool-down while open, the end of the
trial's turn while half-open (closed: 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from agentlease._records import BreakerState, BreakerStatus, BudgetState

__all__ = [
    "BreakerRow",
    "BudgetRow",
    "admit_step",
    "breaker_view",
    "budget_step",
    "live",
    "record_step",
]


@dataclass(frozen=True, slots=True)
class BudgetRow:
    """A retry budget as stored."""

    calls: int
    retries: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class BreakerRow:
    """A circuit breaker as stored."""

    state: BreakerStatus
    failures: int
    fence: int
    until: float
    expires_at: float


Row = TypeVar("Row", BudgetRow, BreakerRow)


def live(row: Row | None, now: float) -> Row | None:
    """``row``, or ``None`` if it is absent or has expired by ``now``."""
    return None if row is None or row.expires_at <= now else row


def budget_step(
    row: BudgetRow | None,
    now: float,
    calls: int,
    retry: bool,
    ratio: float,
    minimum: int,
    ttl: float,
) -> tuple[BudgetRow | None, BudgetState]:
    """``retry_budget`` on the live ``row``: add ``calls`` (a negative count adds nothing), then
    grant one retry iff ``retries < minimum`` or ``retries < calls * ratio``, the two halves of
    ``max(minimum, calls * ratio)`` compared apart, so that an odd ratio (NaN) grants no more
    than ``minimum`` on every store. Writes only when a count changed."""
    total = (0 if row is None else row.calls) + max(calls, 0)
    retries = 0 if row is None else row.retries
    granted = retry and (retries < minimum or retries < total * ratio)
    if granted:
        retries += 1
    state = BudgetState(total, retries, granted)
    if calls <= 0 and not granted:
        return None, state
    return BudgetRow(total, retries, now + ttl), state


def breaker_view(row: BreakerRow | None, now: float) -> BreakerState:
    """The state ``row`` stands for at ``now`` (absent: closed), with no trial granted."""
    if row is None:
        return BreakerState("closed", 0, 0, 0.0, False)
    wait = max(row.until - now, 0.0) if row.state != "closed" else 0.0
    return BreakerState(row.state, row.failures, row.fence, wait, False)


def admit_step(
    row: BreakerRow | None, now: float, trial_for: float, ttl: float
) -> tuple[BreakerRow | None, BreakerState]:
    """``breaker_admit`` on the live ``row``: a closed breaker, an open one still cooling down
    and a half-open one with a live trial are read, not written; an open breaker past its
    cool-down, or a half-open one whose trial's turn ran out, becomes half-open with the next
    fence, and this caller gets the trial."""
    if row is None or row.state == "closed" or now < row.until:
        return None, breaker_view(row, now)
    fence = row.fence + 1
    written = BreakerRow("half_open", row.failures, fence, now + trial_for, now + ttl)
    return written, BreakerState("half_open", row.failures, fence, max(trial_for, 0.0), True)


def record_step(
    row: BreakerRow | None,
    now: float,
    fence: int,
    ok: bool,
    threshold: int,
    cooldown: float,
    ttl: float,
) -> tuple[BreakerRow | None, BreakerState]:
    """``breaker_record`` on the live ``row``: a call admitted while closed (``fence == 0``)
    counts only while the breaker is still closed; a trial (``fence > 0``) counts only if it is
    the current half-open trial. Writes only what changes."""
    state: BreakerStatus = "closed" if row is None else row.state
    failures = 0 if row is None else row.failures
    current = 0 if row is None else row.fence
    if fence == 0 and state == "closed":
        if ok:
            if failures == 0:
                return None, breaker_view(row, now)
            written = BreakerRow("closed", 0, current, 0.0, now + ttl)
        elif failures + 1 >= threshold:
            written = BreakerRow("open", failures + 1, current, now + cooldown, now + ttl)
        else:
            written = BreakerRow("closed", failures + 1, current, 0.0, now + ttl)
    elif fence > 0 and state == "half_open" and fence == current:
        if ok:
            written = BreakerRow("closed", 0, current, 0.0, now + ttl)
        else:
            written = BreakerRow("open", failures, current, now + cooldown, now + ttl)
    else:
        return None, breaker_view(row, now)
    return written, breaker_view(written, now)
