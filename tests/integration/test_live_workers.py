"""Live workers and attempt histories with real worker processes (``agentlease worker``) on the
stores several processes share: each worker is listed while it runs, with the tasks in its
hands; ``inspect`` names the worker holding each lease; a SIGTERMed worker removes its entry at
once, a SIGKILLed one is listed until its entry's TTL lapses; and every attempt of a task is
recorded with the worker that ran it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentlease.cli import cli
from tests.conftest import Store

Q = "live"
HANDLERS = """
import asyncio

async def handle(ctx):
    kind = ctx.payload["kind"]
    if kind == "flaky" and ctx.attempt == 1:
        raise ValueError("the first try fails")
    if kind == "hold":
        await asyncio.sleep(120)
    return {"kind": kind, "attempt": ctx.attempt}
"""


def _until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll ``check`` until it returns something truthy (a bound, not a speed assertion)."""
    give_up = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _cli_json(url: str, *args: str) -> Any:
    result = CliRunner().invoke(cli, [*args, "--json", "--backend", url], catch_exceptions=False)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start ``agentlease worker`` processes on the test's handler module; all are ended."""
    (tmp_path / "live_handlers.py").write_text(textwrap.dedent(HANDLERS))
    started: list[subprocess.Popen[bytes]] = []

    def start(url: str, *options: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "agentlease", "worker", "live_handlers:handle"]
        argv += ["--backend", url, "--queue", Q, "--poll-interval", "0.05", *options]
        proc = subprocess.Popen(
            argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


def _entry(url: str, pid: int) -> dict[str, Any] | None:
    for w in _cli_json(url, "workers"):
        if w["pid"] == pid:
            return w
    return None


def _holders(url: str) -> dict[str, str | None]:
    return {lease["task_id"]: lease["holder"] for lease in _cli_json(url, "inspect", Q)}


def test_two_worker_processes_registry_holders_and_attempts(
    store: Store, spawn: Callable[..., subprocess.Popen[bytes]]
) -> None:
    if store.kind == "memory":
        pytest.skip("the memory store lives in one process")
    url = store.url
    q = store.queue()
    q.enqueue(Q, {"kind": "hold"}, id="h1")
    # A: one slot, a short lease (so a short TTL); B: two slots, a long lease (a long TTL).
    a = spawn(url, "--lease-for", "2", "--concurrency", "1", "--prefetch", "0")
    a_entry = _until("worker A's entry", lambda: _entry(url, a.pid))
    _until("A to hold h1", lambda: _holders(url).get("h1") == a_entry["id"])
    q.enqueue(Q, {"kind": "hold"}, id="h2")  # A is full: only B can take it
    b = spawn(url, "--lease-for", "30", "--concurrency", "2", "--prefetch", "0", "--grace", "0.2")
    b_entry = _until("worker B's entry", lambda: _entry(url, b.pid))
    _until("B to hold h2", lambda: _holders(url).get("h2") == b_entry["id"])
    a_id, b_id = a_entry["id"], b_entry["id"]
    assert a_id != b_id
    assert _holders(url) == {"h1": a_id, "h2": b_id}  # inspect names each holder

    # A task that fails once, then is done: two attempts, each with its worker (B's free slot).
    q.enqueue(Q, {"kind": "flaky"}, id="f")
    _until("f to be done", lambda: q.get("f").state == "done")
    flaky = q.get("f").attempts
    assert [(x.attempt, x.worker, x.outcome, x.error) for x in flaky] == [
        (1, b_id, "failed", "ValueError"),
        (2, b_id, "done", None),
    ]

    listed = {w["id"]: w for w in _cli_json(url, "workers")}
    assert set(listed) >= {a_id, b_id}
    assert listed[a_id]["queues"] == [Q]
    assert (listed[a_id]["concurrency"], listed[b_id]["concurrency"]) == (1, 2)
    _until("the entries to list the tasks in hand", lambda: _entry(url, a.pid)["tasks"] == ["h1"])
    _until("B's entry to list h2", lambda: _entry(url, b.pid)["tasks"] == ["h2"])

    # SIGTERM: B drains (its handler is cancelled after the grace, its lease given back) and
    # removes its entry: gone long before its 30 s TTL would have lapsed.
    b_until = q.backend.now() + _entry(url, b.pid)["expires_in"]
    b.send_signal(signal.SIGTERM)
    assert b.wait(timeout=30) == 0
    assert _entry(url, b.pid) is None
    assert q.backend.now() < b_until
    assert _entry(url, a.pid) is not None  # A still beats

    # SIGKILL: A cannot remove its entry: it is listed until its TTL lapses, then not.
    a_last = _entry(url, a.pid)
    assert a_last is not None
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=30)
    _until("A's entry to lapse", lambda: _entry(url, a.pid) is None)
    assert a_last["expires_in"] > 0
    # Its lease runs out too: the reaper takes h1 back, and its attempt ends "expired".
    _until("h1 to be reaped", lambda: q.reap(Q) or q.get("h1").state != "leased")
    assert [(x.worker, x.outcome) for x in q.get("h1").attempts] == [(a_id, "expired")]
    assert [(x.worker, x.outcome) for x in q.get("h2").attempts] == [(b_id, "released")]
    assert _cli_json(url, "show", "h1")["attempts"][0]["worker"] == a_id
