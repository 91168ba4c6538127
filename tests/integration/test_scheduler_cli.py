"""The ``scheduler`` command against a SQLite database: it loads the schedules of a file or a
module, fires their ticks, stops cleanly at SIGINT or SIGTERM, and refuses bad input with one
line (exit 2) before anything is written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import agentlease as al
from agentlease.cli import cli
from agentlease.cli.schedule import load_schedules

GOOD = """
import agentlease as al

SCHEDULES = [al.Schedule("hourly", "reports", every=3600, grace=3600, payload={"kind": "usage"})]
ONE = SCHEDULES[0]
NOT_SCHEDULES = [1, 2]
"""


@pytest.fixture
def jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "periodic_jobs.py"
    path.write_text(textwrap.dedent(GOOD))
    (tmp_path / "periodic_bad_cron.py").write_text(
        "import agentlease as al\nS = [al.Schedule('x', 'q', cron='61 * * * *')]\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for module in ("periodic_jobs", "periodic_bad_cron"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    return path


def test_schedules_load_from_a_file_or_a_module(jobs: Path) -> None:
    (by_file,) = load_schedules(f"{jobs}:SCHEDULES")
    assert by_file.name == "hourly"
    (by_module,) = load_schedules("periodic_jobs:ONE")
    assert by_module.payload == {"kind": "usage"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("periodic_jobs.py", "FILE.py:NAME"),
        ("periodic_jobs.py:MISSING", "has no 'MISSING'"),
        ("missing_file.py:S", "no such file"),
        ("periodic_jobs.py:NOT_SCHEDULES", "not a Schedule"),
        ("periodic_bad_cron.py:S", "invalid cron expression"),
    ],
)
def test_bad_specs_exit_2_with_one_line_and_write_nothing(
    jobs: Path, tmp_path: Path, spec: str, message: str
) -> None:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    result = CliRunner().invoke(cli, ["scheduler", spec, "--backend", url])
    assert result.exit_code == 2, (result.output, result.stderr)
    line = result.stderr.strip()
    assert line.startswith("error: ")
    assert message in line
    assert "\n" not in line
    assert not (tmp_path / "tasks.db").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_command_fires_the_tick_and_stops_at_a_signal(
    jobs: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    err = tmp_path / "scheduler.err"
    with err.open("wb") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentlease",
                "scheduler",
                f"{jobs}:SCHEDULES",
                "--backend",
                url,
            ],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 30
        while b"fired" not in err.read_bytes():
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = err.read_text()
    assert f"{sig.name}: stopping" in log
    assert "scheduler stopped" in log
    with al.Queue.connect(url) as q:
        assert q.stats("reports").counts == {"queued": 1}
        (job,) = q.claim("reports")
        assert job.payload == {"kind": "usage"}
        assert job.task_id.startswith("schedule:reports:hourly:")
