"""A deadline ends a whole tree of work, with real worker processes on real stores.

The test enqueues a parent task with a 2 s deadline. In one worker process its handler enqueues a
child (which inherits the root task and the deadline, on the store's clock); in another the
child's handler calls an ``@idempotent`` tool that sends its side effect to a remote service with
its idempotency key, fence and deadline. The remote service answers after the deadline, and
applies nothing that arrives, or would land, past the deadline of the request, or under a fence
older than one it has seen. Then:

- async: the parent's handler is cancelled at the deadline, the child's tool call too (its
  client's connection is gone when the remote answers); sync: the tool call's client timeout is
  ``al.call_timeout()``, so it gives up at the deadline, and the parent's handler, which ignores
  its cancel token, enqueues a second child after the deadline: that child never runs;
- every task of the tree is dead-lettered with reason ``deadline``; none is retried;
- the remote service applied nothing: the late side effect was refused.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import agentlease as al
from tests.acceptance._idempotency_child import read_ledger
from tests.acceptance.test_idempotency_processes import BOUND, Children, of

pytestmark = pytest.mark.xdist_group("processes")  # worker processes on a 2 s deadline

DEADLINE = 2.0
REMOTE_DELAY = DEADLINE + 0.8  # the remote service answers after the deadline


class Remote:
    """A service on loopback that applies a side effect once per key, refusing a request whose
    deadline has passed by the time it would apply, or whose fence is older than one seen."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self._fences: dict[str, int] = {}
        self._lock = threading.Lock()
        remote = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(REMOTE_DELAY)
                outcome = remote.apply(body)
                try:
                    self.send_response(200 if outcome == "applied" else 409)
                    self.end_headers()
                    self.wfile.write(outcome.encode())
                except OSError:
                    pass  # the caller gave up (cancelled or timed out): nobody is listening

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def apply(self, body: dict[str, Any]) -> str:
        with self._lock:
            now = time.time()
            if now >= body["deadline"]:
                outcome = "refused_late"
            elif body["fence"] < self._fences.get(body["key"], 0):
                outcome = "refused_stale"
            else:
                self._fences[body["key"]] = body["fence"]
                outcome = "applied"
            self.seen.append({**body, "at": now, "outcome": outcome})
            return outcome

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def remote() -> Iterator[Remote]:
    service = Remote()
    yield service
    service.close()


class WorkerChildren(Children):
    module = "tests.acceptance._deadline_child"


def _reason(task: al.Task) -> object:
    error = task.error
    return error.get("reason") if isinstance(error, dict) else None


@pytest.mark.parametrize("face", ["async", "sync"])
def test_a_deadline_ends_the_tree_and_nothing_lands_late(
    url: str, face: str, remote: Remote, tmp_path: Path
) -> None:
    path = tmp_path / "ledger.jsonl"
    kids = WorkerChildren(tmp_path)
    expected = ["p", "p.child"] + (["p.late-child"] if face == "sync" else [])
    try:
        for name in ("parents", "children"):
            kids.spawn(url, face, name, remote.url, path)
        kids.wait_for("both workers ready", lambda: len(of(read_ledger(path), "ready")) == 2)
        with al.Queue.connect(url) as queue:
            queue.enqueue("parents", {}, id="p", deadline=DEADLINE)

            def ended() -> bool:
                try:
                    return all(queue.get(t).state == "dead" for t in expected)
                except al.UnknownTask:
                    return False

            kids.wait_for("every task of the tree dead-lettered", ended)
            tasks = {t: queue.get(t) for t in expected}
        time.sleep(REMOTE_DELAY - DEADLINE + 0.3)  # the remote's late answers are in
    finally:
        try:
            for proc in kids.procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in kids.procs:
                kids.finish(proc)
        finally:
            kids.reap()  # a child that did not exit is killed here, not left to a later test
    lines = read_ledger(path)
    parent = tasks["p"]
    assert parent.deadline is not None
    for task in tasks.values():
        assert _reason(task) == "deadline", (task.id, task.error)
        assert task.deadline == parent.deadline  # inherited, on the store's clock
        assert task.root_id == "p"
        assert task.finished_at is not None
        assert task.finished_at < parent.deadline + BOUND / 2  # stopped, not waited out
    assert [line["task"] for line in of(lines, "tool_started")] == ["p.child"]
    assert remote.seen, "the tool call never reached the remote service"
    assert [s["outcome"] for s in remote.seen] == ["refused_late"]  # nothing landed late
    assert not of(lines, "outlived_deadline")
    assert all(line["task"] != "p.late-child" for line in of(lines, "started"))
    if face == "sync":
        assert of(lines, "late_child_enqueued")
        assert tasks["p.late-child"].attempt == 1  # claimed once and dead-lettered unrun
