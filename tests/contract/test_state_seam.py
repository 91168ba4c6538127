"""The contract of the shared-state primitives at the storage seam, on every backend.

Versioned records, bounded counters and lock sets: each primitive one atomic step, every refusal
typed and changing nothing. No fake clock: a lock meant to run out is ``SHORT`` and the test
sleeps ``PAST`` it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

import agentlease as al
from agentlease import ConflictError, FencedOff, LimitReached, TransitionRefused
from agentlease._records import LockBusy, RecordWrite
from tests.conftest import Store

SHORT = 0.3
PAST = 0.5
LIVE = 30.0


@pytest.fixture
def backend(store: Store) -> Iterator[al.Backend]:
    b = store.backend()
    yield b
    if store.kind != "memory":
        b.close()


def name(prefix: str = "r") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def w(**fields: bytes) -> dict[str, bytes]:
    return dict(fields)


# -- versioned records -----------------------------------------------------------------------


def test_an_absent_record_reads_as_none_and_is_created_at_version_one(backend: al.Backend) -> None:
    key = name()
    assert backend.get_record(key) is None
    rec = backend.write_record(key, RecordWrite(w(a=b"1", b=b'"x"'), expected_version=0))
    assert rec.version == 1
    assert rec.fields == {"a": b"1", "b": b'"x"'}
    assert rec.value == {"a": 1, "b": "x"}
    assert rec.fence == 0
    got = backend.get_record(key)
    assert got is not None
    assert got.version == 1
    assert got.fields == rec.fields


def test_compare_and_set_refuses_a_moved_version_and_reports_the_current_state(
    backend: al.Backend,
) -> None:
    key = name()
    backend.write_record(key, RecordWrite(w(n=b"1"), expected_version=0))
    backend.write_record(key, RecordWrite(w(n=b"2"), expected_version=1, replace=True))
    with pytest.raises(ConflictError) as info:
        backend.write_record(key, RecordWrite(w(n=b"99"), expected_version=1, replace=True))
    assert info.value.current_version == 2
    assert info.value.current_value == {"n": 2}
    assert info.value.expected_version == 1
    with pytest.raises(ConflictError) as created:
        backend.write_record(key, RecordWrite(w(n=b"0"), expected_version=0))
    assert created.value.current_version == 2
    got = backend.get_record(key)
    assert got is not None
    assert got.version == 2
    assert got.value == {"n": 2}
    absent = name()
    with pytest.raises(ConflictError) as missing:
        backend.write_record(absent, RecordWrite(w(n=b"1"), expected_version=3))
    assert missing.value.current_version == 0
    assert missing.value.current_value is None
    assert backend.get_record(absent) is None


def test_field_writes_merge_and_replace_drops_other_fields(backend: al.Backend) -> None:
    key = name()
    backend.write_record(key, RecordWrite(w(a=b"1")))
    backend.write_record(key, RecordWrite(w(b=b"2")))  # a blind field write: no version
    got = backend.get_record(key)
    assert got is not None
    assert got.value == {"a": 1, "b": 2}
    assert got.version == 2
    rec = backend.write_record(key, RecordWrite(w(c=b"3"), replace=True, expected_version=2))
    assert rec.value == {"c": 3}
    assert rec.version == 3


def test_two_writers_of_different_fields_both_survive(store: Store) -> None:
    key = name()
    backends = [store.backend() for _ in range(4)]
    try:
        threads = [
            threading.Thread(
                target=lambda b=b, i=i: [
                    b.write_record(key, RecordWrite({f"f{i}": str(j).encode()})) for j in range(20)
                ]
            )
            for i, b in enumerate(backends)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = backends[0].get_record(key)
        assert got is not None
        assert got.value == {f"f{i}": 19 for i in range(4)}
        assert got.version == 80
    finally:
        if store.kind != "memory":
            for b in backends:
                b.close()


def test_a_transition_guard_is_checked_with_the_write(backend: al.Backend) -> None:
    key = name()
    draft, review, done = b'"draft"', b'"review"', b'"done"'
    backend.write_record(
        key, RecordWrite({"status": draft}, guard_field="status", allowed_from=(None,))
    )
    backend.write_record(
        key, RecordWrite({"status": review}, guard_field="status", allowed_from=(draft, review))
    )
    with pytest.raises(TransitionRefused) as info:
        backend.write_record(
            key, RecordWrite({"status": draft}, guard_field="status", allowed_from=(None,))
        )
    assert info.value.current == "review"
    assert info.value.target == "draft"
    assert info.value.field == "status"
    with pytest.raises(ConflictError):  # the version is checked before the transition
        backend.write_record(
            key,
            RecordWrite(
                {"status": done}, expected_version=1, guard_field="status", allowed_from=(review,)
            ),
        )
    rec = backend.write_record(
        key,
        RecordWrite(
            {"status": done}, expected_version=2, guard_field="status", allowed_from=(review,)
        ),
    )
    assert rec.value == {"status": "done"}
    assert rec.version == 3


def test_a_write_with_an_older_fence_is_refused(backend: al.Backend) -> None:
    key = name()
    assert backend.write_record(key, RecordWrite(w(v=b"1"), fence=5)).fence == 5
    assert backend.write_record(key, RecordWrite(w(v=b"2"), fence=5)).fence == 5
    assert backend.write_record(key, RecordWrite(w(v=b"3"))).fence == 5  # unfenced write
    with pytest.raises(FencedOff) as info:
        backend.write_record(key, RecordWrite(w(v=b"4"), fence=4))
    assert info.value.fence == 4
    assert info.value.current_fence == 5
    assert backend.write_record(key, RecordWrite(w(v=b"5"), fence=6)).fence == 6
    got = backend.get_record(key)
    assert got is not None
    assert got.value == {"v": 5}
    assert got.version == 4


def test_compare_and_set_races_have_one_winner_per_version(store: Store) -> None:
    key = name()
    backends = [store.backend() for _ in range(6)]
    backends[0].write_record(key, RecordWrite(w(n=b"0"), expected_version=0))
    wins: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(len(backends))

    def attempt(b: al.Backend, i: int) -> None:
        start.wait()
        try:
            b.write_record(key, RecordWrite(w(n=str(i).encode()), expected_version=1))
        except ConflictError:
            return
        with lock:
            wins.append(i)

    threads = [threading.Thread(target=attempt, args=(b, i)) for i, b in enumerate(backends)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1
        got = backends[0].get_record(key)
        assert got is not None
        assert got.version == 2
        assert got.value == {"n": wins[0]}
    finally:
        if store.kind != "memory":
            for b in backends:
                b.close()


# -- bounded counters ------------------------------------------------------------------------


def test_a_counter_refuses_to_leave_its_range(backend: al.Backend) -> None:
    c = name("c")
    assert backend.get_counter(c) == 0
    assert backend.add_counter(c, 3, None, 4) == 3
    with pytest.raises(LimitReached) as info:
        backend.add_counter(c, 2, None, 4)
    assert info.value.value == 3
    assert info.value.delta == 2
    assert info.value.high == 4
    assert backend.add_counter(c, 1, None, 4) == 4
    assert backend.add_counter(c, -3, 1, None) == 1
    with pytest.raises(LimitReached):
        backend.add_counter(c, -1, 1, None)
    assert backend.get_counter(c) == 1
    assert backend.add_counter(c, -1, None, None) == 0


def test_concurrent_reservations_never_pass_the_limit(store: Store) -> None:
    c = name("c")
    backends = [store.backend() for _ in range(6)]
    granted: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(len(backends))

    def take(b: al.Backend) -> None:
        start.wait()
        for _ in range(10):
            try:
                b.add_counter(c, 1, None, 25)
            except LimitReached:
                continue
            with lock:
                granted.append(1)

    threads = [threading.Thread(target=take, args=(b,)) for b in backends]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(granted) == 25
        assert backends[0].get_counter(c) == 25
    finally:
        if store.kind != "memory":
            for b in backends:
                b.close()


# -- lock sets -------------------------------------------------------------------------------


def test_a_lock_set_is_all_or_nothing_with_increasing_tokens(backend: al.Backend) -> None:
    a, b, c = sorted(name("l") for _ in range(3))
    first = backend.acquire_locks([a, b], "one", LIVE)
    assert isinstance(first, list)
    assert first == [1, 1]
    busy = backend.acquire_locks([b, c], "two", LIVE)
    assert isinstance(busy, LockBusy)
    assert busy.name == b
    assert busy.holder == "one"
    assert 0 < busy.retry_after <= LIVE
    assert backend.lock_holders([a, b, c])[2] is None  # c was not taken: all or nothing
    assert backend.release_locks([a, b], "one") == []
    second = backend.acquire_locks([b, c], "two", LIVE)
    assert second == [2, 1]
    holders = backend.lock_holders([a, b, c])
    assert holders[0] is None
    assert holders[1] is not None
    assert holders[1][0] == "two"


def test_release_and_extend_by_a_non_owner_change_nothing(backend: al.Backend) -> None:
    a = name("l")
    assert isinstance(backend.acquire_locks([a], "owner", LIVE), list)
    assert backend.release_locks([a], "intruder") == [a]
    assert backend.extend_locks([a], "intruder", LIVE) == [a]
    holder = backend.lock_holders([a])[0]
    assert holder is not None
    assert holder[0] == "owner"
    assert backend.extend_locks([a], "owner", LIVE) == []
    assert backend.release_locks([a], "owner") == []
    assert backend.release_locks([a], "owner") == [a]  # no longer held


def test_an_expired_lock_is_free_and_its_holder_loses_it(backend: al.Backend) -> None:
    a = name("l")
    assert backend.acquire_locks([a], "crashed", SHORT) == [1]
    time.sleep(PAST)
    assert backend.lock_holders([a]) == [None]
    assert backend.acquire_locks([a], "next", LIVE) == [2]
    assert backend.extend_locks([a], "crashed", LIVE) == [a]
    assert backend.release_locks([a], "crashed") == [a]
    holder = backend.lock_holders([a])[0]
    assert holder is not None
    assert holder[0] == "next"


def test_sweep_frees_expired_locks_only_and_tokens_keep_rising(backend: al.Backend) -> None:
    old, live = sorted(name("l") for _ in range(2))
    assert backend.acquire_locks([old], "x", SHORT) == [1]
    assert backend.acquire_locks([live], "y", LIVE) == [1]
    time.sleep(PAST)
    assert backend.sweep_locks(100) >= 1
    assert backend.lock_holders([old, live])[0] is None
    assert backend.lock_holders([old, live])[1] is not None
    assert backend.acquire_locks([old], "z", LIVE) == [2]


def test_reacquiring_a_held_lock_renews_it_with_a_new_token(backend: al.Backend) -> None:
    a = name("l")
    assert backend.acquire_locks([a], "me", LIVE) == [1]
    assert backend.acquire_locks([a], "me", LIVE) == [2]


def test_concurrent_acquisitions_of_overlapping_sets_grant_each_lock_once(store: Store) -> None:
    names = sorted(name("l") for _ in range(3))
    backends = [store.backend() for _ in range(6)]
    held: dict[str, str] = {}
    overlaps: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(len(backends))

    def run(b: al.Backend, i: int) -> None:
        owner = f"o{i}"
        want = sorted({names[i % 3], names[(i + 1) % 3]})
        start.wait()
        for _ in range(15):
            got = b.acquire_locks(want, owner, LIVE)
            if isinstance(got, LockBusy):
                time.sleep(0.001)
                continue
            with lock:
                for n in want:
                    if n in held:
                        overlaps.append(n)
                    held[n] = owner
            time.sleep(0.001)
            with lock:
                for n in want:
                    held.pop(n, None)
            assert b.release_locks(want, owner) == []

    threads = [threading.Thread(target=run, args=(b, i)) for i, b in enumerate(backends)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert overlaps == []
    finally:
        if store.kind != "memory":
            for b in backends:
                b.close()


def test_the_async_face_has_the_same_primitives(store: Store) -> None:
    import asyncio

    async def main() -> None:
        b = al.connect_async(store.url) if store.kind != "memory" else store.backend().open_async()
        try:
            key, c, lk = name(), name("c"), name("l")
            rec = await b.write_record(key, RecordWrite(w(a=b"1"), expected_version=0))
            assert rec.version == 1
            got = await b.get_record(key)
            assert got is not None
            assert got.value == {"a": 1}
            assert await b.add_counter(c, 2, 0, 5) == 2
            assert await b.get_counter(c) == 2
            assert await b.acquire_locks([lk], "me", LIVE) == [1]
            assert await b.extend_locks([lk], "me", LIVE) == []
            holders = await b.lock_holders([lk])
            assert holders[0] is not None
            assert await b.release_locks([lk], "me") == []
            assert await b.sweep_locks(10) >= 0
        finally:
            if store.kind != "memory":
                await b.close()

    asyncio.run(main())
