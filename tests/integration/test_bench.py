"""``agentlease bench --json`` with tiny sizes: the shape of its output, never its speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

KEYS = {"name", "backend", "ops_per_s", "baseline_ops_per_s", "ratio", "tasks", "batch", "workers"}


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
    args = ["--json", "--tasks", "200", "--processes", "2", "--batch", "20"]
    if backend == "sqlite":
        args += ["--backend", f"sqlite:///{tmp_path / 'bench.db'}"]
    elif backend is not None:
        args += ["--backend", backend]
    done = bench(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr

    everything = json.loads(done.stdout)  # nothing but the JSON list on stdout
    assert isinstance(everything, list)
    rows = [r for r in everything if "mode" in r]
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


def test_bench_table(tmp_path: Path) -> None:
    done = bench("--tasks", "30", "--processes", "1", "--backend", "memory://", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "claim+complete, batching off" in done.stdout
    assert "batch claim is" in done.stdout


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
        "--backend",
        url,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    everything = json.loads(done.stdout)
    rows = [r for r in everything if "mode" in r]
    assert len(rows) == 5
    for row in rows:
        assert row.keys() >= KEYS
        assert row["backend"] == ("postgresql" if kind == "postgres" else kind)
    for row in everything:
        assert row["ops_per_s"] > 0
        assert row["baseline_ops_per_s"] > 0
        assert row["ratio"] == pytest.approx(row["ops_per_s"] / row["baseline_ops_per_s"], abs=1e-3)
