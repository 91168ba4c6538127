"""What the commands print, read the way scripts read it: through a pipe (real processes, on a
SQLite database). Piped output is plain text (no ANSI codes, no box-drawing characters, lines of
text not broken at the width), tables fit 80 columns, every read command takes ``--json``,
brackets in names, payloads and errors print as they are (never read as markup), and the demo's
report names its database."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import agentlease as al

pytestmark = pytest.mark.xdist_group("processes")

ROOT = Path(__file__).resolve().parents[2]
ADVICE = "pip install 'agentlease[redis]'"
MARKUP = "[bold]not bold[/bold] [red]x[/]"
HOLDER = "build-07.example.internal:4242:a1b2c3"
BOX = re.compile("[\u2500-\u257f]")


def piped(*args: str, env: dict[str, str] | None = None, code: int = 0) -> str:
    """Run ``agentlease ARGS`` with stdout a pipe and COLUMNS=80; its stdout."""
    environ = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    environ.update(COLUMNS="80", PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}", **(env or {}))
    out = subprocess.run(
        [sys.executable, "-m", "agentlease", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=False,
    )
    assert out.returncode == code, (args, out.stdout, out.stderr)
    return out.stdout


def plain(text: str) -> str:
    assert "\x1b" not in text, text
    assert BOX.search(text) is None, text
    return text


def fits(text: str) -> str:
    assert max((len(line) for line in text.splitlines()), default=0) <= 80, text
    return text


@pytest.fixture
def filled(sqlite_url: str) -> dict[str, str]:
    """A queue with a queued task, a leased one (held by a live worker) and a dead one whose
    payload and error hold brackets."""
    with al.Queue.connect(sqlite_url) as q:
        dead = q.enqueue("jobs", {"note": MARKUP, "fix": ADVICE}).task_id
        held = q.enqueue("jobs", "second").task_id
        waiting = q.enqueue("jobs", "third").task_id
        (job,) = q.claim("jobs", lease_for=600, holder=HOLDER)
        q.fail(job.lease, RuntimeError(ADVICE), retry_in=None)
        q.claim("jobs", lease_for=600, holder=HOLDER)
        info = {
            "host": "build-07.example.internal",
            "pid": 4242,
            "queues": ["jobs"],
            "concurrency": 2,
            "started": 1_700_000_000.0,
            "tasks": [held],
        }
        q.register_worker(HOLDER, info, ttl=600)
    return {"url": sqlite_url, "dead": dead, "held": held, "waiting": waiting}


def test_piped_tables_are_plain_text_within_80_columns(filled: dict[str, str]) -> None:
    url = filled["url"]
    for args in (
        ("stats",),
        ("queues",),
        ("inspect", "jobs"),
        ("workers",),
        ("tasks", "jobs"),
        ("tasks", "jobs", "--state", "dead"),
        ("dead", "jobs"),
        ("show", filled["dead"]),
        ("show", filled["held"]),
    ):
        out = fits(plain(piped(*args, "--backend", url)))
        assert out.strip(), args
    table = piped("stats", "--backend", url)
    assert re.search(r"^ ?-{20,}", table, re.M)  # the header's rule, in ASCII
    assert piped("queues", "--backend", url) == "jobs\n"


def test_every_read_command_takes_json(filled: dict[str, str], tmp_path: Path) -> None:
    url = filled["url"]
    stats = json.loads(piped("stats", "--json", "--backend", url))
    assert stats[0]["queue"] == "jobs"
    assert json.loads(piped("queues", "--json", "--backend", url)) == ["jobs"]
    (lease,) = json.loads(piped("inspect", "jobs", "--json", "--backend", url))
    assert lease["holder"] == HOLDER
    (worker,) = json.loads(piped("workers", "--json", "--backend", url))
    assert worker["id"] == HOLDER
    page = json.loads(piped("tasks", "jobs", "--json", "--backend", url))
    assert [t["id"] for t in page["tasks"]] == [filled["waiting"]]
    assert page["cursor"] is None
    shown = json.loads(piped("show", filled["dead"], "--json", "--backend", url))
    assert shown["payload"] == {"note": MARKUP, "fix": ADVICE}
    (dead,) = json.loads(piped("dead", "jobs", "--json", "--backend", url))
    assert dead["id"] == filled["dead"]
    assert ADVICE in json.dumps(dead)
    assert json.loads(piped("keys", "purge", "--json", "--backend", url)) == {"purged": 0}
    migrated = json.loads(piped("migrate", "--json", "--backend", url))
    assert migrated == {"store": url, "applied": []}
    checked = json.loads(piped("migrate", "--check", "--json", "--backend", url))
    assert checked == {"store": url, "pending": []}


def test_brackets_print_as_they_are(filled: dict[str, str]) -> None:
    url = filled["url"]
    shown = piped("show", filled["dead"], "--backend", url)
    assert MARKUP in shown
    assert ADVICE in shown
    assert f"RuntimeError: {ADVICE}" in shown
    said = piped("cancel", filled["waiting"], "--reason", f"see {ADVICE}", "--backend", url)
    assert f"(reason: see {ADVICE})" in said


def test_a_missing_driver_names_the_extra_intact(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['redis'] = None\n"
        "sys.argv = ['agentlease', 'stats', '--backend', 'redis://127.0.0.1:6379/0']\n"
        "from agentlease.cli import main\n"
        "main()\n"
    )
    environ = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}")
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert ADVICE in out.stderr
    assert "\x1b" not in out.stderr
    assert "Traceback" not in out.stderr


def test_a_long_line_is_not_broken_when_piped(sqlite_url: str) -> None:
    with al.Queue.connect(sqlite_url) as q:
        q.enqueue_many("jobs", list(range(3)))
    out = piped("tasks", "jobs", "--limit", "1", "--backend", sqlite_url)
    (line,) = [x for x in out.splitlines() if x.startswith("next page:")]
    cursor = line.split("--cursor ", 1)[1]
    page = json.loads(piped("tasks", "jobs", "--cursor", cursor, "--json", "--backend", sqlite_url))
    assert len(page["tasks"]) == 2


def test_the_sqlite_demo_report_says_where_its_database_was(tmp_path: Path) -> None:
    small = ("--workers", "2", "--tasks", "6", "--kill", "0", "--freeze", "0")
    out = plain(piped("demo", *small))
    (line,) = [x for x in out.splitlines() if x.startswith("store: ")]
    where = re.fullmatch(r"store: sqlite at (\S+demo\.db) \(a temp dir, removed\)", line)
    assert where is not None, out
    assert not Path(where.group(1)).parent.exists()
    assert "every invariant held" in out

    path = tmp_path / "mine.db"
    report = json.loads(piped("demo", *small, "--json", "--backend", f"sqlite:///{path}"))
    assert str(path) in report["backend"]
    assert path.exists()


def test_keys_show_prints_a_result_with_brackets_plainly(sqlite_url: str) -> None:
    with al.Queue.connect(sqlite_url) as q:
        q.enqueue("jobs", 1)  # the database exists
    keys = al.Idempotency.connect(sqlite_url)
    try:
        done = keys.call(
            lambda: {"fix": ADVICE}, tool="send", args={"to": "a"}, step="s", task_id="t"
        )
    finally:
        keys.close()
    out = fits(plain(piped("keys", "show", done.key, "--backend", sqlite_url)))
    assert ADVICE in out
    shown = json.loads(piped("keys", "show", done.key, "--json", "--backend", sqlite_url))
    assert shown["result"] == {"fix": ADVICE}
