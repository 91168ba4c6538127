"""Bad arguments to retry budgets, circuit breakers and spend budgets are refused with typed
errors before anything reaches the store."""

from __future__ import annotations

import pytest

import agentlease as al


@pytest.fixture
def state() -> al.SharedState:
    return al.SharedState(al.MemoryBackend())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"threshold": 0},
        {"threshold": True},
        {"cooldown": 0},
        {"cooldown": float("nan")},
        {"staleness": -1},
        {"cooldown": 1.0, "staleness": 1.0},  # must be below the cooldown
        {"trial_for": 0},
        {"ttl": -5},
    ],
)
def test_breaker_settings_are_checked(state: al.SharedState, kwargs: dict[str, object]) -> None:
    with pytest.raises(al.InvalidInput):
        al.CircuitBreaker(state, "dep", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", " ", "a" * 201, 7, "a b"])
def test_names_are_checked(state: al.SharedState, name: object) -> None:
    with pytest.raises(al.InvalidInput):
        al.CircuitBreaker(state, name)  # type: ignore[arg-type]
    with pytest.raises(al.InvalidInput):
        al.RetryBudget(state, scope=name)  # type: ignore[arg-type]
    with pytest.raises(al.InvalidInput):
        al.SpendBudget(state, "usd", limit=10, scope=name)  # type: ignore[arg-type]


def test_a_breaker_needs_a_dependency(state: al.SharedState) -> None:
    with pytest.raises(al.InvalidInput):
        al.CircuitBreaker(state, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs", [{"ratio": float("inf")}, {"ratio": True}, {"flush_every": 0}])
def test_budget_settings_are_checked(state: al.SharedState, kwargs: dict[str, object]) -> None:
    with pytest.raises(al.InvalidInput):
        al.RetryBudget(state, scope="r", **kwargs)  # type: ignore[arg-type]


def test_spend_amounts_are_checked(state: al.SharedState) -> None:
    for bad_limit in (-1, 1.5, "10", True, 2**60):
        with pytest.raises(al.InvalidInput):
            al.SpendBudget(state, "usd", limit=bad_limit, scope="r")  # type: ignore[arg-type]
    with pytest.raises(al.InvalidInput):
        al.SpendBudget(state, "not a kind!", limit=10, scope="r")
    budget = al.SpendBudget(state, "usd", limit=10, scope="r")
    for bad in (0, -1, 1.5, "3", None, 2**60):
        with pytest.raises(al.InvalidInput):
            budget.reserve(bad)  # type: ignore[arg-type]
    with budget.reserve(5) as hold:
        for bad in (-1, 1.5, "3", None):
            with pytest.raises(al.InvalidInput):
                hold.settle(bad)  # type: ignore[arg-type]
        hold.settle(4)
    assert budget.spent() == 4
