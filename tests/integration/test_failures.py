"""Failures an operator can read: the stored error keeps the traceback, the log shows it."""

from __future__ import annotations

import logging
import time

import pytest

import agentlease as al
from agentlease._async.queue import MAX_MESSAGE, MAX_TRACEBACK
from agentlease.backends.memory import MemoryBackend


def charge_card(order: str) -> None:
    raise RuntimeError(f"card declined for {order}")


def test_a_failed_attempt_is_logged_with_its_traceback_and_stored_with_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = al.Queue(MemoryBackend())
    queue.enqueue("q", {"order": "o7"}, id="o7")

    def handler(ctx: al.JobContext) -> al.JSON:
        charge_card(ctx.payload["order"])  # type: ignore[index]
        return None

    policy = al.RetryPolicy(max_failures=2, base=0.01, cap=0.01)
    settings = al.WorkerSettings(retry=policy)
    with caplog.at_level(logging.INFO, logger="agentlease"):
        for _ in range(100):  # burst runs end while the retry waits: run again until it is dead
            al.Worker(queue, "q", handler, settings=settings).run(burst=True, handle_signals=False)
            if queue.get("o7").state == "dead":
                break
            time.sleep(0.02)
    failed = [r for r in caplog.records if getattr(r, "agentlease_event", None) == "failed"]
    dead = [r for r in caplog.records if getattr(r, "agentlease_event", None) == "dead_lettered"]
    assert failed
    assert len(dead) == 1
    for record in [*failed, *dead]:
        assert "RuntimeError: card declined for o7" in record.getMessage()
        assert record.exc_info is not None
        assert "charge_card" in caplog.text  # the traceback names the function that raised
    assert dead[0].levelno == logging.ERROR
    task = queue.get("o7")
    assert task.state == "dead"
    assert isinstance(task.error, dict)
    assert task.error["type"] == "RuntimeError"
    assert task.error["message"] == "card declined for o7"
    assert "in charge_card" in task.error["traceback"]
    assert task.error["traceback"].rstrip().endswith("RuntimeError: card declined for o7")
    queue.close()


def test_a_huge_message_and_traceback_are_kept_bounded() -> None:
    queue = al.Queue(MemoryBackend())
    queue.enqueue("q", None, id="t")
    (job,) = queue.claim("q")

    def deep(n: int) -> None:
        if n == 0:
            raise ValueError("x" * 100_000)
        deep(n - 1)

    try:
        deep(400)
    except ValueError as exc:
        queue.fail(job.lease, exc, retry_in=None)
    error = queue.get("t").error
    assert isinstance(error, dict)
    assert len(error["message"]) <= MAX_MESSAGE + 4
    assert error["message"].startswith("...\n")
    assert len(error["traceback"]) <= MAX_TRACEBACK + 4
    assert error["traceback"].rstrip().endswith("x")  # the end (the error itself) is kept
    queue.close()


def test_a_string_error_has_no_traceback() -> None:
    queue = al.Queue(MemoryBackend())
    queue.enqueue("q", None, id="t")
    (job,) = queue.claim("q")
    queue.fail(job.lease, "gave up", retry_in=None)
    assert queue.get("t").error == {"type": "Error", "message": "gave up"}
    queue.close()
