"""Retry budgets, circuit breakers and spend budgets on every store, both faces.

The processes-and-stores proofs are in tests/acceptance/test_retry_processes.py; here each
client class meets each store (memory included), with threads standing in for processes where
memory is concerned.
"""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

import agentlease as al
from tests.conftest import Store


def test_retry_budget_grants_its_allowance_then_refuses(state: al.SharedState) -> None:
    budget = al.RetryBudget(state, scope="root-a", ratio=0.1, minimum=3)
    for _ in range(40):
        budget.record_call()  # 40 calls: allowance max(3, 4.0) = 4
    for _ in range(4):
        budget.acquire_retry()
    with pytest.raises(al.RetryBudgetExhausted) as caught:
        budget.acquire_retry()
    refused = caught.value
    assert (refused.calls, refused.retries, refused.allowance) == (40, 4, 4.0)
    assert refused.payload()["reason"] == "retry_budget"
    # Another holder of the same scope shares it; another scope does not.
    with pytest.raises(al.RetryBudgetExhausted):
        al.RetryBudget(state, scope="root-a").acquire_retry()
    al.RetryBudget(state, scope="root-b").acquire_retry()


def test_retry_budget_needs_a_scope_outside_a_task(state: al.SharedState) -> None:
    with pytest.raises(al.MissingIdentity):
        al.RetryBudget(state).acquire_retry()
    for bad in ({"ratio": -0.1}, {"ratio": "x"}, {"minimum": -1}, {"scope": ""}):
        with pytest.raises(al.InvalidInput):
            al.RetryBudget(state, **bad)  # type: ignore[arg-type]


def test_breaker_opens_admits_one_trial_and_closes(state: al.SharedState, store: Store) -> None:
    def breaker() -> al.CircuitBreaker:
        return al.CircuitBreaker(
            state, "search-api", threshold=2, cooldown=0.3, staleness=0.05, tool="search"
        )

    here, there = breaker(), breaker()  # two processes' views of one breaker
    here.before()
    here.failure()
    here.before()
    here.failure()
    with pytest.raises(al.CircuitOpen) as caught:
        there.before()
    payload = caught.value.payload()
    assert payload["state"] == "open"
    assert payload["tool"] == "search"
    assert 0 < payload["retry_after_s"] <= 0.3
    json.dumps(payload)
    time.sleep(0.35)
    here.before()  # the one trial
    with pytest.raises(al.CircuitOpen) as second:
        there.before()
    assert second.value.state == "half_open"
    here.success()
    time.sleep(0.06)  # past the staleness of there's view
    there.before()
    there.success()


def test_a_failed_trial_reopens_and_a_late_call_changes_nothing(state: al.SharedState) -> None:
    slow = al.CircuitBreaker(state, "db", threshold=1, cooldown=0.2, staleness=0.0)
    probe = al.CircuitBreaker(state, "db", threshold=1, cooldown=0.2, staleness=0.0)
    slow.before()  # admitted while closed; it will report late
    probe.before()
    probe.failure()  # opens
    slow.success()  # a slow call that lost its turn cannot close the circuit
    with pytest.raises(al.CircuitOpen):
        probe.before()
    time.sleep(0.25)
    probe.before()
    probe.failure()  # the trial failed: open again
    with pytest.raises(al.CircuitOpen) as caught:
        probe.before()
    assert caught.value.state == "open"


def test_spend_budget_limit_is_set_once_and_never_crossed(state: al.SharedState) -> None:
    budget = al.SpendBudget(state, "usd", limit=1_000, scope="root-s")
    with budget.reserve(600) as spend:
        spend.settle(550)
    assert budget.spent() == 550
    with pytest.raises(al.BudgetExceeded) as caught:
        budget.reserve(600)
    assert caught.value.payload()["spent"] == 550
    with budget.reserve(400):
        pass  # left unsettled: the reservation goes back
    assert budget.spent() == 550
    with pytest.raises(al.InvalidInput):
        al.SpendBudget(state, "usd", limit=2_000, scope="root-s").reserve(1)
    assert al.SpendBudget(state, "usd", scope="root-s").spent() == 550
    with pytest.raises(al.InvalidInput):
        al.SpendBudget(state, "tokens", scope="root-s").reserve(1)  # no limit was ever set


def test_threads_spending_together_stay_within_the_limit(state: al.SharedState) -> None:
    limit, settled, lock = 5_000, [], threading.Lock()

    def spender(seed: int) -> None:
        rand, budget = random.Random(seed), al.SpendBudget(state, "usd", limit=limit, scope="t")
        refused = 0
        while refused < 5:
            estimate = rand.randint(1, 300)
            try:
                hold = budget.reserve(estimate)
            except al.BudgetExceeded:
                refused += 1
                continue
            refused = 0
            with hold:
                actual = rand.randint(0, estimate)
                hold.settle(actual)
            with lock:
                settled.append(actual)

    threads = [threading.Thread(target=spender, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    spent = al.SpendBudget(state, "usd", scope="t").spent()
    assert spent == sum(settled)
    assert spent <= limit


async def test_async_faces(astate: al.AsyncSharedState) -> None:
    state = astate
    budget = al.AsyncRetryBudget(state, scope="root-async", minimum=1, ratio=0.0)
    await budget.record_call()
    await budget.acquire_retry()
    with pytest.raises(al.RetryBudgetExhausted):
        await budget.acquire_retry()
    breaker = al.AsyncCircuitBreaker(state, "async-dep", threshold=1, cooldown=5)
    async with breaker:
        pass
    with pytest.raises(ZeroDivisionError):
        async with breaker:
            raise ZeroDivisionError
    with pytest.raises(al.CircuitOpen):
        async with breaker:
            pass
    # al.retry on the async face, with both of them awaited as hooks.
    flaky = al.AsyncCircuitBreaker(state, "async-flaky", threshold=5, cooldown=5)
    shared = al.AsyncRetryBudget(state, scope="root-async-2", minimum=2, ratio=0.0)
    tries: list[int] = []

    @al.retry(on=ConnectionError, attempts=5, base=0.001, budget=shared, breaker=flaky)
    async def call() -> str:
        tries.append(1)
        raise ConnectionError("down")

    with pytest.raises(al.RetryBudgetExhausted) as refused:
        await call()
    assert len(tries) == 3  # the first attempt and the two retries the budget allowed
    assert isinstance(refused.value.__context__, ConnectionError)
    assert flaky.seen is not None
    assert flaky.seen.failures == 3
    spend = al.AsyncSpendBudget(state, "tokens", limit=100, scope="root-async")
    async with await spend.reserve(80) as hold:
        await hold.settle(70)
    with pytest.raises(al.BudgetExceeded):
        await spend.reserve(31)
    assert await spend.spent() == 70


def test_retry_budget_composes_with_an_idempotent_tool(store: Store) -> None:
    """``al.retry`` around an ``@idempotent`` tool: a failure known not to have applied releases
    the key, so the retry acts again under the same key with the next fence; a success is then
    replayed, not repeated, and the retries drew on the shared budget."""
    backend = store.backend()
    state = al.SharedState(backend)
    keys = al.Idempotency(backend)
    effects: list[int] = []

    class Unavailable(Exception):
        pass

    @al.retry(on=Unavailable, attempts=3, base=0.001, budget=al.RetryBudget(state, scope="r-id"))
    @al.idempotent(tool="send", store=keys, step="send", release_on=(Unavailable,))
    def send(to: str) -> str:
        effects.append(al.current_fence())
        if len(effects) < 3:
            raise Unavailable("503")
        return f"sent to {to}"

    with al.idempotency_scope(task_id="task-1"):
        assert send("a@example.com") == "sent to a@example.com"
        assert send("a@example.com") == "sent to a@example.com"  # replayed
    assert effects == [1, 2, 3]  # one key, a new fence per attempt, acted once successfully
    with pytest.raises(al.RetryBudgetExhausted) as caught:
        al.RetryBudget(state, scope="r-id", minimum=2, ratio=0.0).acquire_retry()
    assert caught.value.retries == 2
    if store.kind != "memory":
        state.close()
        keys.close()
