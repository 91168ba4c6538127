"""``agentlease purge``: deletes a queue's done (or dead) tasks past an age, in batches, and
says how many; bad ages and states are refused with one line and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import agentlease as al
from agentlease.cli import cli
from agentlease.cli.purge import BATCH, parse_age
from agentlease.errors import InvalidDuration


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tasks.db'}"


def run(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, [*args, "--backend", url], catch_exceptions=False)


def finish(url: str, done: int, dead: int) -> None:
    q = al.Queue.connect(url)
    try:
        q.enqueue_many("jobs", list(range(done + dead)))
        jobs = q.claim("jobs", done + dead, lease_for=30)
        for job in jobs[:done]:
            q.complete(job.lease, None)
        for job in jobs[done:]:
            q.fail(job.lease, "boom", retry_in=None)
    finally:
        q.close()


def counts(url: str) -> dict[str, int]:
    q = al.Queue.connect(url)
    try:
        return q.stats("jobs").counts
    finally:
        q.close()


def test_purge_deletes_done_tasks_past_the_age(url: str) -> None:
    finish(url, 3, 2)
    out = run(url, "purge", "jobs", "--older-than", "1d")
    assert out.exit_code == 0, out.output
    assert "purged 0 done tasks of jobs" in out.output
    out = run(url, "purge", "jobs", "--older-than", "0", "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == {
        "queue": "jobs",
        "state": "done",
        "older_than": 0.0,
        "purged": 3,
    }
    assert counts(url) == {"dead": 2}
    out = run(url, "purge", "jobs", "--older-than", "0s", "--state", "dead")
    assert out.exit_code == 0, out.output
    assert "purged 2 dead tasks of jobs" in out.output
    assert counts(url) == {}


def test_purge_works_off_more_than_one_batch(url: str) -> None:
    finish(url, BATCH + 5, 0)
    out = run(url, "purge", "jobs", "--older-than", "0", "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["purged"] == BATCH + 5


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--older-than", "yesterday"], "give a number and a unit"),
        (["--older-than", "-1d"], "give a number and a unit"),
    ],
)
def test_purge_refuses_bad_ages(url: str, args: list[str], words: str) -> None:
    finish(url, 1, 0)
    out = run(url, "purge", "jobs", *args)
    assert out.exit_code == 2
    assert words in out.stderr
    assert "Traceback" not in out.output
    assert counts(url) == {"done": 1}


def test_purge_refuses_an_unknown_state_and_a_missing_file(url: str, tmp_path: Path) -> None:
    finish(url, 1, 0)
    out = run(url, "purge", "jobs", "--older-than", "0", "--state", "queued")
    assert out.exit_code == 2
    out = run(f"sqlite:///{tmp_path / 'nope.db'}", "purge", "jobs", "--older-than", "0")
    assert out.exit_code == 2
    assert "no SQLite database" in out.stderr
    assert counts(url) == {"done": 1}


def test_ages() -> None:
    assert parse_age("90") == 90
    assert parse_age("1.5m") == 90
    assert parse_age("12h") == 12 * 3600
    assert parse_age("1d") == 86_400
    assert parse_age("2w") == 14 * 86_400
    with pytest.raises(InvalidDuration):
        parse_age("1y")


def test_tasks_pages_through_a_state_with_its_cursor(url: str) -> None:
    finish(url, 5, 1)
    out = run(url, "tasks", "jobs", "--state", "done", "--limit", "2", "--json")
    assert out.exit_code == 0, out.output
    first = json.loads(out.stdout)
    assert len(first["tasks"]) == 2
    assert first["cursor"] is not None
    seen = [t["id"] for t in first["tasks"]]
    cursor = first["cursor"]
    while cursor is not None:
        out = run(
            url, "tasks", "jobs", "--state", "done", "--limit", "2", "--cursor", cursor, "--json"
        )
        assert out.exit_code == 0, out.output
        page = json.loads(out.stdout)
        seen += [t["id"] for t in page["tasks"]]
        cursor = page["cursor"]
    assert len(seen) == len(set(seen)) == 5
    out = run(url, "tasks", "jobs", "--state", "dead")
    assert out.exit_code == 0, out.output
    assert "(last page)" in out.output
    out = run(url, "tasks", "jobs", "--limit", "1")
    assert out.exit_code == 0, out.output
    out = run(url, "tasks", "jobs", "--state", "done", "--cursor", "garbage")
    assert out.exit_code == 2
    assert "cursor" in out.stderr


def test_the_worker_takes_retentions_and_refuses_one_below_the_floor(url: str) -> None:
    finish(url, 1, 0)
    args = ["worker", "json:dumps", "--queue", "jobs", "--burst"]
    out = run(url, *args, "--done-retention", "10s")
    assert out.exit_code == 2
    assert "retention floor of 60s" in out.stderr
    out = run(url, *args, "--dead-retention", "soon")
    assert out.exit_code == 2
    assert "give a number and a unit" in out.stderr
    out = run(url, *args, "--done-retention", "1m", "--dead-retention", "2h", "--purge-every", "0")
    assert out.exit_code == 0, out.output
    assert counts(url) == {"done": 1}
