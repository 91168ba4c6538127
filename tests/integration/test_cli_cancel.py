"""``agentlease cancel`` and ``agentlease delete-queue`` against a SQLite database."""

from __future__ import annotations

import json

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
