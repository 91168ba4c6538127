"""Retry decisions for tasks whose handler raised: full-jitter backoff, bounded, typed."""

from __future__ import annotations

import random
from dataclasses import dataclass

from agentlease._validate import duration, integer

__all__ = ["RetryPolicy", "full_jitter"]


def full_jitter(retry: int, *, base: float, cap: float, rand: random.Random | None = None) -> float:
    """A full-jitter backoff delay: uniform in ``[0, min(cap, base * 2**retry)]``.

    Args:
        retry: 0 for the first retry, 1 for the second, ...
        base: the upper bound of the first delay, in seconds.
        cap: the largest upper bound, in seconds.
        rand: the random stream (seeded in tests and the harness).
    """
    r = rand if rand is not None else random
    ceiling = min(cap, base * (2.0 ** min(retry, 62)))
    return r.uniform(0.0, ceiling)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """When a task whose handler raised runs again, and when it is dead-lettered instead.

    Attributes:
        max_failures: failures after which the task is dead-lettered (1 means never retried).
        base: the first backoff's upper bound in seconds.
        cap: the largest backoff upper bound in seconds.
        non_retryable: exception types that dead-letter at once.
    """

    max_failures: int = 3
    base: float = 1.0
    cap: float = 300.0
    non_retryable: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        integer(self.max_failures, "max_failures", low=1, high=1_000_000)
        duration(self.base, "base")
        duration(self.cap, "cap")

    def retry_in(
        self, failures: int, exc: BaseException, rand: random.Random | None = None
    ) -> float | None:
        """Seconds until the next try, or ``None`` to dead-letter.

        Args:
            failures: failures recorded before this one.
            exc: what the handler raised.
            rand: the random stream for the jitter.
        """
        if isinstance(exc, self.non_retryable) or failures + 1 >= self.max_failures:
            return None
        return full_jitter(failures, base=self.base, cap=self.cap, rand=rand)
