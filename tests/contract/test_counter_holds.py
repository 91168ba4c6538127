"""Counter holds on every backend of the ``store`` fixture: units of a bounded counter taken under
a lease, counted against the same limit as ``reserve`` and ``take``, renewed while held, fenced
by a token, and given back by the store once the holder stops renewing (no reaper running).

A holder that "dies" here stops renewing (its renewal entry is closed, as a frozen or killed
process would stop); tests/acceptance/test_holds_processes.py SIGKILLs real processes.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Callable

import pytest

import agentlease as al
from agentlease import HoldLost, InvalidInput, LimitReached
from tests.conftest import Store

TTL = 0.5  # of holds whose holder stops renewing: short, so the tests wait little
PATIENCE = 20.0  # bound of every wait for a condition (a loaded machine is slow, never wrong)


def another(store: Store) -> al.SharedState:
    return (
        al.SharedState(store.backend())
        if store.kind == "memory"
        else al.SharedState.connect(store.url)
    )


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def frozen(hold: al.CounterHold, state: al.SharedState) -> None:
    """Stop renewing ``hold``, as if its process froze or died."""
    entry = hold._renewal
    assert entry is not None
    state._renewals.close(entry)
    hold._renewal = None


def wait_until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def test_held_units_count_against_the_limit_of_reserve_and_take(state: al.SharedState) -> None:
    seats = name("seats")
    assert state.reserve(seats, 3, limit=10) == 3
    with state.hold(seats, 5, limit=10, ttl=30) as held:
        assert held.value == 8
        assert state.counter(seats) == 8, "one number: the held units are in the count"
        with pytest.raises(LimitReached) as full:
            state.reserve(seats, 3, limit=10)
        assert (full.value.value, full.value.high) == (8, 10)
        with pytest.raises(LimitReached) as also_full, state.hold(seats, 3, limit=10):
            pass
        assert also_full.value.value == 8
        with pytest.raises(LimitReached) as low:
            state.take(seats, 8, minimum=1)
        assert low.value.value == 8
        assert state.reserve(seats, 2, limit=10) == 10
        held.check()
        assert state.release(seats, 2) == 8
        assert state.counter(seats) == 8, "refusals changed nothing"
    assert state.counter(seats) == 3, "leaving the block released the held units"
    assert state.reserve(seats, 7, limit=10) == 10


def test_commit_keeps_the_units_taken_and_release_gives_them_back(
    state: al.SharedState,
) -> None:
    seats = name("seats")
    with state.hold(seats, 2, limit=10, ttl=30) as held:
        held.commit()
        held.check()  # a committed hold is not lost
        assert state.counter(seats) == 2
    with pytest.raises(InvalidInput), held:
        pass  # a hold is entered once
    assert state.counter(seats) == 2, "committed: the units stay taken, as reserve leaves them"
    with state.hold(seats, 4, limit=10, ttl=30) as held:
        held.release()
        assert state.counter(seats) == 2
        with pytest.raises(HoldLost):
            held.commit()  # it already ended
        assert state.counter(seats) == 2
    assert state.counter(seats) == 2
    seen: list[int] = []

    def fails() -> None:
        with state.hold(seats, 8, limit=10, ttl=30):
            seen.append(state.counter(seats))
            raise RuntimeError("the body failed")

    with pytest.raises(RuntimeError):
        fails()
    assert seen == [10]
    assert state.counter(seats) == 2, "a block that raised released its units"


def test_holds_are_renewed_while_held(state: al.SharedState) -> None:
    seats = name("seats")
    with state.hold(seats, 10, limit=10, ttl=0.6) as held:
        time.sleep(1.5)  # over two TTLs: only renewals keep it
        held.check()
        with pytest.raises(LimitReached):
            state.reserve(seats, limit=10)
        held.commit()
    assert state.counter(seats) == 10


@pytest.mark.parametrize("read", ["counter", "reserve", "take", "hold", "add"])
def test_a_holder_that_stops_renewing_gives_its_units_back_to_any_counter_step(
    state: al.SharedState, read: str
) -> None:
    """10 seats, one holder gone: once its TTL (store clock) has passed, the very next step on
    the counter, whichever it is, sees all 10 seats again; no reaper runs."""
    seats = name("seats")
    state.reserve(seats, 4, limit=10)
    held = state.hold(seats, 6, limit=10, ttl=TTL)
    held.__enter__()
    frozen(held, state)
    assert state.counter(seats) == 10
    time.sleep(TTL)

    def back() -> bool:
        if read == "counter":
            return state.counter(seats) == 4
        if read == "reserve":
            try:
                return state.reserve(seats, 6, limit=10) == 10
            except LimitReached:
                return False
        if read == "take":
            try:
                return state.take(seats, 4, minimum=0) == 0
            except LimitReached:
                return False
        if read == "hold":
            try:
                with state.hold(seats, 6, limit=10) as again:
                    again.commit()
                return True
            except LimitReached:
                return False
        return state.add(seats, 0) == 4

    wait_until("the held units came back", back)
    expected = {"counter": 4, "reserve": 10, "take": 0, "hold": 10, "add": 4}[read]
    assert state.counter(seats) == expected, "the held units were given back exactly once"
    with pytest.raises(HoldLost):
        held.commit()  # the stale holder's commit is refused
    with pytest.raises(HoldLost):
        held.check()
    held.__exit__(None, None, None)  # ended already: nothing more is given back
    assert state.counter(seats) == expected


def test_a_stale_token_is_refused_and_changes_nothing(state: al.SharedState, store: Store) -> None:
    seats = name("seats")
    other = another(store)
    try:
        stale = state.hold(seats, 3, limit=10, ttl=TTL)
        stale.__enter__()
        frozen(stale, state)
        time.sleep(TTL)
        wait_until("the stale hold ran out", lambda: other.counter(seats) == 0)
        with other.hold(seats, 10, limit=10, ttl=30) as fresh:
            backend = state.backend
            assert not backend.extend_hold(seats, stale.token, 30.0), "renewal refused"
            assert not backend.commit_hold(seats, stale.token), "commit refused"
            assert not backend.release_hold(seats, stale.token), "release refused"
            with pytest.raises(HoldLost) as lost:
                stale.release()
            assert (lost.value.name, lost.value.units) == (seats, 3)
            assert other.counter(seats) == 10, "the stale holder gave nothing back twice"
            fresh.check()
            assert not backend.release_hold(seats, os.urandom(16).hex()), "a made-up token"
            fresh.commit()
        assert other.counter(seats) == 10
        with state.hold(seats, 1, limit=11) as once:
            once.release()
            with pytest.raises(HoldLost):
                once.release()  # a second release of the same hold
        assert state.counter(seats) == 10
    finally:
        if store.kind != "memory":
            other.close()


def test_a_hold_past_its_local_deadline_is_lost_whatever_the_store_says(
    state: al.SharedState,
) -> None:
    seats = name("seats")
    with state.hold(seats, 2, limit=10, ttl=TTL) as held:
        frozen(held, state)
        time.sleep(TTL + 0.05)
        with pytest.raises(HoldLost):
            held.check()
        with pytest.raises(HoldLost):
            held.commit()  # refused here, and its units given back at once
        assert state.counter(seats) == 0
    assert state.counter(seats) == 0


def test_a_resent_hold_is_made_once(state: al.SharedState) -> None:
    seats, token = name("seats"), os.urandom(16).hex()
    backend = state.backend
    assert backend.hold_counter(seats, token, 4, 10, 30.0) == 4
    assert backend.hold_counter(seats, token, 4, 10, 30.0) == 4, "the same hold, not a second"
    assert backend.commit_hold(seats, token)
    assert not backend.commit_hold(seats, os.urandom(16).hex())
    assert backend.get_counter(seats) == 4


def test_racing_holders_share_the_last_seat_once(store: Store, state: al.SharedState) -> None:
    seats = name("seats")
    state.reserve(seats, 9, limit=10)
    barrier = threading.Barrier(3, timeout=30)
    outcomes: list[str] = []
    clients = [another(store) for _ in range(3)]

    def grab(c: al.SharedState) -> None:
        barrier.wait()
        try:
            with c.hold(seats, limit=10, ttl=30) as held:
                outcomes.append("held")
                barrier.wait()  # everyone has tried while the winner holds it
                held.commit()
        except LimitReached:
            outcomes.append("full")
            barrier.wait()

    threads = [threading.Thread(target=grab, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if store.kind != "memory":
        for c in clients:
            c.close()
    assert sorted(outcomes) == ["full", "full", "held"]
    assert state.counter(seats) == 10


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 0, "limit": 10},
        {"n": True, "limit": 10},
        {"n": 1, "limit": "10"},
        {"n": 1, "limit": 10, "ttl": 0},
        {"n": 1, "limit": 10, "ttl": float("nan")},
    ],
)
def test_bad_input_is_refused_and_changes_nothing(
    state: al.SharedState, kwargs: dict[str, object]
) -> None:
    seats = name("seats")
    with pytest.raises(InvalidInput):
        state.hold(seats, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        state.hold("bad name!", 1, limit=10)
    assert state.counter(seats) == 0


def test_the_async_face(store: Store) -> None:
    async def main() -> None:
        backend = store.backend().open_async() if store.kind == "memory" else None
        s = (
            al.AsyncSharedState(backend)
            if backend is not None
            else al.AsyncSharedState.connect(store.url)
        )
        try:
            seats = name("seats")
            async with s.hold(seats, 6, limit=10, ttl=30) as held:
                assert isinstance(held, al.AsyncCounterHold)
                assert await s.counter(seats) == 6
                with pytest.raises(LimitReached):
                    await s.reserve(seats, 5, limit=10)
                await held.commit()
            async with s.hold(seats, 4, limit=10, ttl=0.6) as held:
                await asyncio.sleep(1.5)  # renewed from the event loop
                held.check()
            assert await s.counter(seats) == 6
            gone = s.hold(seats, 4, limit=10, ttl=TTL)
            await gone.__aenter__()
            entry = gone._renewal
            assert entry is not None
            await s._renewals.close(entry)
            gone._renewal = None
            await asyncio.sleep(TTL)
            deadline = time.monotonic() + PATIENCE
            while await s.counter(seats) != 6:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            with pytest.raises(HoldLost):
                await gone.commit()
            assert await s.counter(seats) == 6
        finally:
            if backend is None:
                await s.close()

    asyncio.run(main())
