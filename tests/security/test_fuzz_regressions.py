"""What the fuzzer (tests/security/test_fuzz.py) found, each pinned by a small deterministic test
on every backend of the ``store`` fixture: the input is refused with a typed error, or handled
exactly, and a refusal changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import agentlease as al
from agentlease import InvalidInput, LimitReached
from tests.conftest import Store

MAX = 2**53 - 1  # the largest integer Redis's Lua (doubles) compares exactly


@pytest.fixture
def state(store: Store) -> Iterator[al.SharedState]:
    s = (
        al.SharedState(store.backend())
        if store.kind == "memory"
        else al.SharedState.connect(store.url)
    )
    yield s
    if store.kind != "memory":
        s.close()


# -- counters: what Lua cannot compare exactly is refused on every store -----------------------


def test_a_limit_past_2_53_cannot_be_passed(state: al.SharedState) -> None:
    # Redis compared 2**53 + 1 with the limit 2**53 as doubles (both 2**53) and took the unit.
    with pytest.raises(InvalidInput, match="between"):
        state.add("c", 2**53)
    with pytest.raises(InvalidInput, match="limit"):
        state.reserve("c", 1, limit=2**53)
    assert state.counter("c") == 0
    assert state.add("c", MAX) == MAX
    with pytest.raises(LimitReached):
        state.reserve("c", 1, limit=MAX)
    with pytest.raises(LimitReached):
        state.add("c", 1)  # no bound given: the range of every counter still holds
    assert state.counter("c") == MAX


def test_the_floor_of_the_range_holds(state: al.SharedState) -> None:
    assert state.add("c", -MAX) == -MAX
    with pytest.raises(LimitReached):
        state.add("c", -1)
    with pytest.raises(LimitReached):
        state.take("c", 1, minimum=-MAX)
    assert state.counter("c") == -MAX
    assert state.add("c", MAX) == 0


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda s: s.add("c", 2**63), "n"),
        (lambda s: s.add("c", -(2**64)), "n"),
        (lambda s: s.reserve("c", 2**62, limit=2**62), "n"),
        (lambda s: s.reserve("c", 1, limit=2**70), "limit"),
        (lambda s: s.reserve("c", 1, limit=True), "limit"),
        (lambda s: s.reserve("c", 1, limit=1.0), "limit"),
        (lambda s: s.take("c", 1, minimum=-(2**53)), "minimum"),
        (lambda s: s.take("c", 1, minimum=None), "minimum"),
        (lambda s: s.release("c", 2**53), "n"),
        (lambda s: s.hold("c", 2**53, limit=MAX), "n"),
        (lambda s: s.hold("c", 1, limit=-(2**63)), "limit"),
        (lambda s: s.set_field("r", "f", 1, expected_version=2**53), "expected_version"),
        (lambda s: s.set_field("r", "f", 1, fence=2**62), "fence"),
    ],
)
def test_integers_outside_the_exact_range_are_refused(
    state: al.SharedState, call: object, what: str
) -> None:
    with pytest.raises(InvalidInput, match=what):
        call(state)  # type: ignore[operator]
    assert state.counter("c") == 0
    assert state.get("r") == al.Versioned({}, 0)


def test_holds_at_the_top_of_the_range_are_exact(state: al.SharedState) -> None:
    with state.hold("c", MAX - 1, limit=MAX, ttl=30) as held:
        assert held.value == MAX - 1
        with pytest.raises(LimitReached):
            state.reserve("c", 2, limit=MAX)
        assert state.reserve("c", 1, limit=MAX) == MAX
    assert state.counter("c") == 1
