"""Shared-state guards above the seam, on every backend of the ``store`` fixture.

The classic anomalies are forced with a barrier (both writers read before either writes), so
each one happens on every run without the guard, and is shown never to happen with it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable

import pytest

import agentlease as al
from agentlease import (
    ConflictError,
    FencedOff,
    InvalidInput,
    LimitReached,
    LockHeldAcrossModelCall,
    LockLost,
    LockTimeout,
    NotLockOwner,
    StateMachine,
    TransitionRefused,
)
from tests._outage import Outage
from tests.conftest import Store

REVIEW = StateMachine(
    field="status",
    transitions={"draft": {"review"}, "review": {"draft", "approved"}, "approved": set()},
    initial={"draft"},
)


def another(store: Store) -> al.SharedState:
    return (
        al.SharedState(store.backend())
        if store.kind == "memory"
        else al.SharedState.connect(store.url)
    )


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def interleaved(store: Store, *steps: Callable[[al.SharedState, threading.Barrier], None]) -> None:
    """Run each step on its own thread and client, with a barrier they can meet at."""
    barrier = threading.Barrier(len(steps), timeout=30)
    clients = [another(store) for _ in steps]
    errors: list[BaseException] = []

    def run(step: Callable[[al.SharedState, threading.Barrier], None], c: al.SharedState) -> None:
        try:
            step(c, barrier)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(s, c)) for s, c in zip(steps, clients, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if store.kind != "memory":
        for c in clients:
            c.close()
    if errors:
        raise errors[0]


# -- lost update ------------------------------------------------------------------------------


def test_read_modify_write_loses_an_update_without_the_guard(
    store: Store, state: al.SharedState
) -> None:
    key = name("doc")
    state.compare_and_set(key, 0, {"notes": []})

    def naive(note: str) -> Callable[[al.SharedState, threading.Barrier], None]:
        def step(c: al.SharedState, barrier: threading.Barrier) -> None:
            notes = c.get(key).value["notes"]
            barrier.wait()  # both have read before either writes
            assert isinstance(notes, list)
            c.set_field(key, "notes", [*notes, note])  # a blind write: no version

        return step

    interleaved(store, naive("a"), naive("b"))
    assert len(state.get(key).value["notes"]) == 1  # type: ignore[arg-type]  # one was lost


def test_update_never_loses_one(store: Store, state: al.SharedState) -> None:
    key = name("doc")
    state.compare_and_set(key, 0, {"notes": []})

    def guarded(note: str) -> Callable[[al.SharedState, threading.Barrier], None]:
        def step(c: al.SharedState, barrier: threading.Barrier) -> None:
            first = [True]

            def add(value: dict[str, object]) -> dict[str, object]:
                if first[0]:
                    first[0] = False
                    barrier.wait()  # the first attempts of both read the same version
                return {**value, "notes": [*value["notes"], note]}  # type: ignore[list-item]

            c.update(key, add)  # type: ignore[arg-type]

        return step

    for _ in range(3):
        interleaved(store, guarded("a"), guarded("b"))
    got = state.get(key)
    assert sorted(got.value["notes"]) == ["a", "a", "a", "b", "b", "b"]  # type: ignore[arg-type]
    assert got.version == 7


def test_compare_and_set_reports_the_current_state(state: al.SharedState) -> None:
    key = name("doc")
    assert state.compare_and_set(key, 0, {"n": 1}) == 1
    with pytest.raises(ConflictError) as info:
        state.compare_and_set(key, 0, {"n": 2})
    assert info.value.current_version == 1
    assert info.value.current_value == {"n": 1}
    assert state.compare_and_set(key, 1, {"n": 2}) == 2
    assert state.delete(key, 2) == 3
    assert state.get(key) == al.Versioned({}, 3)
    with pytest.raises(ConflictError):
        state.compare_and_set(key, 1, {"n": 9})  # a stale writer never revives it


def test_update_gives_up_when_contention_outlasts_its_attempts(state: al.SharedState) -> None:
    key = name("doc")
    state.compare_and_set(key, 0, {"n": 0})

    def meddle(value: dict[str, object]) -> dict[str, object]:
        state.set_field(key, "other", 1)  # someone else writes between every read and write
        return {**value, "n": 1}

    with pytest.raises(ConflictError):
        state.update(key, meddle, attempts=3)  # type: ignore[arg-type]
    assert state.get(key).value["n"] == 0


def test_writes_to_different_fields_both_survive(store: Store, state: al.SharedState) -> None:
    key = name("report")

    def writer(field: str) -> Callable[[al.SharedState, threading.Barrier], None]:
        def step(c: al.SharedState, barrier: threading.Barrier) -> None:
            barrier.wait()
            for i in range(10):
                c.set_field(key, field, i)

        return step

    interleaved(store, writer("summary"), writer("sources"), writer("verdict"))
    assert state.get(key).value == {"summary": 9, "sources": 9, "verdict": 9}


# -- transition guards ------------------------------------------------------------------------


def test_a_state_machine_refuses_backwards_and_sideways_moves(state: al.SharedState) -> None:
    key = name("pr")
    v = state.compare_and_set(key, 0, {"status": "draft", "title": "x"}, machine=REVIEW)
    v = state.set_field(key, "status", "review", machine=REVIEW)
    v = state.set_field(key, "status", "approved", expected_version=v, machine=REVIEW)
    for back in ("review", "draft"):
        with pytest.raises(TransitionRefused) as info:
            state.set_field(key, "status", back, machine=REVIEW)
        assert info.value.current == "approved"
        assert info.value.target == back
    assert state.set_field(key, "status", "approved", machine=REVIEW) == v + 1  # staying is fine
    assert state.set_field(key, "title", "y", machine=REVIEW) == v + 2  # other fields unguarded
    with pytest.raises(TransitionRefused):
        state.compare_and_set(name("pr"), 0, {"status": "approved"}, machine=REVIEW)
    with pytest.raises(InvalidInput):
        state.set_field(key, "status", "merged", machine=REVIEW)  # not a declared state
    with pytest.raises(InvalidInput):
        StateMachine(field="s", transitions={"a": {"b"}})  # b undeclared


def test_racing_transitions_from_one_state_let_one_through(
    store: Store, state: al.SharedState
) -> None:
    machine = StateMachine(
        field="status", transitions={"open": {"won", "lost"}, "won": set(), "lost": set()}
    )
    key = name("deal")
    state.compare_and_set(key, 0, {"status": "open"}, machine=machine)
    outcomes: list[str] = []

    def close_as(target: str) -> Callable[[al.SharedState, threading.Barrier], None]:
        def step(c: al.SharedState, barrier: threading.Barrier) -> None:
            barrier.wait()
            try:
                c.set_field(key, "status", target, machine=machine)
                outcomes.append(target)
            except TransitionRefused:
                outcomes.append("refused")

        return step

    interleaved(store, close_as("won"), close_as("lost"))
    assert len(outcomes) == 2
    assert outcomes.count("refused") == 1
    assert state.get(key).value["status"] in ("won", "lost")


# -- materialised constraints (write skew) ------------------------------------------------------


def test_the_rota_loses_its_last_doctor_without_the_guard(
    store: Store, state: al.SharedState
) -> None:
    rota = name("rota")
    state.compare_and_set(rota, 0, {"alice": True, "bob": True})

    def leave(doctor: str) -> Callable[[al.SharedState, threading.Barrier], None]:
        def step(c: al.SharedState, barrier: threading.Barrier) -> None:
            on_call = [d for d, on in c.get(rota).value.items() if on]
            barrier.wait()  # both checked "someone else is on call" before either left
            if len(on_call) > 1:
                c.set_field(rota, doctor, False)  # different fields: no conflict to catch it

        return step

    interleaved(store, leave("alice"), leave("bob"))
    assert not any(state.get(rota).value.values())  # nobody on call: the invariant broke


def test_the_rota_keeps_one_doctor_with_a_bounded_counter(
    store: Store, state: al.SharedState
) -> None:
    rota, on_call = name("rota"), name("on-call")
    state.compare_and_set(rota, 0, {"alice": True, "bob": True})
    state.add(on_call, 2)
    refused: list[str] = []

    def leave(doctor: str) -> Callable[[al.SharedState, threading.Barrier], None]:
        def step(c: al.SharedState, barrier: threading.Barrier) -> None:
            barrier.wait()
            try:
                c.take(on_call, minimum=1)  # the constraint, materialised on one row
            except LimitReached:
                refused.append(doctor)
                return
            c.set_field(rota, doctor, False)

        return step

    interleaved(store, leave("alice"), leave("bob"))
    assert len(refused) == 1
    assert sum(state.get(rota).value.values()) == 1  # type: ignore[arg-type]
    assert state.counter(on_call) == 1


def test_the_last_slot_goes_twice_without_the_guard_and_once_with_it(
    store: Store, state: al.SharedState
) -> None:
    naive, guarded = name("slots"), name("slots")
    state.compare_and_set(naive, 0, {"used": 9})
    granted: list[str] = []

    def naive_alloc(c: al.SharedState, barrier: threading.Barrier) -> None:
        used = c.get(naive).value["used"]
        barrier.wait()
        assert isinstance(used, int)
        if used < 10:
            c.set_field(naive, "used", used + 1)
            granted.append("naive")

    interleaved(store, naive_alloc, naive_alloc)
    assert granted.count("naive") == 2  # two allocations of the one slot left

    state.reserve(guarded, 9, limit=10)

    def guarded_alloc(c: al.SharedState, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            c.reserve(guarded, limit=10)
            granted.append("guarded")
        except LimitReached:
            pass

    interleaved(store, guarded_alloc, guarded_alloc)
    assert granted.count("guarded") == 1
    assert state.counter(guarded) == 10
    assert state.release(guarded, 10) == 0
    with pytest.raises(LimitReached):
        state.release(guarded)  # never below zero


# -- lock sets ----------------------------------------------------------------------------------


def test_opposite_orders_never_deadlock(store: Store) -> None:
    a, b = name("lock"), name("lock")
    order: list[str] = []

    def locker(names: list[str], who: str) -> Callable[[al.SharedState, threading.Barrier], None]:
        def step(c: al.SharedState, barrier: threading.Barrier) -> None:
            barrier.wait()
            for _ in range(5):
                with c.locks(names, timeout=20) as held:
                    assert held.names == tuple(sorted([a, b]))
                    order.append(who)
                    time.sleep(0.005)

        return step

    interleaved(store, locker([a, b], "ab"), locker([b, a], "ba"))
    assert sorted(order) == ["ab"] * 5 + ["ba"] * 5


def test_a_busy_set_times_out_holding_nothing(state: al.SharedState, store: Store) -> None:
    a, b = sorted([name("lock"), name("lock")])
    other = another(store)
    try:
        with state.locks([b], timeout=5):
            started = time.monotonic()
            with pytest.raises(LockTimeout) as info, other.locks([a, b], timeout=0.3):
                pass
            assert time.monotonic() - started >= 0.3
            assert info.value.busy == b
            assert other.lock_holders([a]) == {a: None}  # all or nothing
    finally:
        if store.kind != "memory":
            other.close()


def test_tokens_rise_and_a_zombie_is_fenced_off(state: al.SharedState, store: Store) -> None:
    lock, account = name("lock"), name("account")
    other = another(store)
    try:
        zombie = state.locks([lock], timeout=5, ttl=0.3)
        with pytest.raises(LockLost), zombie:  # noqa: PT012 - the whole zombie's life
            old = zombie.tokens[lock]
            state.set_field(account, "balance", 100, fence=old)
            entry = zombie._renewal
            assert entry is not None
            state._renewals.close(entry)  # frozen: it stops renewing
            time.sleep(0.6)
            with other.locks([lock], timeout=5) as held:
                assert held.tokens[lock] > old
                other.set_field(account, "balance", 50, fence=held.tokens[lock])
            with pytest.raises(FencedOff):
                state.set_field(account, "balance", 0, fence=old)  # the zombie writes late
        assert state.get(account).value == {"balance": 50}
    finally:
        if store.kind != "memory":
            other.close()


def test_release_by_a_non_owner_is_refused(state: al.SharedState) -> None:
    lock = name("lock")
    with state.locks([lock], timeout=5) as held:
        with pytest.raises(NotLockOwner) as info:
            state.release_locks([lock], "someone-else")
        assert info.value.holder == held.owner
        assert state.lock_holders([lock]) == {lock: held.owner}
    assert state.lock_holders([lock]) == {lock: None}


def test_locks_are_renewed_while_held(state: al.SharedState) -> None:
    lock = name("lock")
    with state.locks([lock], timeout=5, ttl=0.3) as held:
        time.sleep(1.0)  # three TTLs: only renewals keep it
        held.check()
        assert state.lock_holders([lock]) == {lock: held.owner}


def _lost(held: al.LockSet) -> bool:
    try:
        held.check()
    except LockLost:
        return True
    return False


def _wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_a_lock_set_is_lost_when_its_ttl_passes_while_renewals_fail(store: Store) -> None:
    outage = Outage(store.backend(), "extend_locks")
    state = al.SharedState(outage)  # type: ignore[arg-type]
    lock = name("lock")
    try:
        held = state.locks([lock], timeout=5, ttl=0.6)
        with pytest.raises(LockLost, match="no renewal was confirmed"), held:  # noqa: PT012
            held.check()
            outage.down()  # renewals fail from now on; the holder's clock keeps running
            assert _wait_for(lambda: _lost(held)), "check() passed long after the TTL ran out"
            outage.up()  # the store answers again: too late, whatever it says now
            with pytest.raises(LockLost):
                held.check()
        assert outage.failed, "renewals were attempted during the outage"
        assert state.lock_holders([lock]) == {lock: None}
    finally:
        if store.kind != "memory":
            state.close()


def test_the_async_lock_set_is_lost_when_its_ttl_passes_while_renewals_fail(store: Store) -> None:
    async def main() -> None:
        inner = store.backend().open_async() if store.kind == "memory" else None
        outage = Outage(inner if inner is not None else al.connect_async(store.url), "extend_locks")
        s = al.AsyncSharedState(outage)  # type: ignore[arg-type]
        lock = name("lock")
        try:
            held = s.locks([lock], timeout=5, ttl=0.6)
            with pytest.raises(LockLost):  # noqa: PT012 - the holder's whole block
                async with held:
                    held.check()
                    outage.down()
                    for _ in range(300):
                        try:
                            held.check()
                        except LockLost:
                            break
                        await asyncio.sleep(0.05)
                    outage.up()
                    held.check()  # raises: the TTL passed without a confirmed renewal
                    pytest.fail("check() passed long after the TTL ran out")
        finally:
            if inner is None:
                await s.close()

    asyncio.run(main())


# -- no lock across a model call --------------------------------------------------------------


def test_a_model_call_under_a_lock_is_refused_or_warned(
    state: al.SharedState, caplog: pytest.LogCaptureFixture
) -> None:
    @al.model_call
    def plan(prompt: str) -> str:
        return prompt.upper()

    assert plan("go") == "GO"
    with state.locks([name("lock")], timeout=5) as held:
        assert al.held_locks() == held.names
        with pytest.raises(LockHeldAcrossModelCall):
            plan("go")
        with pytest.raises(LockHeldAcrossModelCall):
            al.model_call().__enter__()
        with caplog.at_level(logging.WARNING, "agentlease.guards"), al.model_call(on_lock="warn"):
            pass
        assert "holding locks" in caplog.text
    assert al.held_locks() == ()
    assert plan("after") == "AFTER"


def test_the_async_face(store: Store) -> None:
    async def main() -> None:
        backend = store.backend().open_async() if store.kind == "memory" else None
        s = (
            al.AsyncSharedState(backend)
            if backend is not None
            else al.AsyncSharedState.connect(store.url)
        )
        try:
            key, lock, cap = name("doc"), name("lock"), name("cap")
            assert await s.compare_and_set(key, 0, {"n": 1}) == 1
            got = await s.update(key, lambda v: {**v, "n": v["n"] + 1})  # type: ignore[operator]
            assert got == al.Versioned({"n": 2}, 2)
            assert await s.reserve(cap, limit=1) == 1
            with pytest.raises(LimitReached):
                await s.reserve(cap, limit=1)

            @al.model_call
            async def think() -> int:
                return 1

            async with s.locks([lock], timeout=5) as held:
                assert held.tokens[lock] >= 1
                with pytest.raises(LockHeldAcrossModelCall):
                    await think()
            assert await think() == 1
        finally:
            if backend is None:
                await s.close()

    asyncio.run(main())
