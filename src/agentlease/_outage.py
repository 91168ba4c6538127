"""A store outage as the worker's claim loop sees it: rate-limited warnings and backoff."""

from __future__ import annotations

import logging
import random

from agentlease import _clock
from agentlease._events import logger
from agentlease.errors import BackendError, BackendUnavailable

__all__ = ["Outage"]

_LOG_EVERY = 30.0  # seconds between two warnings about the same outage


class Outage:
    """Tracks a store outage seen by the claim loop: rate-limited warnings and backoff."""

    def __init__(self, url: str, queue: str) -> None:
        self.url = url
        self.queue = queue
        self.since: float | None = None
        self.failures = 0
        self.logged_at = 0.0

    def failed(self, exc: BackendError) -> float:
        """Record one failed claim; returns how long claims have been failing."""
        now = _clock.monotonic()
        if self.since is None:
            self.since = now
        self.failures += 1
        if self.failures == 1 or now - self.logged_at >= _LOG_EVERY:
            self.logged_at = now
            logger.log(
                logging.WARNING if isinstance(exc, BackendUnavailable) else logging.ERROR,
                "%s for %.1fs (%d failed claims on queue %r) at %s: %s; retrying",
                "store unreachable" if isinstance(exc, BackendUnavailable) else "claims failing",
                now - self.since,
                self.failures,
                self.queue,
                self.url,
                exc,
            )
        return now - self.since

    def backoff(self, rand: random.Random) -> float:
        """The next wait: full jitter, doubling from 0.1 s up to 5 s."""
        return rand.uniform(0.0, min(5.0, 0.1 * 2 ** min(self.failures, 10)))

    def reached(self) -> None:
        """A claim went through: the outage, if any, is over."""
        if self.since is not None:
            logger.warning(
                "store reachable again at %s after %.1fs", self.url, _clock.monotonic() - self.since
            )
            self.since = None
            self.failures = 0
