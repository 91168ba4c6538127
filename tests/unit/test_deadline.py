"""Deadlines: nesting only shortens, sync code learns of them, async blocks are cancelled."""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import agentlease as al


def test_no_deadline_means_no_bound() -> None:
    assert al.remaining() is None
    assert al.call_timeout() is None
    assert al.call_timeout(7.0) == 7.0
    al.check_deadline()


def test_nested_deadlines_only_shorten() -> None:
    with al.deadline(10) as outer:
        assert outer.at is not None
        with al.deadline(100) as inner:
            assert inner.at == outer.at
        with al.deadline(1) as short:
            left = al.remaining()
            assert left is not None
            assert left <= 1.0
            assert short.at is not None
            assert short.at < outer.at
        left = al.remaining()
        assert left is not None
        assert 1.0 < left <= 10.0
    assert al.remaining() is None


def test_sync_code_sees_the_deadline_pass() -> None:
    with al.deadline(0.05):
        timeout = al.call_timeout(30.0)
        assert timeout is not None
        assert timeout <= 0.05
        time.sleep(0.06)
        assert al.remaining() == 0.0
        with pytest.raises(al.DeadlineExceeded) as caught:
            al.check_deadline()
        with pytest.raises(al.DeadlineExceeded):
            al.call_timeout(30.0)
    payload = caught.value.payload()
    assert payload["reason"] == "deadline"
    assert payload["do_not_retry"] is True
    json.dumps(payload)


def test_the_deadline_follows_a_copied_context_into_a_thread() -> None:
    with al.deadline(5), ThreadPoolExecutor(1) as pool:
        seen = pool.submit(contextvars.copy_context().run, al.remaining).result()
    assert seen is not None
    assert 0 < seen <= 5


async def test_async_block_is_cancelled_at_the_deadline() -> None:
    reached = []

    async def work() -> None:
        async with al.deadline(0.05):
            await asyncio.sleep(5)
            reached.append(True)

    with pytest.raises(al.DeadlineExceeded):
        await work()
    assert reached == []
    assert al.remaining() is None


async def test_async_deadline_reaches_child_tasks() -> None:
    async def child() -> float | None:
        return al.remaining()

    async with al.deadline(3):
        left = await asyncio.create_task(child())
    assert left is not None
    assert 0 < left <= 3


async def test_async_block_that_ends_in_time_raises_nothing() -> None:
    async with al.deadline(5) as d:
        await asyncio.sleep(0)
    assert not d.expired


def test_bad_seconds_are_refused() -> None:
    for bad in (0, -1, float("nan"), float("inf"), "5"):
        with pytest.raises(al.InvalidDuration):
            al.deadline(bad)  # type: ignore[arg-type]


def test_tool_unavailable_renders_for_a_model() -> None:
    exc = al.CircuitOpen("payments-api", "open", 5, 12.5, tool="charge")
    payload = exc.payload()
    assert payload == {
        "error": "CircuitOpen",
        "reason": "circuit_open",
        "tool": "charge",
        "dependency": "payments-api",
        "retry_after_s": 12.5,
        "do_not_retry": True,
        "message": exc.message,
        "state": "open",
        "failures": 5,
    }
    text = exc.as_tool_result()
    assert text.startswith("The tool 'charge' is unavailable (circuit_open)")
    assert json.loads(text.splitlines()[1]) == payload
    budget = al.RetryBudgetExhausted("root-1", 30, 3, 3.0)
    assert budget.payload()["calls"] == 30
    assert budget.payload()["retry_after_s"] is None
    assert isinstance(budget, al.ToolUnavailable)
    spend = al.BudgetExceeded("root-1", "usd", 1000, 900, 200)
    assert spend.payload()["limit"] == 1000
    assert "usd" in str(spend)


def test_lock_waits_and_idempotent_actions_end_at_the_deadline() -> None:
    backend = al.MemoryBackend()
    state = al.SharedState(backend)
    keys = al.Idempotency(backend)
    # another owner waits for a held lock: the deadline, not the 30 s timeout, ends the wait
    with (
        state.locks(["printer"], timeout=1),
        al.deadline(0.1),
        pytest.raises(al.DeadlineExceeded),
        state.locks(["printer"], timeout=30),
    ):
        pass
    with al.deadline(0.01):
        time.sleep(0.02)
        with pytest.raises(al.DeadlineExceeded), al.idempotency_scope(task_id="t1", step="s1"):
            keys.begin(tool="email", args={"to": "a@example.com"})
        with pytest.raises(al.DeadlineExceeded):
            state.locks(["other"], timeout=5).__enter__()
    assert state.lock_holders(["other"]) == {"other": None}
