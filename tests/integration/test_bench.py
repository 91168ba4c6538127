"""``agentlease bench --json`` with tiny sizes: the shape of its output, never its speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

import agentlease as al
from agentlease.bench.workers import drain_with_workers

KEYS = {"name", "backend", "ops_per_s", "baseline_ops_per_s", "ratio", "tasks", "batch", "workers"}
CLAIM_MODES = ("claim_complete", "claim_only")
KEY_ROW_KEYS = {
    "name",
    "backend",
    "mode",
    "phase",
    "calls",
    "rounds",
    "baseline",
    "us_per_call",
    "baseline_us_per_call",
    "round_trips",
    "ideal_round_trips",
    "ops_per_s",
    "baseline_ops_per_s",
    "ratio",
}
GUARD_ROW_KEYS = (KEY_ROW_KEYS - {"phase", "baseline_us_per_call"}) | {
    "guard",
    "baseline_us_per_op",
}


def bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentlease", "bench", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
        check=False,
    )


@pytest.mark.parametrize(
    ("backend", "kind"),
    [(None, "sqlite"), ("sqlite", "sqlite"), ("memory://", "memory")],
)
def test_bench_json_shape(tmp_path: Path, backend: str | None, kind: str) -> None:
    args = ["--json", "--tasks", "200", "--processes", "2", "--batch", "20", "--keys", "0"]
    args += ["--guards", "0", "--worker-tasks", "0"]
    if backend == "sqlite":
        args += ["--backend", f"sqlite:///{tmp_path / 'bench.db'}"]
    elif backend is not None:
        args += ["--backend", backend]
    done = bench(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr

    everything = json.loads(done.stdout)  # nothing but the JSON list on stdout
    assert isinstance(everything, list)
    rows = [r for r in everything if r.get("mode") in CLAIM_MODES]
    # --keys 0 --guards 0: no key rows, no guard rows
    assert len(rows) == len([r for r in everything if "mode" in r])
    (versus,) = [r for r in everything if "mode" not in r]
    assert versus["name"] == "claim+complete, batch 20 vs raw one at a time"
    assert versus["ratio"] == pytest.approx(
        versus["ops_per_s"] / versus["baseline_ops_per_s"], abs=1e-3
    )
    assert len(rows) == 5
    assert len({r["name"] for r in rows}) == 5
    for row in rows:
        assert row.keys() >= KEYS
        assert row["backend"] == kind
        assert row["tasks"] == 200
        assert row["ops_per_s"] > 0
        assert row["baseline_ops_per_s"] > 0
        assert row["ratio"] > 0
        assert row["ratio"] == pytest.approx(row["ops_per_s"] / row["baseline_ops_per_s"], abs=1e-3)
    assert {r["batch"] for r in rows} == {1, 20}
    assert {r["workers"] for r in rows} == {1, 2}
    assert {r["mode"] for r in rows} == {"claim_complete", "claim_only"}
    # The scratch directory of the raw baseline is gone; only the library's database is left.
    left = {p.name for p in tmp_path.iterdir()}
    assert left == ({"bench.db"} if backend == "sqlite" else set())


def check_key_rows(everything: list[dict[str, Any]], kind: str, calls: int) -> None:
    """The two idempotency rows: their fields and arithmetic, never their speed."""
    rows = [r for r in everything if r.get("mode") == "idempotent"]
    assert [r["phase"] for r in rows] == ["first", "replay"]
    assert [r["ideal_round_trips"] for r in rows] == [2.0, 1.0]
    assert rows[0]["baseline"].endswith(", new key")
    assert rows[1]["baseline"].endswith(", key present")
    assert len({r["name"] for r in rows}) == 2
    for row in rows:
        assert row.keys() == KEY_ROW_KEYS
        assert row["backend"] == kind
        assert row["calls"] == calls
        assert row["rounds"] == 3
        assert row["us_per_call"] > 0
        assert row["baseline_us_per_call"] > 0
        assert row["round_trips"] == pytest.approx(
            row["us_per_call"] / row["baseline_us_per_call"], rel=1e-2
        )
        assert row["ratio"] == pytest.approx(row["ops_per_s"] / row["baseline_ops_per_s"], abs=1e-3)


@pytest.mark.parametrize(
    ("backend", "kind"), [(None, "sqlite"), ("sqlite", "sqlite"), ("memory://", "memory")]
)
def test_bench_idempotency_rows(tmp_path: Path, backend: str | None, kind: str) -> None:
    args = ["--json", "--tasks", "30", "--processes", "1", "--batch", "5", "--keys", "30"]
    args += ["--guards", "0", "--worker-tasks", "0"]
    if backend == "sqlite":
        args += ["--backend", f"sqlite:///{tmp_path / 'bench.db'}"]
    elif backend is not None:
        args += ["--backend", backend]
    done = bench(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    everything = json.loads(done.stdout)
    check_key_rows(everything, kind, 30)
    assert len([r for r in everything if r.get("mode") in CLAIM_MODES]) == 5
    left = {p.name for p in tmp_path.iterdir()}  # the raw baselines' scratch files are gone
    assert left == ({"bench.db"} if backend == "sqlite" else set())


def check_guard_rows(everything: list[dict[str, Any]], kind: str, calls: int) -> None:
    """The four shared-state guard rows: their fields and arithmetic, never their speed."""
    rows = [r for r in everything if r.get("mode") == "guard"]
    assert [r["guard"] for r in rows] == ["compare_and_set", "guarded", "plan", "lock"]
    assert [r["ideal_round_trips"] for r in rows] == [1.0, 1.0, 1.0, 2.0]
    assert len({r["name"] for r in rows}) == 4
    for row in rows:
        assert row.keys() == GUARD_ROW_KEYS
        assert row["backend"] == kind
        assert row["calls"] == calls
        assert row["rounds"] == 3
        assert row["baseline"]
        assert row["us_per_call"] > 0
        assert row["baseline_us_per_op"] > 0
        assert row["round_trips"] == pytest.approx(
            row["us_per_call"] / row["baseline_us_per_op"], rel=1e-2
        )
        assert row["ratio"] == pytest.approx(row["ops_per_s"] / row["baseline_ops_per_s"], abs=1e-3)


@pytest.mark.parametrize(
    ("backend", "kind"), [(None, "sqlite"), ("sqlite", "sqlite"), ("memory://", "memory")]
)
def test_bench_guard_rows(tmp_path: Path, backend: str | None, kind: str) -> None:
    args = ["--json", "--tasks", "30", "--processes", "1", "--batch", "5", "--keys", "0"]
    args += ["--guards", "30", "--worker-tasks", "0"]
    if backend == "sqlite":
        args += ["--backend", f"sqlite:///{tmp_path / 'bench.db'}"]
    elif backend is not None:
        args += ["--backend", backend]
    done = bench(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    everything = json.loads(done.stdout)
    check_guard_rows(everything, kind, 30)
    assert not [r for r in everything if r.get("mode") == "idempotent"]  # --keys 0
    assert len([r for r in everything if r.get("mode") in CLAIM_MODES]) == 5
    left = {p.name for p in tmp_path.iterdir()}  # the raw side's scratch files are gone
    assert left == ({"bench.db"} if backend == "sqlite" else set())


def test_bench_table(tmp_path: Path) -> None:
    done = bench(
        "--tasks",
        "30",
        "--processes",
        "1",
        "--keys",
        "9",
        "--guards",
        "9",
        "--backend",
        "memory://",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "claim+complete, batching off" in done.stdout
    assert "batch claim is" in done.stdout
    assert "@idempotent around a no-op" in done.stdout
    assert "first call" in done.stdout
    assert "replay" in done.stdout
    assert "shared-state guards on memory://" in done.stdout
    assert "compare_and_set" in done.stdout
    assert "plan approval" in done.stdout
    assert "lock acquire+release" in done.stdout
    # Piped: plain text, the tables' rules in ASCII.
    assert "\x1b" not in done.stdout
    assert not any("\u2500" <= ch <= "\u257f" for ch in done.stdout)


def test_bench_bad_backend_exits_2(tmp_path: Path) -> None:
    done = bench("--json", "--backend", "nosuch://x", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().startswith("error: unsupported backend URL")
    assert "\n" not in done.stderr.strip()


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_bench_json_on_served_stores(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(f"served_url_{kind}")
    done = bench(
        "--json",
        "--tasks",
        "90",
        "--processes",
        "2",
        "--batch",
        "10",
        "--keys",
        "30",
        "--guards",
        "30",
        "--worker-tasks",
        "0",
        "--backend",
        url,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    everything = json.loads(done.stdout)
    check_key_rows(everything, "postgresql" if kind == "postgres" else kind, 30)
    check_guard_rows(everything, "postgresql" if kind == "postgres" else kind, 30)
    rows = [r for r in everything if r.get("mode") in CLAIM_MODES]
    # Redis adds the two batching-off rows beside the raw loop through redis-py's client API,
    # and the batch claim row beside the plain claim script.
    context = [r for r in rows if r["name"].endswith(("(client-API raw)", "(plain claim script)"))]
    assert len(rows) == 5 + len(context)
    assert [r["name"] for r in context] == (
        [
            "claim+complete, batching off (client-API raw)",
            "claim+complete, 2 processes (client-API raw)",
            "claim only, batch 10 (plain claim script)",
        ]
        if kind == "redis"
        else []
    )
    for row in rows:
        assert row.keys() >= KEYS
        assert row["backend"] == ("postgresql" if kind == "postgres" else kind)
    for row in everything:
        assert row["ops_per_s"] > 0
        assert row["baseline_ops_per_s"] > 0
        assert row["ratio"] == pytest.approx(row["ops_per_s"] / row["baseline_ops_per_s"], abs=1e-3)


@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"])
def test_bench_worker_row(tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'bench.db'}"
    else:
        url = request.getfixturevalue(f"served_url_{kind}")
    args = ["--json", "--tasks", "3", "--processes", "1", "--batch", "2", "--keys", "0"]
    args += ["--guards", "0", "--worker-tasks", "60", "--worker-processes", "2"]
    done = bench(*args, "--worker-concurrency", "3", "--backend", url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    everything = json.loads(done.stdout)
    (row,) = [r for r in everything if r.get("mode") == "worker"]
    assert row["name"] == "worker, 2 processes"
    assert row["backend"] == ("postgresql" if kind == "postgres" else kind)
    assert row["handler"] == "agentlease.bench.noop_handler:noop"
    assert (row["tasks"], row["rounds"], row["workers"], row["concurrency"]) == (60, 3, 2, 3)
    assert row["ops_per_s"] > 0
    assert row["baseline_ops_per_s"] > 0
    assert row["end_to_end_ops_per_s"] > 0
    assert row["ratio"] == pytest.approx(row["ops_per_s"] / row["baseline_ops_per_s"], abs=1e-3)
    assert len(row["drain_s"]) == len(row["end_to_end_s"]) == len(row["baseline_s"]) == 3
    # Every task done, none claimed twice (the bench reads each one back).
    assert (row["completed"], row["claimed_again"]) == (60, 0)
    if kind == "sqlite":  # the library's queues are left on a SQLite --backend: look again
        q = al.Queue(al.connect(url))
        try:
            queues = [name for name in q.queues() if "-worker-" in name]
            assert len(queues) == 3
            assert [q.stats(name).counts for name in queues] == [{"done": 20}] * 3
        finally:
            q.close()
        assert {p.name for p in tmp_path.iterdir()} == {"bench.db"}


def test_bench_worker_failure_names_its_stderr() -> None:
    with pytest.raises(click.ClickException) as failed:
        drain_with_workers("nosuch://x", "q", 2, 1, 10)
    message = failed.value.message
    assert "agentlease.bench.noop_handler:noop) exited with status 2" in message
    assert "unsupported backend URL" in message
