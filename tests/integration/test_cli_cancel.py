"""``agentlease cancel`` and ``agentlease delete-queue`` against a SQLite database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import agentlease as al
from agentlease.cli import cli


@pytest.fixture
def run(sqlite_url: str):
    """Invoke the CLI on the test's database; returns the click Result."""
    runner = CliRunner()

    def invoke(*args: str, stdin: str | None = None) -> Result:
        return runner.invoke(cli, [*args, "--backend", sqlite_url], input=stdin)

    return invoke


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return result


def refused(result: Result) -> str:
    """Exit status 2 with one red line on stderr, no traceback; returns that line."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    line = result.stderr.strip()
    assert line.startswith("error: "), result.stderr
    assert "\n" not in line
    assert "Traceback" not in result.output
    return line


def test_cancel_a_waiting_task_a_leased_one_and_a_finished_one(run, sqlite_url: str) -> None:
    with al.Queue.connect(sqlite_url) as q:
        q.enqueue("jobs", {}, id="waiting")
        q.enqueue("jobs", {}, id="running")
        q.enqueue("jobs", {}, id="finished")
        jobs = {j.task_id: j for j in q.claim("jobs", n=3, lease_for=60)}
        q.release(jobs["waiting"].lease)
        q.complete(jobs["finished"].lease, None)
    out = ok(run("cancel", "waiting", "--reason", "not needed")).stdout
    assert "cancelled task waiting" in out
    assert "not needed" in out
    out = ok(run("cancel", "running", "--json")).stdout
    assert json.loads(out) == {
        "id": "running",
        "outcome": "requested",
        "state": "leased",
        "reason": "cancelled from the command line",
    }
    done = run("cancel", "finished")
    assert done.exit_code == 1
    assert "already ended (done)" in done.stdout
    shown = json.loads(ok(run("show", "running", "--json")).stdout)
    assert shown["state"] == "leased"
    assert shown["cancel_reason"] == "cancelled from the command line"
    assert "leased (cancel requested)" in ok(run("show", "running")).stdout
    shown = json.loads(ok(run("show", "waiting", "--json")).stdout)
    assert shown["state"] == "cancelled"
    assert shown["error"]["reason"] == "not needed"
    stats = json.loads(ok(run("stats", "--json", "jobs")).stdout)[0]
    assert stats["counts"]["cancelled"] == 1
    assert "cancelled" in ok(run("stats", "jobs")).stdout


def test_cancel_refuses_an_unknown_task_and_a_bad_reason(run, sqlite_url: str) -> None:
    with al.Queue.connect(sqlite_url) as q:
        q.enqueue("jobs", {}, id="t")
    assert "no task" in refused(run("cancel", "nope"))
    assert "reason" in refused(run("cancel", "t", "--reason", "x" * 1001))
    assert "reason" in refused(run("cancel", "t", "--reason", ""))
    with al.Queue.connect(sqlite_url) as q:
        assert q.get("t").state == "queued"


def test_delete_queue_asks_first_and_deletes_in_batches(run, sqlite_url: str) -> None:
    with al.Queue.connect(sqlite_url) as q:
        q.enqueue_many("doomed", [{"n": i} for i in range(25)])
        q.enqueue("kept", {})
    no = run("delete-queue", "doomed", stdin="n\n")
    assert no.exit_code == 1
    assert "Delete queue 'doomed' and its 25 task(s)?" in no.stderr
    with al.Queue.connect(sqlite_url) as q:
        assert q.stats("doomed").counts["queued"] == 25
    out = ok(run("delete-queue", "doomed", "--batch", "7", stdin="y\n")).stdout
    assert "deleted queue doomed and 25 task(s)" in out
    with al.Queue.connect(sqlite_url) as q:
        assert q.queues() == ["kept"]
    assert "no queue named 'doomed'" in refused(run("delete-queue", "doomed", "--yes"))


def test_delete_queue_refuses_leased_tasks_unless_forced(run, sqlite_url: str) -> None:
    with al.Queue.connect(sqlite_url) as q:
        q.enqueue_many("busy", [{"n": i} for i in range(3)])
        (job,) = q.claim("busy", lease_for=60)
    line = refused(run("delete-queue", "busy", "--yes"))
    assert "1 leased task" in line
    assert "force" in line
    out = json.loads(ok(run("delete-queue", "busy", "--yes", "--force", "--json")).stdout)
    assert out == {"queue": "busy", "deleted": 3}
    with al.Queue.connect(sqlite_url) as q:
        with pytest.raises(al.UnknownTask):
            q.complete(job.lease, None)
        q.enqueue("other", {})
    assert "between 1 and" in refused(run("delete-queue", "other", "--yes", "--batch", "0"))


HANDLERS = '''
import pathlib

import agentlease as al


def patient(ctx: al.JobContext) -> al.JSON:
    """Waits until told to stop; records what it was told, in a file beside it."""
    ctx.wait(60)
    try:
        ctx.check()
    except al.TaskCancelled as exc:
        pathlib.Path(__file__).with_name("told.txt").write_text(exc.reason)
        raise
    return "never cancelled"
'''


def test_a_worker_process_stops_the_handler_of_a_task_cancelled_from_another(
    sqlite_url: str, tmp_path: Path
) -> None:
    (tmp_path / "cancel_handlers.py").write_text(HANDLERS)
    with al.Queue.connect(sqlite_url) as q:
        q.enqueue("jobs", {}, id="long")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "agentlease", "worker", "cancel_handlers:patient"),
            *("--queue", "jobs", "--backend", sqlite_url, "--lease-for", "3"),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        deadline = time.monotonic() + 30
        with al.Queue.connect(sqlite_url) as q:
            while q.get("long").state != "leased":
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline
                time.sleep(0.02)
        out = subprocess.run(
            [
                *(sys.executable, "-m", "agentlease", "cancel", "long"),
                *("--reason", "operator stop", "--backend", sqlite_url),
            ],
            capture_output=True,
            check=False,
            env={**os.environ, "COLUMNS": "200"},
            timeout=60,
        )
        assert out.returncode == 0, out.stderr.decode()
        assert b"cancel requested" in out.stdout
        told = tmp_path / "told.txt"
        while not told.exists():  # the worker's next heartbeat tells the handler
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline + 30
            time.sleep(0.05)
        assert told.read_text() == "operator stop"
        with al.Queue.connect(sqlite_url) as q:
            task = q.get("long")
            assert task.state == "cancelled"
            assert task.cancel_reason == "operator stop"
            assert task.result is None
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0


def test_a_cancelled_task_whose_worker_was_killed_is_reaped_as_cancelled(
    sqlite_url: str, tmp_path: Path
) -> None:
    (tmp_path / "cancel_handlers.py").write_text(HANDLERS)
    with al.Queue.connect(sqlite_url) as q:
        q.enqueue("jobs", {}, id="orphan", partition="acct")
        q.enqueue("jobs", {}, id="next", partition="acct")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "agentlease", "worker", "cancel_handlers:patient"),
            *("--queue", "jobs", "--backend", sqlite_url, "--lease-for", "5"),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        deadline = time.monotonic() + 30
        with al.Queue.connect(sqlite_url) as q:
            while q.get("orphan").state != "leased":
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline
                time.sleep(0.02)
    finally:
        proc.kill()  # SIGKILL: the holder vanishes without a word
        proc.communicate()
    with al.Queue.connect(sqlite_url) as q:
        assert q.cancel("orphan", "holder is gone").outcome == "requested"
        while q.get("orphan").state == "leased":  # its lease runs out; the reaper decides
            assert time.monotonic() < deadline + 30
            q.reap("jobs")
            time.sleep(0.1)
        task = q.get("orphan")
        assert task.state == "cancelled"
        assert task.cancel_reason == "holder is gone"
        assert task.reclaims == 0  # never requeued
        assert q.get("next").state == "queued"  # the partition is free
