"""Retry budgets, circuit breakers and spend budgets while their store is down (a private
redis-server, SIGKILLed), and after it is back: every call that needs the store fails with the
typed, transient BackendUnavailable (never a driver error, never a silent pass), both faces; a
breaker refuses from what it last saw while that is fresh, without the store; after a restart
the same clients work again."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

import agentlease as al
from tests._private_redis import PrivateRedis


class Down(Exception):
    pass


def test_sync_clients_while_the_store_is_down(private_redis: Callable[..., PrivateRedis]) -> None:
    server = private_redis()
    with al.SharedState.connect(server.url) as state:
        budget = al.RetryBudget(state, scope="root-1")
        breaker = al.CircuitBreaker(state, "dep", threshold=1, cooldown=30, staleness=0.0)
        spend = al.SpendBudget(state, "tokens", limit=100, scope="root-1")
        budget.acquire_retry()
        breaker.before()
        breaker.failure()  # open, for 30 s
        with spend.reserve(10) as hold:
            hold.settle(5)
        server.kill()
        with pytest.raises(al.CircuitOpen):
            breaker.before()  # refused from what it saw: no store needed
        with pytest.raises(al.BackendUnavailable):
            budget.acquire_retry()
        with pytest.raises(al.BackendUnavailable):
            spend.reserve(10)
        other = al.CircuitBreaker(state, "other", staleness=0.0)
        with pytest.raises(al.BackendUnavailable):
            other.before()
        guarded = al.retry(on=Down, attempts=3, base=0.001, budget=budget, breaker=other)
        calls: list[int] = []

        @guarded
        def call() -> None:
            calls.append(1)

        with pytest.raises(al.BackendUnavailable):
            call()
        assert calls == []  # the breaker could not admit it: the call never went out
        server.start()
        budget.acquire_retry()  # a fresh server: a fresh budget
        other.before()
        assert spend.spent() == 0


async def test_async_clients_while_the_store_is_down(
    private_redis: Callable[..., PrivateRedis],
) -> None:
    server = private_redis()
    state = al.AsyncSharedState.connect(server.url)
    try:
        budget = al.AsyncRetryBudget(state, scope="root-2")
        breaker = al.AsyncCircuitBreaker(state, "dep", staleness=0.0)
        spend = al.AsyncSpendBudget(state, "usd", limit=100, scope="root-2")
        await budget.acquire_retry()
        await breaker.before()
        server.kill()
        with pytest.raises(al.BackendUnavailable):
            await budget.acquire_retry()
        with pytest.raises(al.BackendUnavailable):
            await breaker.before()
        with pytest.raises(al.BackendUnavailable):
            await spend.reserve(1)
        server.start()
        await breaker.before()
        await budget.acquire_retry()
    finally:
        await state.close()


def test_a_hung_store_is_a_typed_timeout_then_work_goes_on(
    private_redis: Callable[..., PrivateRedis],
) -> None:
    """The server SIGSTOPped (a silent partition): a budget step and a breaker admission end
    within the URL's socket timeout with BackendUnavailable; after SIGCONT the same clients go
    on, and the step that timed out was not counted twice."""
    server = private_redis()
    assert server.process is not None
    url = f"{server.url}?socket_timeout=0.5&connect_timeout=0.5"
    with al.SharedState.connect(url) as state:
        budget = al.RetryBudget(state, scope="root-h", minimum=5, ratio=0.0)
        breaker = al.CircuitBreaker(state, "hung-dep", staleness=0.0)
        budget.acquire_retry()
        breaker.before()
        server.process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(al.BackendUnavailable):
                budget.acquire_retry()
            with pytest.raises(al.BackendUnavailable):
                breaker.before()
        finally:
            server.process.send_signal(signal.SIGCONT)
        granted, refused = 0, None
        while refused is None and granted < 10:
            try:
                budget.acquire_retry()
                granted += 1
            except al.RetryBudgetExhausted as exc:
                refused = exc
        # The timed-out step may have landed once (its reply was lost), never twice.
        assert refused is not None
        assert refused.retries == 5
        assert granted in (3, 4)
        breaker.before()
