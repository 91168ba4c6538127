"""The contract of idempotency keys at the storage seam, held against every backend.

Like the queue's contract, these tests reach no backend internals and assume no fake clock: an
in-flight lease meant to run out is ``SHORT`` and the test sleeps ``PAST`` it. Store times are only
compared with other store times.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

import agentlease as al
from agentlease import ReservationLost
from agentlease._records import KeyHold, KeyRecord
from tests.conftest import Store

SHORT = 0.3
PAST = 0.5
LIVE = 30.0
DAY = 86_400.0
FP = "a" * 64
OTHER_FP = "b" * 64


@pytest.fixture
def backend(store: Store) -> Iterator[al.Backend]:
    b = store.backend()
    yield b
    if store.kind != "memory":
        b.close()


def new_key() -> str:
    return uuid.uuid4().hex * 2


def reserve(b: al.Backend, key: str, fp: str = FP, *, hold_for: float = LIVE) -> KeyHold:
    got = b.reserve_key(key, fp, "test", hold_for, DAY)
    assert isinstance(got, KeyHold), got
    return got


def record(b: al.Backend, key: str, fp: str = FP) -> KeyRecord:
    got = b.reserve_key(key, fp, "other", LIVE, DAY)
    assert isinstance(got, KeyRecord), got
    return got


def test_first_reserve_holds_and_a_second_sees_it_in_flight(backend: al.Backend) -> None:
    key = new_key()
    hold = reserve(backend, key)
    assert hold.fence == 1
    assert not hold.taken_over
    assert len(hold.token) >= 16
    seen = record(backend, key)
    assert seen.state == "in_flight"
    assert seen.fence == 1
    assert seen.holder == "test"
    assert seen.fingerprint == FP
    assert seen.expires_at is not None
    assert seen.expires_at > seen.now
    assert seen.expires_at == pytest.approx(hold.expires_at, abs=1e-3)
    assert seen.result_json is None
    assert seen.error_json is None
    got = backend.get_key(key)
    assert got is not None
    assert got.state == "in_flight"
    assert got.fence == 1


def test_complete_stores_the_result_and_replays_it(backend: al.Backend) -> None:
    key = new_key()
    hold = reserve(backend, key)
    backend.complete_key(hold, b'{"sent":true,"n":[1,2.5,"\\u00e9"]}', DAY)
    seen = record(backend, key)
    assert seen.state == "done"
    assert seen.result_json == b'{"sent":true,"n":[1,2.5,"\\u00e9"]}'
    assert seen.result == {"sent": True, "n": [1, 2.5, "é"]}
    assert seen.finished_at is not None
    assert seen.expires_at is None
    assert seen.purge_at > seen.now + DAY - 60


def test_a_done_key_with_no_result_replays_none(backend: al.Backend) -> None:
    key = new_key()
    backend.complete_key(reserve(backend, key), None, DAY)
    seen = record(backend, key)
    assert seen.state == "done"
    assert seen.result_json is None


def test_fail_stores_the_error(backend: al.Backend) -> None:
    key = new_key()
    hold = reserve(backend, key)
    backend.fail_key(hold, b'{"type":"x.Bad","message":"no"}', DAY)
    seen = record(backend, key)
    assert seen.state == "failed"
    assert seen.error == {"type": "x.Bad", "message": "no"}
    assert seen.result_json is None


@pytest.mark.parametrize("outcome", ["complete", "fail"])
def test_every_holder_write_after_the_outcome_is_refused(backend: al.Backend, outcome: str) -> None:
    key = new_key()
    hold = reserve(backend, key)
    if outcome == "complete":
        backend.complete_key(hold, b"1", DAY)
    else:
        backend.fail_key(hold, b"{}", DAY)
    state = "done" if outcome == "complete" else "failed"
    for write in (
        lambda: backend.complete_key(hold, b"2", DAY),
        lambda: backend.fail_key(hold, b"{}", DAY),
        lambda: backend.release_key(hold),
        lambda: backend.extend_key(hold, LIVE),
    ):
        with pytest.raises(ReservationLost) as info:
            write()
        assert info.value.state == state
        assert info.value.current_fence == 1
        assert info.value.key == key
        assert info.value.fence == 1
    seen = record(backend, key)
    assert seen.state == state
    assert seen.result_json == (b"1" if outcome == "complete" else None)


def test_a_different_fingerprint_is_reported_not_reserved(backend: al.Backend) -> None:
    key = new_key()
    hold = reserve(backend, key)
    seen = record(backend, key, OTHER_FP)
    assert seen.fingerprint == FP
    assert seen.state == "in_flight"
    backend.complete_key(hold, b"1", DAY)
    seen = record(backend, key, OTHER_FP)
    assert seen.fingerprint == FP
    assert seen.state == "done"


def test_release_lets_the_next_attempt_take_over_at_once(backend: al.Backend) -> None:
    key = new_key()
    first = reserve(backend, key)
    backend.release_key(first)
    seen = backend.get_key(key)
    assert seen is not None
    assert seen.state == "in_flight"
    assert seen.holder == ""
    second = reserve(backend, key, OTHER_FP)  # nothing applied: other arguments may take it
    assert second.fence == 2
    assert second.taken_over
    with pytest.raises(ReservationLost) as info:
        backend.complete_key(first, b"1", DAY)
    assert info.value.current_fence == 2
    assert info.value.state == "in_flight"
    backend.complete_key(second, b"2", DAY)
    assert record(backend, key, OTHER_FP).result_json == b"2"


def test_an_expired_reservation_is_taken_over_and_its_holder_fenced(backend: al.Backend) -> None:
    key = new_key()
    crashed = reserve(backend, key, hold_for=SHORT)
    assert record(backend, key).state == "in_flight"  # live: a duplicate
    time.sleep(PAST)
    taker = reserve(backend, key)
    assert taker.fence == 2
    assert taker.taken_over
    assert taker.token != crashed.token
    for write in (
        lambda: backend.complete_key(crashed, b"late", DAY),
        lambda: backend.fail_key(crashed, b"{}", DAY),
        lambda: backend.release_key(crashed),
        lambda: backend.extend_key(crashed, LIVE),
    ):
        with pytest.raises(ReservationLost) as info:
            write()
        assert info.value.fence == 1
        assert info.value.current_fence == 2
    backend.complete_key(taker, b"mine", DAY)
    assert record(backend, key).result_json == b"mine"


def test_an_expired_reservation_is_never_taken_over_with_other_arguments(
    backend: al.Backend,
) -> None:
    key = new_key()
    reserve(backend, key, hold_for=SHORT)
    time.sleep(PAST)
    seen = record(backend, key, OTHER_FP)
    assert seen.fingerprint == FP
    assert seen.fence == 1
    assert seen.expires_at is not None
    assert seen.expires_at <= seen.now


def test_a_late_holder_nobody_took_over_still_completes(backend: al.Backend) -> None:
    key = new_key()
    hold = reserve(backend, key, hold_for=SHORT)
    time.sleep(PAST)
    backend.complete_key(hold, b"1", DAY)  # the token, not the clock, decides
    assert record(backend, key).state == "done"


def test_extend_moves_the_in_flight_lease(backend: al.Backend) -> None:
    key = new_key()
    hold = reserve(backend, key, hold_for=SHORT)
    extended = backend.extend_key(hold, LIVE)
    assert extended.token == hold.token
    assert extended.fence == hold.fence
    assert extended.expires_at > hold.expires_at + LIVE / 2
    time.sleep(PAST)
    seen = record(backend, key)  # still live: a duplicate, not a takeover
    assert seen.state == "in_flight"
    assert seen.fence == 1
    assert seen.purge_at >= extended.expires_at


def test_a_fabricated_hold_on_an_absent_key_is_refused(backend: al.Backend) -> None:
    hold = KeyHold(new_key(), "f" * 32, 1, 0.0)
    with pytest.raises(ReservationLost) as info:
        backend.complete_key(hold, b"1", DAY)
    assert info.value.current_fence is None
    assert info.value.state is None
    assert backend.get_key(hold.key) is None


def test_a_key_past_its_window_is_absent_and_purged_without_touching_live_keys(
    backend: al.Backend,
) -> None:
    old, live = new_key(), new_key()
    got = backend.reserve_key(old, FP, "test", SHORT, SHORT)
    assert isinstance(got, KeyHold)
    backend.complete_key(got, b"1", SHORT)
    backend.complete_key(reserve(backend, live), b"2", DAY)
    time.sleep(2 * PAST)
    assert backend.get_key(old) is None
    purged = backend.purge_keys(1000)
    assert purged in (0, 1)  # 0 where the store expires keys itself (Redis TTL)
    assert backend.purge_keys(1000) == 0
    assert backend.get_key(old) is None
    live_rec = backend.get_key(live)
    assert live_rec is not None
    assert live_rec.result_json == b"2"
    again = reserve(backend, old, OTHER_FP)  # past the window: a new action, not a conflict
    assert again.fence >= 1
    assert not again.taken_over


def test_concurrent_reserves_of_one_key_give_one_hold(store: Store) -> None:
    key = new_key()
    backends = [store.backend() for _ in range(8)]
    results: list[object] = []
    lock = threading.Lock()
    start = threading.Barrier(len(backends))

    def attempt(b: al.Backend) -> None:
        start.wait()
        got = b.reserve_key(key, FP, threading.current_thread().name, LIVE, DAY)
        with lock:
            results.append(got)

    threads = [threading.Thread(target=attempt, args=(b,)) for b in backends]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    holds = [r for r in results if isinstance(r, KeyHold)]
    assert len(results) == 8
    assert len(holds) == 1
    assert all(
        isinstance(r, KeyRecord) and r.state == "in_flight" for r in results if r not in holds
    )
    if store.kind != "memory":
        for b in backends:
            b.close()


def test_the_async_face_has_the_same_primitives(store: Store) -> None:
    async def main() -> None:
        b = al.connect_async(store.url) if store.kind != "memory" else store.backend().open_async()
        try:
            key = new_key()
            hold = await b.reserve_key(key, FP, "a", LIVE, DAY)
            assert isinstance(hold, KeyHold)
            hold = await b.extend_key(hold, LIVE)
            await b.complete_key(hold, b"[1]", DAY)
            seen = await b.get_key(key)
            assert seen is not None
            assert seen.state == "done"
            assert seen.result == [1]
            again = await b.reserve_key(key, FP, "a", LIVE, DAY)
            assert isinstance(again, KeyRecord)
            assert again.result_json == b"[1]"
            other = new_key()
            h2 = await b.reserve_key(other, FP, "a", LIVE, DAY)
            assert isinstance(h2, KeyHold)
            await b.release_key(h2)
            h3 = await b.reserve_key(other, FP, "a", LIVE, DAY)
            assert isinstance(h3, KeyHold)
            assert h3.fence == 2
            await b.fail_key(h3, b'{"e":1}', DAY)
            assert (await b.get_key(other)) is not None
            assert await b.purge_keys(10) == 0
        finally:
            if store.kind != "memory":
                await b.close()

    asyncio.run(main())
