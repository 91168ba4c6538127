"""The shared renewer: a lease shorter than those it sleeps for wakes it, longer ones do not; a
lease whose renewals fail is lost at its local deadline, for good."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest

from agentlease import BackendUnavailable, LockLost
from agentlease._renewal import MARGIN, AsyncRenewals, Renewals, Renewing


def _lapsed(lease: object) -> Exception:
    return LockLost((str(lease),), "local deadline passed")


def _wait(condition: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_a_shorter_lease_wakes_the_renewer_and_a_longer_one_does_not() -> None:
    renewed = Counter[str]()
    lock = threading.Lock()

    def renew(entry: Renewing) -> None:
        with lock:
            renewed[entry.lease] += 1

    renewals = Renewals(renew, _lapsed)
    try:
        slow = renewals.open("slow", 90.0)  # the renewer now sleeps 15 s
        assert _wait(lambda: renewals._wakes_at > time.monotonic() + 10), "asleep for 15 s"
        late = renewals._too_late(Renewing("other", 90.0, time.monotonic()))
        assert not late, "a lease as long as the others needs no wake-up"
        fast = renewals.open("fast", 0.3)
        assert _wait(lambda: renewed["fast"] >= 3), "the short lease was renewed in time"
        assert renewed["slow"] == 0
        renewals.close(fast)
        renewals.close(slow)
    finally:
        renewals.stop()


async def test_the_async_renewer_is_woken_by_a_shorter_lease() -> None:
    renewed = Counter[str]()

    async def renew(entry: Renewing) -> None:
        renewed[entry.lease] += 1

    renewals = AsyncRenewals(renew, _lapsed)
    try:
        slow = renewals.open("slow", 90.0)
        await asyncio.sleep(0.05)  # the renewer goes to sleep for 15 s
        fast = renewals.open("fast", 0.3)
        for _ in range(100):
            if renewed["fast"] >= 3:
                break
            await asyncio.sleep(0.05)
        assert renewed["fast"] >= 3
        assert renewed["slow"] == 0
        await renewals.close(fast)
        await renewals.close(slow)
    finally:
        await renewals.stop()


def test_a_renewal_counts_from_when_it_was_sent() -> None:
    sent_at: list[float] = []

    def renew(entry: Renewing) -> None:
        sent_at.append(time.monotonic())
        time.sleep(0.15)  # a slow round trip: the store renewed the lease at its start

    renewals = Renewals(renew, _lapsed)
    try:
        entry = renewals.open("slow trip", 0.9)
        assert _wait(lambda: len(sent_at) >= 1 and entry.renewed_at >= sent_at[0] - 0.1)
        renewed_at = entry.renewed_at
        # Just before a request left (not when its reply came back, 0.15 s later).
        assert any(0 <= s - renewed_at < 0.1 for s in sent_at), (renewed_at, sent_at)
        assert entry.deadline == pytest.approx(renewed_at + 0.9 * (1 - MARGIN))
        renewals.close(entry)
    finally:
        renewals.stop()


def test_a_lease_is_lost_at_its_local_deadline_and_a_late_renewal_does_not_revive_it() -> None:
    store_down = threading.Event()
    store_down.set()
    slow_reply = threading.Event()

    def renew(entry: Renewing) -> None:
        if store_down.is_set():
            raise BackendUnavailable("the store does not answer")
        if slow_reply.is_set():
            time.sleep(0.5)  # its reply comes after the deadline

    renewals = Renewals(renew, _lapsed)
    try:
        sent = time.monotonic()
        entry = renewals.open("locks", 0.6, sent=sent)
        renewals.check(entry)  # held
        assert _wait(lambda: _raises(renewals.check, entry), timeout=10), "lost at the deadline"
        assert time.monotonic() >= sent + 0.6 * (1 - MARGIN)
        store_down.clear()  # the store answers again: too late
        time.sleep(0.3)
        with pytest.raises(LockLost, match="local deadline"):
            renewals.check(entry)
        with pytest.raises(LockLost):
            renewals.close(entry)

        # A renewal sent in time whose reply arrives after the deadline does not count.
        slow_reply.set()
        other = renewals.open("other", 0.6)
        assert _wait(lambda: _raises(renewals.check, other), timeout=10)
        time.sleep(0.6)  # the late reply lands
        with pytest.raises(LockLost):
            renewals.check(other)
    finally:
        renewals.stop()


async def test_the_async_renewer_loses_a_lease_at_its_local_deadline() -> None:
    async def renew(entry: Renewing) -> None:
        raise BackendUnavailable("the store does not answer")

    renewals = AsyncRenewals(renew, _lapsed)
    try:
        entry = renewals.open("locks", 0.6)
        renewals.check(entry)
        for _ in range(200):
            if _raises(renewals.check, entry):
                break
            await asyncio.sleep(0.05)
        with pytest.raises(LockLost):
            await renewals.close(entry)
    finally:
        await renewals.stop()


def _raises(check: object, entry: Renewing) -> bool:
    try:
        check(entry)  # type: ignore[operator]
    except LockLost:
        return True
    return False


def test_stop_never_waits_for_a_hung_renewal_longer_than_its_timeout() -> None:
    entered = threading.Event()
    release = threading.Event()

    def hung(entry: Renewing) -> None:
        entered.set()
        release.wait(30)  # a store call that does not come back

    renewals = Renewals(hung, lambda lease: LockLost(("x",), "lapsed"))
    renewals.open("lease", 0.3)
    assert entered.wait(5)
    started = time.monotonic()
    renewals.stop(timeout=0.5)
    assert time.monotonic() - started < 2.0
    release.set()


async def test_the_async_stop_never_waits_for_a_hung_renewal_longer_than_its_timeout() -> None:
    entered = asyncio.Event()

    async def hung(entry: Renewing) -> None:
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(30)  # a call that does not unwind when cancelled

    renewals = AsyncRenewals(hung, lambda lease: LockLost(("x",), "lapsed"))
    renewals.open("lease", 0.3)
    await asyncio.wait_for(entered.wait(), 5)
    started = time.monotonic()
    await renewals.stop(timeout=0.5)
    assert time.monotonic() - started < 2.0
