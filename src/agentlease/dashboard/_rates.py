"""Rates measured by the dashboard: the net change of a queue's done and dead counts per minute.

The store keeps counts, not events, so a rate is the difference between two samples of the
counts (each read in one snapshot, with the store's clock) divided by the time between them.
The dashboard samples a queue whenever a page shows it; a rate is given once two samples are at
least :data:`MIN_SPAN` seconds apart, over the oldest sample of the last :data:`WINDOW` seconds.
A count that went down (finished tasks purged after their retention, dead letters requeued)
gives no rate for that window rather than a wrong one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["MIN_SPAN", "WINDOW", "Rate", "RateMeter"]

WINDOW = 60.0  # seconds of samples a rate is measured over
MIN_SPAN = 5.0  # the shortest span between two samples that gives a rate
MEASURED = ("done", "dead")  # the states whose counts only grow, but for purges and requeues


@dataclass(frozen=True, slots=True)
class Rate:
    """Per-minute rates of one queue, over ``span`` seconds of samples (``None``: not known)."""

    span: float
    per_minute: dict[str, float | None]


class RateMeter:
    """Samples of each queue's counts, kept for :data:`WINDOW` seconds (pure: no I/O)."""

    def __init__(self, *, window: float = WINDOW, min_span: float = MIN_SPAN) -> None:
        self.window = window
        self.min_span = min_span
        self._samples: dict[str, deque[tuple[float, dict[str, int]]]] = {}

    def observe(self, queue: str, now: float, counts: dict[str, int]) -> Rate | None:
        """Record the counts of ``queue`` read at ``now`` (store clock); return its rates."""
        samples = self._samples.setdefault(queue, deque())
        if samples and now < samples[-1][0]:
            samples.clear()  # the store's clock went back (another store, or a reset): restart
        samples.append((now, {state: counts.get(state, 0) for state in MEASURED}))
        # Keep the newest sample at least a window old: it is the base of the next rate.
        while len(samples) > 1 and samples[1][0] <= now - self.window:
            samples.popleft()
        return self.rate(queue)

    def rate(self, queue: str) -> Rate | None:
        """The rates of ``queue`` over its samples of the last window, or ``None`` if too few."""
        samples = self._samples.get(queue)
        if not samples:
            return None
        now, latest = samples[-1]
        base = next(
            ((at, counts) for at, counts in samples if at >= now - self.window),
            None,
        )
        if base is None or now - base[0] < self.min_span:
            # The only samples in the window are too recent: use the one just before it.
            base = samples[0]
        span = now - base[0]
        if span < self.min_span:
            return None
        per_minute: dict[str, float | None] = {}
        for state in MEASURED:
            change = latest[state] - base[1][state]
            per_minute[state] = None if change < 0 else change * 60.0 / span
        return Rate(span=span, per_minute=per_minute)
