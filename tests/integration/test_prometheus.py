"""The Prometheus endpoint of ``agentlease worker --metrics-port``, scraped over HTTP from a real
worker process on SQLite: counters, histograms and the depth gauge that match what the worker
did; a port in use and a missing extra end the command with one clear line and status 2."""

from __future__ import annotations

import os
import queue as queues
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import agentlease as al

Q = "jobs"
HANDLERS = """
def handle(ctx):
    if ctx.payload == "flaky" and ctx.attempt == 1:
        raise RuntimeError("once")
    return ctx.payload
"""

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample of the endpoint, by name and labels (OpenTelemetry's scope labels left out)."""
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = frozenset(
                (k, v) for k, v in sample.labels.items() if not k.startswith("otel_scope_")
            )
            out[(sample.name, labels)] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def _worker_command(sqlite_url: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "agentlease",
        "worker",
        "prom_handlers:handle",
        "--backend",
        sqlite_url,
        "-q",
        Q,
        "--poll-interval",
        "0.05",
        *extra,
    ]


@pytest.fixture
def worker_dir(tmp_path: Path) -> Path:
    (tmp_path / "prom_handlers.py").write_text(HANDLERS)
    return tmp_path


@pytest.fixture
def metrics_worker(sqlite_url: str, worker_dir: Path) -> Iterator[str]:
    """A worker on ``sqlite_url`` serving metrics on a free port; yields the metrics URL."""
    process = subprocess.Popen(
        _worker_command(sqlite_url, "--metrics-port", "0", "--stats-interval", "0.1"),
        cwd=worker_dir,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queues.Queue[str] = queues.Queue()
    assert process.stderr is not None
    stderr = process.stderr
    reader = threading.Thread(target=lambda: [lines.put(line) for line in stderr], daemon=True)
    reader.start()
    try:
        seen = []
        while True:
            line = lines.get(timeout=60)
            seen.append(line)
            if "metrics on " in line:
                yield line.split("metrics on ", 1)[1].strip()
                break
            assert process.poll() is None, "".join(seen)
    finally:
        process.terminate()
        process.wait(timeout=60)
        reader.join(timeout=60)
        stderr.close()
    assert process.returncode == 0


def test_the_worker_serves_its_metrics_to_prometheus(sqlite_url: str, metrics_worker: str) -> None:
    with al.Queue.connect(sqlite_url) as queue:
        for payload in ("a", "b", "c", "flaky"):
            queue.enqueue(Q, payload, id=payload)
    deadline = time.monotonic() + 60
    while True:
        samples = scrape(metrics_worker)
        completed = value(
            samples, "agentlease_tasks_completed_total", **{"messaging_destination_name": Q}
        )
        done = value(
            samples,
            "agentlease_queue_depth",
            messaging_destination_name=Q,
            agentlease_task_state="done",
        )
        if completed == 4 and done == 4:
            break
        assert time.monotonic() < deadline, samples
        time.sleep(0.1)
    on_q = {"messaging_destination_name": Q}
    assert value(samples, "agentlease_tasks_claimed_total", **on_q) == 5  # flaky twice
    assert value(samples, "agentlease_tasks_failed_total", **on_q) == 1
    assert value(samples, "agentlease_tasks_dead_lettered_total", **on_q) is None  # none yet
    for state in ("queued", "leased", "failed", "dead", "scheduled"):
        depth = value(samples, "agentlease_queue_depth", agentlease_task_state=state, **on_q)
        assert depth == 0, state
    ok = {"agentlease_outcome": "ok", **on_q}
    error = {"agentlease_outcome": "error", **on_q}
    assert value(samples, "agentlease_task_run_time_seconds_count", **ok) == 4
    assert value(samples, "agentlease_task_run_time_seconds_count", **error) == 1
    assert value(samples, "agentlease_task_run_time_seconds_bucket", le="+Inf", **ok) == 4
    assert value(samples, "agentlease_queue_latency_seconds_count", **on_q) == 5
    assert any(
        name == "target_info" and ("service_name", "agentlease-worker") in labels
        for name, labels in samples
    )
    with al.Queue.connect(sqlite_url) as queue:
        stats = queue.stats(Q)
    assert stats.counts.get("done") == 4


def test_a_port_in_use_ends_the_worker_with_one_line_and_status_2(
    sqlite_url: str, worker_dir: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            _worker_command(sqlite_url, "--metrics-port", str(port)),
            check=False,
            cwd=worker_dir,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2, out.stderr
    assert f"--metrics-port: cannot serve metrics on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr


def test_without_the_extra_the_worker_names_the_pip_command(
    sqlite_url: str, worker_dir: Path
) -> None:
    """The Prometheus exporter missing (its import refused here): status 2 and the pip line."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["opentelemetry.exporter.prometheus"] = None  # as if not installed
        sys.argv = {_worker_command(sqlite_url, "--metrics-port", "0")[2:]!r}
        from agentlease.cli import main
        main()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=worker_dir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "pip install 'agentlease[prometheus]'" in out.stderr
    assert "Traceback" not in out.stderr


def test_with_otel_the_same_metrics_are_scraped_and_the_spans_exported(
    sqlite_url: str, worker_dir: Path
) -> None:
    """``--otel --metrics-port``: the OTEL_* exporters get the spans (console here) and the
    endpoint serves the metrics (one meter provider with both readers)."""
    with al.Queue.connect(sqlite_url) as queue:
        queue.enqueue(Q, "a", id="a")
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_SERVICE_NAME": "prom-otel-worker",
    }
    process = subprocess.Popen(
        _worker_command(sqlite_url, "--otel", "--metrics-port", "0"),
        cwd=worker_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        url = None
        for line in process.stderr:
            if "metrics on " in line:
                url = line.split("metrics on ", 1)[1].strip()
                break
        assert url is not None
        deadline = time.monotonic() + 60
        while True:
            samples = scrape(url)
            on_q = {"messaging_destination_name": Q}
            if value(samples, "agentlease_tasks_completed_total", **on_q) == 1:
                break
            assert time.monotonic() < deadline, samples
            time.sleep(0.1)
        assert any(
            name == "target_info" and ("service_name", "prom-otel-worker") in labels
            for name, labels in samples
        )
    finally:
        process.terminate()
        stdout, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    assert f'"name": "run {Q}"' in stdout
