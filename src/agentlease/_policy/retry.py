"""Retry decisions for tasks whose handler raised: full-jitter backoff, bounded, typed."""

from __future__ import annotations

import random
from dataclasses import dataclass

from agentlease._validate import duration, integer
from agentlease.errors import InvalidInput

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
        budget_ratio: if set, every retry also draws on the retry budget of the task's root
            task, shared through the store with every ``al.RetryBudget`` of that root and every
            other worker: a retry goes ahead only while ``retries < max(budget_minimum,
            calls * budget_ratio)``, where a task's first attempt counts as one call; a retry
            the budget refuses dead-letters the task with reason ``retry_budget``.
        budget_minimum: retries the root task's budget allows however few its calls.
        budget_ttl: seconds the budget's record outlives its last write.
    """

    max_failures: int = 3
    base: float = 1.0
    cap: float = 300.0
    non_retryable: tuple[type[BaseException], ...] = ()
    budget_ratio: float | None = None
    budget_minimum: int = 3
    budget_ttl: float = 7 * 24 * 3600.0

    def __post_init__(self) -> None:
        integer(self.max_failures, "max_failures", low=1, high=1_000_000)
        duration(self.base, "base")
        duration(self.cap, "cap")
        if self.budget_ratio is not None:
            ratio = self.budget_ratio
            if isinstance(ratio, bool) or not isinstance(ratio, int | float):
                raise InvalidInput(f"budget_ratio must be a number, not {type(ratio).__name__}")
            if not 0.0 <= ratio <= 1000.0:
                raise InvalidInput(f"budget_ratio must be within [0, 1000], not {ratio!r}")
        integer(self.budget_minimum, "budget_minimum", low=0, high=1_000_000)
        duration(self.budget_ttl, "budget_ttl")

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
