"""``agentlease workers``, the holder column of ``inspect`` and the attempts of ``show`` on a
SQLite database: right values in JSON, tables that fit 80 columns, clean refusals."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner, Result

import agentlease as al
from agentlease.cli import cli

HOLDER = "build-07.example.internal:123456:a1b2c3"


@pytest.fixture
def run(sqlite_url: str):
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        result = runner.invoke(
            cli, [*args, "--backend", sqlite_url], catch_exceptions=False, env={"COLUMNS": "80"}
        )
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return result

    return invoke


def _fits(text: str) -> None:
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, text


def test_workers_lists_live_entries_in_json_and_a_table(run, sqlite_url: str) -> None:
    with al.Queue.connect(sqlite_url) as q:
        q.enqueue("jobs", 1)  # the database exists
        assert json.loads(run("workers", "--json").stdout) == []
        assert "no live workers" in run("workers").stdout
        info = {
            "host": "build-07.example.internal",
            "pid": 123456,
            "queues": ["jobs", "emails"],
            "concurrency": 8,
            "started": time.time() - 90,
            "tasks": ["task-one", "task-two-with-a-long-identifier-0123456789"],
        }
        q.register_worker(HOLDER, info, ttl=60)
        q.register_worker("gone:1:000000", {"pid": 1}, ttl=0.05)
        time.sleep(0.1)
    (entry,) = json.loads(run("workers", "--json").stdout)
    assert entry["id"] == HOLDER
    assert (entry["host"], entry["pid"], entry["concurrency"]) == (info["host"], 123456, 8)
    assert entry["queues"] == ["jobs", "emails"]
    assert entry["tasks"] == info["tasks"]
    assert 0 <= entry["last_beat_age"] < 60
    assert 0 < entry["expires_in"] <= 60
    table = run("workers").stdout
    _fits(table)
    assert "live workers" in table
    assert "jobs,emails" in table
    assert "gone:1" not in table


def test_inspect_names_the_holder_and_show_lists_attempts(run, sqlite_url: str) -> None:
    with al.Queue.connect(sqlite_url, settings=al.QueueSettings(lease_for=60)) as q:
        q.enqueue("jobs", {"n": 1}, id="t1")
        (job,) = q.claim("jobs", holder=HOLDER)
        q.fail(job.lease, ValueError("flaky"), retry_in=0)
        (job,) = q.claim("jobs", holder="other:7:ffffff")
        q.progress(job.lease, {"step": "fetching", "done": 3})
    (lease,) = json.loads(run("inspect", "jobs", "--json").stdout)
    assert (lease["holder"], lease["progress"]) == (
        "other:7:ffffff",
        {"step": "fetching", "done": 3},
    )
    table = run("inspect", "jobs").stdout
    _fits(table)
    assert "other:7:ffffff" in table
    assert "holder" in table

    shown = json.loads(run("show", "t1", "--json").stdout)
    assert [(a["attempt"], a["worker"], a["outcome"], a["error"]) for a in shown["attempts"]] == [
        (1, HOLDER, "failed", "ValueError"),
        (2, "other:7:ffffff", None, None),
    ]
    assert shown["attempts"][0]["ended"] >= shown["attempts"][0]["started"]
    text = run("show", "t1").stdout
    _fits(text)
    assert "attempts (last 2)" in text
    assert "failed (ValueError)" in text
    assert "running" in text
