"""The jitter proof of issue 13: 100 callers whose first call fails at the same moment spread
their retries uniformly over the first backoff window (a Kolmogorov-Smirnov test, seeded), where
a policy without jitter sends them back in one synchronised wave.

The assertions are on the delays each caller chose (the distribution the engine promises) and on
the real retry times never coming before them; a loaded machine only makes the real times later,
so no upper bound on them is asserted.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time

import pytest

import agentlease as al

CALLERS = 100
BASE = 0.2  # the first backoff window: [0, BASE]
# asyncio may fire a timer up to its clock resolution early, and time.sleep on a coarse clock:
# a retry may come this much before its delay (the delays themselves are far larger).
CLOCK_SLACK = 0.002


def ks_statistic(samples: list[float], low: float, high: float) -> float:
    """The Kolmogorov-Smirnov distance between the samples and uniform(low, high)."""
    xs = sorted(samples)
    n = len(xs)
    d = 0.0
    for i, x in enumerate(xs):
        cdf = min(1.0, max(0.0, (x - low) / (high - low)))
        d = max(d, (i + 1) / n - cdf, cdf - i / n)
    return d


def ks_pvalue(d: float, n: int) -> float:
    """The p-value of the one-sample KS statistic ``d`` of ``n`` samples (the Kolmogorov
    distribution with Stephens' small-sample correction, as Numerical Recipes' probks)."""
    root = math.sqrt(n)
    lam = (root + 0.12 + 0.11 / root) * d
    if lam < 1e-3:
        return 1.0
    total = 0.0
    for k in range(1, 101):
        term = 2.0 * (-1) ** (k - 1) * math.exp(-2.0 * k * k * lam * lam)
        total += term
        if abs(term) < 1e-12:
            break
    return min(1.0, max(0.0, total))


def test_the_ks_helpers_know_uniform_from_a_wave() -> None:
    grid = [(i + 0.5) / 100 * BASE for i in range(100)]
    assert ks_statistic(grid, 0.0, BASE) == pytest.approx(0.005)
    assert ks_pvalue(ks_statistic(grid, 0.0, BASE), 100) > 0.99
    wave = [BASE] * 100
    assert ks_statistic(wave, 0.0, BASE) == 1.0
    assert ks_pvalue(1.0, 100) < 1e-12


def test_full_jitter_delays_are_uniform_for_most_seeds() -> None:
    """Without sleeping: over 200 seeds, a KS test at the 5 % level rejects about 5 % of them."""
    rejected = 0
    for seed in range(200):
        policy = al.retry(on=OSError, base=BASE, rand=random.Random(seed))
        delays = [policy.backoff(0) for _ in range(CALLERS)]
        assert all(0.0 <= d <= BASE for d in delays)
        rejected += ks_pvalue(ks_statistic(delays, 0.0, BASE), CALLERS) < 0.05
    assert rejected <= 25  # 10 expected; a binomial(200, 0.05) passes 25 with p ~ 1e-5


async def _async_storm(*, jitter: bool, seed: int) -> tuple[list[float], list[float]]:
    """Run the callers as asyncio tasks; return each one's chosen delay and its retry time
    after the common failure moment."""
    rand = random.Random(seed)
    go = asyncio.Event()
    waiting = 0
    failed_at: float | None = None

    async def caller() -> tuple[float, float]:
        nonlocal waiting
        async for attempt in al.retry(
            on=ConnectionError, attempts=2, base=BASE, cap=BASE, jitter=jitter, rand=rand
        ):
            async with attempt:
                if attempt.number == 1:
                    waiting += 1
                    await go.wait()
                    raise ConnectionError("the dependency is down")
                assert failed_at is not None
                return attempt.delay, time.monotonic() - failed_at
        raise AssertionError("the retry succeeds")

    tasks = [asyncio.create_task(caller()) for _ in range(CALLERS)]
    while waiting < CALLERS:
        await asyncio.sleep(0)
    failed_at = time.monotonic()
    go.set()
    results = await asyncio.gather(*tasks)
    return [d for d, _ in results], [t for _, t in results]


def _threaded_storm(*, jitter: bool, seed: int) -> tuple[list[float], list[float]]:
    """The same with the sync face, one thread per caller."""
    rand = random.Random(seed)
    ready = threading.Barrier(CALLERS + 1)
    go = threading.Event()
    failed_at: list[float] = []
    results: list[tuple[float, float]] = []
    lock = threading.Lock()

    def caller() -> None:
        for attempt in al.retry(
            on=ConnectionError, attempts=2, base=BASE, cap=BASE, jitter=jitter, rand=rand
        ):
            with attempt:
                if attempt.number == 1:
                    ready.wait()
                    go.wait()
                    raise ConnectionError("the dependency is down")
                retried = time.monotonic() - failed_at[0]
                with lock:
                    results.append((attempt.delay, retried))

    threads = [threading.Thread(target=caller, daemon=True) for _ in range(CALLERS)]
    for thread in threads:
        thread.start()
    ready.wait()
    failed_at.append(time.monotonic())
    go.set()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == CALLERS
    return [d for d, _ in results], [t for _, t in results]


def _check(delays: list[float], retried: list[float], *, jitter: bool) -> None:
    assert len(delays) == CALLERS
    # No retry came before its delay (after the common failure moment, which is earlier than
    # each caller's own failure).
    for delay, at in zip(delays, retried, strict=True):
        assert at >= delay - CLOCK_SLACK
    d = ks_statistic(delays, 0.0, BASE)
    if jitter:
        assert all(0.0 <= x <= BASE for x in delays)
        assert ks_pvalue(d, CALLERS) > 0.01, f"D={d:.3f}: the delays are not uniform"
    else:
        # One wave: every caller chose the same delay, and every retry came at or after it.
        assert set(delays) == {BASE}
        assert d == 1.0
        real = ks_statistic(retried, 0.0, BASE)
        assert real >= 1.0 - CLOCK_SLACK / BASE
        assert ks_pvalue(real, CALLERS) < 1e-6


@pytest.mark.parametrize("jitter", [True, False], ids=["full-jitter", "no-jitter"])
async def test_async_callers_that_fail_together_spread_their_retries(jitter: bool) -> None:
    delays, retried = await _async_storm(jitter=jitter, seed=13)
    _check(delays, retried, jitter=jitter)


@pytest.mark.parametrize("jitter", [True, False], ids=["full-jitter", "no-jitter"])
def test_threaded_callers_that_fail_together_spread_their_retries(jitter: bool) -> None:
    delays, retried = _threaded_storm(jitter=jitter, seed=13)
    _check(delays, retried, jitter=jitter)
