"""The shared renewer: a lease shorter than those it sleeps for wakes it; longer ones do not."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

from agentlease._renewal import AsyncRenewals, Renewals, Renewing


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

    renewals = Renewals(renew)
    try:
        slow = renewals.open("slow", 30.0)  # the renewer now sleeps 15 s
        assert _wait(lambda: renewals._wakes_at > time.monotonic() + 10), "asleep for 15 s"
        late = renewals._too_late(Renewing("other", 30.0))
        assert not late, "a lease as long as the others needs no wake-up"
        fast = renewals.open("fast", 0.1)
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

    renewals = AsyncRenewals(renew)
    try:
        slow = renewals.open("slow", 30.0)
        await asyncio.sleep(0.05)  # the renewer goes to sleep for 15 s
        fast = renewals.open("fast", 0.1)
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
