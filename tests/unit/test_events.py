"""The event dispatcher: emitting never blocks or runs user code; overflow is counted and said."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import agentlease as al
from agentlease._events import EventDispatcher, Events


def test_emit_never_waits_for_a_blocked_callback_and_counts_what_it_drops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    delivered: list[int] = []

    def blocked(event: al.Event) -> None:
        release.wait(10)
        delivered.append(event.attempt)

    dispatcher = EventDispatcher(Events(blocked), capacity=3)
    dispatcher.start()
    started = time.monotonic()
    for attempt in range(1, 21):
        dispatcher.emit("extended", "q", "t", attempt)
    assert time.monotonic() - started < 1.0, "emit waited for the callback"
    # One event is being delivered (blocked), three wait; the rest were dropped and counted.
    assert 15 <= dispatcher.dropped <= 17
    release.set()
    with caplog.at_level(logging.WARNING, logger="agentlease"):
        dispatcher.stop()
    assert len(delivered) == 20 - dispatcher.dropped
    assert delivered == sorted(delivered)
    reports = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert reports
    assert f"({dispatcher.dropped} in all)" in reports[-1]


def test_a_raising_callback_does_not_stop_delivery() -> None:
    seen: list[str] = []

    def callback(event: al.Event) -> None:
        seen.append(event.name)
        raise RuntimeError("the callback's own bug")

    dispatcher = EventDispatcher(Events(callback))
    dispatcher.start()
    dispatcher.emit("claimed", "q", "t", 1)
    dispatcher.emit("completed", "q", "t", 1)
    dispatcher.stop()
    assert seen == ["claimed", "completed"]
    assert dispatcher.dropped == 0
