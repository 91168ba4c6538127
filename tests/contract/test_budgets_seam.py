"""The seam's retry-budget and circuit-breaker primitives, and counter-hold settles, on every
backend of the ``store`` fixture: ``retry_budget``, ``breaker_admit``, ``breaker_record`` and
``commit_hold(units=...)``, called on the backends directly (the classes above them are tested
with them).

Short times (0.1 s) are waited out with a sleep a little longer; the times a test must not see
pass (a cool-down, a TTL) are long, so a slow machine cannot make it wrong.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator

import pytest

import agentlease as al
from agentlease._records import BreakerState, BudgetState
from agentlease.backends.base import AsyncBackend, Backend
from tests.conftest import Store

SHORT = 0.1  # a time the test waits out
PAST = SHORT + 0.03  # the sleep that waits it out
LONG = 60.0  # a time that must not pass during a test


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def backend(store: Store) -> Iterator[Backend]:
    b = store.backend()
    yield b
    if store.kind != "memory":
        b.close()


def open_async(store: Store, backend: Backend) -> AsyncBackend:
    return backend.open_async() if store.kind == "memory" else al.connect_async(store.url)


def fail(backend: Backend, key: str, *, threshold: int = 3, cooldown: float = LONG) -> BreakerState:
    return backend.breaker_record(key, 0, False, threshold, cooldown, LONG)


def opened(backend: Backend, key: str, cooldown: float) -> BreakerState:
    """Open breaker ``key`` (threshold 1) with ``cooldown``."""
    state = fail(backend, key, threshold=1, cooldown=cooldown)
    assert state.state == "open"
    return state


def trial(backend: Backend, key: str, trial_for: float = LONG) -> BreakerState:
    """Open ``key``, wait out a short cool-down, and take the half-open trial."""
    opened(backend, key, SHORT)
    time.sleep(PAST)
    state = backend.breaker_admit(key, trial_for, LONG)
    assert state.trial
    assert state.state == "half_open"
    return state


# -- retry budgets -------------------------------------------------------------------------------


def test_a_budget_grants_up_to_max_of_minimum_and_ratio_of_calls(backend: Backend) -> None:
    key = name("budget")
    assert backend.retry_budget(key, 10, False, 0.2, 3, LONG) == BudgetState(10, 0, False)
    grants = [backend.retry_budget(key, 0, True, 0.2, 3, LONG) for _ in range(4)]
    assert [g.granted for g in grants] == [True, True, True, False], "minimum 3 over 10 * 0.2"
    assert grants[-1] == BudgetState(10, 3, False), "a refusal counts nothing"
    # 30 calls: the ratio's 6 is now above the minimum; the calls count before the decision.
    assert backend.retry_budget(key, 20, True, 0.2, 3, LONG) == BudgetState(30, 4, True)
    more = [backend.retry_budget(key, 0, True, 0.2, 3, LONG) for _ in range(3)]
    assert [m.granted for m in more] == [True, True, False]
    assert more[-1] == BudgetState(30, 6, False)
    other = backend.retry_budget(name("budget"), 0, True, 0.2, 0, LONG)
    assert other == BudgetState(0, 0, False), "minimum 0 and no calls: nothing to spend"


def test_calls_alone_are_recorded_and_a_read_changes_nothing(backend: Backend) -> None:
    key = name("budget")
    assert backend.retry_budget(key, 5, False, 0.1, 3, LONG) == BudgetState(5, 0, False)
    assert backend.retry_budget(key, 7, False, 0.1, 3, LONG) == BudgetState(12, 0, False)
    assert backend.retry_budget(key, 0, False, 0.1, 3, LONG) == BudgetState(12, 0, False)
    assert backend.retry_budget(key, 1, True, 0.1, 3, LONG) == BudgetState(13, 1, True)


def test_a_budget_expires_ttl_after_its_last_write(backend: Backend) -> None:
    key = name("budget")
    backend.retry_budget(key, 5, False, 0.1, 1, SHORT)
    assert backend.retry_budget(key, 0, True, 0.1, 1, SHORT) == BudgetState(5, 1, True)
    assert not backend.retry_budget(key, 0, True, 0.1, 1, SHORT).granted
    time.sleep(PAST)
    assert backend.retry_budget(key, 0, False, 0.1, 1, SHORT) == BudgetState(0, 0, False)
    assert backend.retry_budget(key, 2, True, 0.1, 1, LONG) == BudgetState(2, 1, True)


# -- circuit breakers ----------------------------------------------------------------------------


def test_a_breaker_opens_at_the_threshold_of_consecutive_failures(backend: Backend) -> None:
    key = name("dep")
    assert backend.breaker_admit(key, LONG, LONG) == BreakerState("closed", 0, 0, 0.0, False)
    assert fail(backend, key).failures == 1
    assert fail(backend, key) == BreakerState("closed", 2, 0, 0.0, False)
    ok = backend.breaker_record(key, 0, True, 3, LONG, LONG)
    assert ok == BreakerState("closed", 0, 0, 0.0, False), "a success resets the failures"
    assert backend.breaker_record(key, 0, True, 3, LONG, LONG).failures == 0
    fail(backend, key)
    fail(backend, key)
    assert backend.breaker_admit(key, LONG, LONG) == BreakerState("closed", 2, 0, 0.0, False)
    state = fail(backend, key)
    assert (state.state, state.failures, state.fence, state.trial) == ("open", 3, 0, False)
    assert 0 < state.retry_after <= LONG


def test_an_open_breaker_admits_nobody_until_its_cooldown_ends(backend: Backend) -> None:
    key = name("dep")
    opened(backend, key, LONG)
    for _ in range(3):
        state = backend.breaker_admit(key, LONG, LONG)
        assert (state.state, state.trial, state.fence) == ("open", False, 0)
        assert 0 < state.retry_after <= LONG


def test_after_the_cooldown_exactly_one_of_many_concurrent_admits_gets_the_trial(
    store: Store, backend: Backend
) -> None:
    key = name("dep")
    opened(backend, key, SHORT)
    time.sleep(PAST)

    async def admit_all() -> list[BreakerState]:
        face = open_async(store, backend)
        try:
            # One call first: redis-py 8.1's asyncio cluster client fails concurrent first calls
            # while it sets up its connections (an AttributeError in its connection code).
            await face.breaker_admit(name("warm-up"), LONG, LONG)
            return await asyncio.gather(*(face.breaker_admit(key, LONG, LONG) for _ in range(20)))
        finally:
            if store.kind != "memory":
                await face.close()

    states = asyncio.run(admit_all())
    winners = [s for s in states if s.trial]
    assert len(winners) == 1, states
    assert winners[0].fence == 1
    assert all(s.state == "half_open" and s.fence == 1 for s in states)
    assert all(0 < s.retry_after <= LONG for s in states)
    later = backend.breaker_admit(key, LONG, LONG)
    assert (later.state, later.trial, later.fence) == ("half_open", False, 1)


def test_the_trial_closes_on_success_and_reopens_on_failure(backend: Backend) -> None:
    key = name("dep")
    first = trial(backend, key)
    closed = backend.breaker_record(key, first.fence, True, 3, LONG, LONG)
    assert closed == BreakerState("closed", 0, first.fence, 0.0, False)
    assert backend.breaker_admit(key, LONG, LONG).state == "closed"
    second = trial(backend, key)
    assert second.fence == first.fence + 1, "fences only rise"
    reopened = backend.breaker_record(key, second.fence, False, 3, LONG, LONG)
    assert (reopened.state, reopened.fence, reopened.trial) == ("open", second.fence, False)
    assert 0 < reopened.retry_after <= LONG
    assert not backend.breaker_admit(key, LONG, LONG).trial


def test_a_stale_fence_changes_nothing(backend: Backend) -> None:
    key = name("dep")
    got = trial(backend, key)
    for fence in (got.fence - 1, got.fence + 1, got.fence + 7):
        for ok in (True, False):
            state = backend.breaker_record(key, fence, ok, 3, LONG, LONG)
            assert (state.state, state.fence, state.trial) == ("half_open", got.fence, False)
    assert backend.breaker_record(name("dep"), 3, True, 3, LONG, LONG).state == "closed"
    assert backend.breaker_record(key, got.fence, True, 3, LONG, LONG).state == "closed"
    for ok in (True, False):  # the trial's outcome, sent again after it closed the circuit
        assert backend.breaker_record(key, got.fence, ok, 3, LONG, LONG).state == "closed"


def test_a_trial_that_never_reports_loses_its_turn(backend: Backend) -> None:
    key = name("dep")
    lost = trial(backend, key, trial_for=SHORT)
    time.sleep(PAST)
    taken = backend.breaker_admit(key, LONG, LONG)
    assert (taken.state, taken.fence, taken.trial) == ("half_open", lost.fence + 1, True)
    late = backend.breaker_record(key, lost.fence, True, 3, LONG, LONG)
    assert (late.state, late.fence) == ("half_open", taken.fence), "the late trial is ignored"
    assert backend.breaker_record(key, taken.fence, True, 3, LONG, LONG).state == "closed"


def test_an_outcome_admitted_while_closed_changes_nothing_once_open(backend: Backend) -> None:
    key = name("dep")
    first = opened(backend, key, LONG)
    ok = backend.breaker_record(key, 0, True, 3, LONG, LONG)
    assert (ok.state, ok.failures) == ("open", first.failures), "a slow success cannot close it"
    again = fail(backend, key, threshold=1, cooldown=LONG)
    assert (again.state, again.failures) == ("open", first.failures), "nor count a failure"
    assert again.retry_after <= first.retry_after, "nor move the cool-down"
    half = name("dep")
    got = trial(backend, half)
    for ok in (True, False):  # nor settle a half-open trial that is not its own
        state = backend.breaker_record(half, 0, ok, 1, LONG, LONG)
        assert (state.state, state.fence) == ("half_open", got.fence)


def test_a_breaker_expires_ttl_after_its_last_write(backend: Backend) -> None:
    key = name("dep")
    state = backend.breaker_record(key, 0, False, 1, LONG, SHORT)
    assert state.state == "open"
    time.sleep(PAST)
    assert backend.breaker_admit(key, LONG, LONG) == BreakerState("closed", 0, 0, 0.0, False)


# -- settling a counter hold ---------------------------------------------------------------------


def test_commit_with_units_settles_the_hold(backend: Backend) -> None:
    spend, token = name("usd"), os.urandom(16).hex()
    assert backend.add_counter(spend, 2, None, None) == 2
    assert backend.hold_counter(spend, token, 5, 100, LONG) == 7
    assert backend.commit_hold(spend, token, 3)
    assert backend.get_counter(spend) == 5, "moved by units - held"
    # A hold ends once: committing it again changes nothing (Redis answers True, as a resend
    # after a lost reply is answered, from the tombstone the first commit left).
    backend.commit_hold(spend, token, 9)
    backend.commit_hold(spend, token)
    assert backend.get_counter(spend) == 5
    assert not backend.commit_hold(spend, os.urandom(16).hex(), 3), "no such hold"
    assert not backend.release_hold(spend, token), "a committed hold is not released"
    assert backend.get_counter(spend) == 5
    more = os.urandom(16).hex()
    backend.hold_counter(spend, more, 4, 100, LONG)
    assert backend.commit_hold(spend, more, 10), "more than held: no bound is checked"
    assert backend.get_counter(spend) == 15
    none = os.urandom(16).hex()
    backend.hold_counter(spend, none, 4, 100, LONG)
    assert backend.commit_hold(spend, none, 0)
    assert backend.get_counter(spend) == 15
    kept = os.urandom(16).hex()
    backend.hold_counter(spend, kept, 4, 100, LONG)
    assert backend.commit_hold(spend, kept)
    assert backend.get_counter(spend) == 19, "no units: the held units stay"


def test_a_counter_hold_settles_through_the_api(state: al.SharedState) -> None:
    spend = name("usd")
    with state.hold(spend, 50, limit=100, ttl=LONG) as held:
        assert state.counter(spend) == 50
        with pytest.raises(al.InvalidInput):
            held.commit(-1)
        with pytest.raises(al.InvalidInput):
            held.commit(True)
        held.check()  # a refused settle leaves the hold held
        held.commit(units=20)
    assert state.counter(spend) == 20
    with pytest.raises(al.HoldLost):
        held.commit(units=20)
    assert state.counter(spend) == 20
