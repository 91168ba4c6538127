"""The library's monotonic clock: real by default, another only in the context that sets it."""

from __future__ import annotations

import asyncio
import threading
import time

from agentlease import _clock


def test_the_default_is_the_real_monotonic_clock() -> None:
    before = time.monotonic()
    now = _clock.monotonic()
    assert before <= now <= time.monotonic()


def test_a_context_clock_reaches_its_tasks_and_not_other_threads() -> None:
    seen: dict[str, float] = {}

    def elsewhere() -> None:
        seen["thread"] = _clock.monotonic()

    async def main() -> None:
        async def task() -> None:
            seen["task"] = _clock.monotonic()

        await asyncio.create_task(task())
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()

    with _clock.using(lambda: 42.0):
        seen["here"] = _clock.monotonic()
        asyncio.run(main())
    seen["after"] = _clock.monotonic()
    assert seen["here"] == seen["task"] == 42.0
    assert seen["thread"] != 42.0
    assert seen["after"] != 42.0
