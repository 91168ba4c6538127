"""The admin and worker commands against a SQLite database: right numbers, clean refusals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import agentlease as al
from agentlease.cli import cli


@pytest.fixture
def run(sqlite_url: str):
    """Invoke the CLI on the test's database; returns the click Result."""
    runner = CliRunner()

    def invoke(*args: str, url: str | None = sqlite_url, stdin: str | None = None) -> Result:
        argv = list(args) + ([] if url is None else ["--backend", url])
        return runner.invoke(cli, argv, input=stdin, catch_exceptions=False)

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


def stats(run, *queues: str) -> dict[str, dict]:
    return {s["queue"]: s for s in json.loads(ok(run("stats", "--json", *queues)).stdout)}


# -- enqueue and stats --------------------------------------------------------------------------


def test_enqueue_then_stats_counts_every_state(run, sqlite_url: str, tmp_path: Path) -> None:
    ok(run("enqueue", "jobs", '{"n": 1}', "[1, 2]", "null"))
    lines = tmp_path / "more.jsonl"
    lines.write_text('{"n": 2}\n\n"three"\n4\n')
    assert "enqueued 3 tasks" in ok(run("enqueue", "jobs", "--file", str(lines))).stdout
    ok(run("enqueue", "jobs", '"later"', "--delay", "60", "--priority", "5"))
    ok(run("enqueue", "other", "--file", "-", stdin='{"x": 1}\n{"x": 2}\n'))
    with al.Queue.connect(sqlite_url) as q:
        (job,) = q.claim("jobs")
        q.complete(job.lease, {"ok": True})
        q.claim("jobs")

    every = stats(run)
    assert sorted(every) == ["jobs", "other"]
    jobs = every["jobs"]
    assert jobs["counts"] == {
        "parked": 0,
        "scheduled": 1,
        "queued": 4,
        "leased": 1,
        "failed": 0,
        "done": 1,
        "dead": 0,
        "cancelled": 0,
    }
    assert jobs["depth"] == 5
    assert jobs["oldest_queued_age"] >= 0
    assert every["other"]["counts"]["queued"] == 2
    assert list(stats(run, "other")) == ["other"]

    table = ok(run("stats")).stdout
    assert "jobs" in table
    assert "other" in table


def test_enqueue_with_id_and_dedup_key_creates_once(run) -> None:
    assert "enqueued task t-1" in ok(run("enqueue", "jobs", "1", "--id", "t-1")).stdout
    assert "already exists" in ok(run("enqueue", "jobs", "2", "--id", "t-1")).stdout
    ok(run("enqueue", "jobs", "3", "--dedup-key", "k"))
    ok(run("enqueue", "jobs", "4", "--dedup-key", "k"))
    assert stats(run, "jobs")["jobs"]["counts"]["queued"] == 2


def test_stats_of_an_empty_store(run) -> None:
    ok(run("enqueue", "jobs", "1"))  # creates the database
    assert json.loads(ok(run("stats", "--json", url="memory://")).stdout) == []
    assert "no queues" in ok(run("stats", url="memory://")).stdout


# -- inspect ------------------------------------------------------------------------------------


def test_inspect_shows_live_leases(run, sqlite_url: str) -> None:
    for task_id in ("a", "b", "c"):
        ok(run("enqueue", "jobs", "{}", "--id", task_id))
    with al.Queue.connect(sqlite_url, settings=al.QueueSettings(lease_for=60)) as q:
        (first,) = q.claim("jobs")
        q.fail(first.lease, ValueError("flaky"), retry_in=0)
        leased = q.claim("jobs", 2)
        for job in leased:
            if job.task_id == "b":
                q.progress(job.lease, {"step": "fetching", "done": 3})
    assert {j.task_id for j in leased} == {"a", "b"}

    leases = json.loads(ok(run("inspect", "jobs", "--json")).stdout)
    by_id = {lease["task_id"]: lease for lease in leases}
    assert sorted(by_id) == ["a", "b"]
    assert by_id["a"]["attempt"] == 2
    assert by_id["a"]["failures"] == 1
    assert by_id["b"]["attempt"] == 1
    assert by_id["b"]["failures"] == 0
    assert by_id["b"]["progress"] == {"step": "fetching", "done": 3}
    assert by_id["a"]["progress"] is None
    for lease in leases:
        assert lease["reclaims"] == 0
        assert 0 <= lease["leased_for"] < 30
        assert 30 < lease["expires_in"] <= 60

    assert len(json.loads(ok(run("inspect", "jobs", "--json", "--limit", "1")).stdout)) == 1
    table = ok(run("inspect", "jobs")).stdout
    assert "a" in table
    assert "live leases of jobs" in table
    assert '{"step":"fetc' in table  # cut to fit 80 columns; --json has all of it


def test_inspect_without_leases(run) -> None:
    ok(run("enqueue", "jobs", "1"))
    assert "no live leases" in ok(run("inspect", "jobs")).stdout
    assert json.loads(ok(run("inspect", "jobs", "--json")).stdout) == []


# -- dead letters -------------------------------------------------------------------------------


def _kill(sqlite_url: str, *task_ids: str) -> None:
    with al.Queue.connect(sqlite_url) as q:
        for task_id in task_ids:
            q.enqueue("jobs", {"id": task_id}, id=task_id)
        for job in q.claim("jobs", len(task_ids)):
            q.fail(job.lease, RuntimeError(f"boom {job.task_id}"), retry_in=None)


def test_dead_lists_errors_and_requeues(run, sqlite_url: str) -> None:
    _kill(sqlite_url, "d1", "d2", "d3")
    dead = json.loads(ok(run("dead", "jobs", "--json")).stdout)
    assert sorted(t["id"] for t in dead) == ["d1", "d2", "d3"]
    for task in dead:
        assert task["error"] == {"type": "RuntimeError", "message": f"boom {task['id']}"}
        assert task["failures"] == 1
        assert task["payload"] == {"id": task["id"]}
    assert "boom d2" in ok(run("dead", "jobs")).stdout

    assert "requeued 1 dead tasks" in ok(run("dead", "jobs", "--requeue", "d1")).stdout
    counts = stats(run, "jobs")["jobs"]["counts"]
    assert (counts["queued"], counts["dead"]) == (1, 2)

    assert "to the front" in ok(run("dead", "jobs", "--requeue", "--all", "--front")).stdout
    counts = stats(run, "jobs")["jobs"]["counts"]
    assert (counts["queued"], counts["dead"]) == (3, 0)
    with al.Queue.connect(sqlite_url) as q:  # sent to the front: ahead of d1
        assert q.claim("jobs")[0].task_id in ("d2", "d3")
    assert "no dead letters" in ok(run("dead", "jobs")).stdout


def test_requeue_of_a_task_that_is_not_dead_exits_1(run, sqlite_url: str) -> None:
    _kill(sqlite_url, "d1")
    ok(run("enqueue", "jobs", "1", "--id", "alive"))
    result = run("dead", "jobs", "--requeue", "d1", "alive")
    assert result.exit_code == 1
    assert "requeued 1" in result.stdout
    assert "1 of the named tasks are not dead letters" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["dead", "jobs", "--requeue"],
        ["dead", "jobs", "d1"],
        ["dead", "jobs", "--all"],
        ["dead", "jobs", "--requeue", "--all", "d1"],
        ["dead", "jobs", "--limit", "0"],
    ],
)
def test_dead_refuses_contradictory_options(run, sqlite_url: str, args: list[str]) -> None:
    _kill(sqlite_url, "d1")
    refused(run(*args))
    assert stats(run, "jobs")["jobs"]["counts"]["dead"] == 1


# -- refusals: exit 2, one line, nothing written ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "url", "says"),
    [
        (["stats"], "sqlite://host/x.db", "no host"),
        (["enqueue", "jobs", "1"], "mysql://localhost", "unsupported backend URL"),
        (["enqueue", "jobs", "1"], "sqlite:///", "names no file"),
        (["inspect", "jobs"], "sqlite:///:memory:", "several processes"),
        (["stats", "nope"], None, "no queue named 'nope'"),
        (["inspect", "nope"], None, "no queue named 'nope'"),
        (["dead", "nope"], None, "no queue named 'nope'"),
        (["dead", "nope", "--requeue", "--all"], None, "no queue named 'nope'"),
        (["enqueue", "jobs", '{"a":'], None, "not valid JSON"),
        (["enqueue", "jobs", "1", "hello"], None, "a string needs JSON quotes"),
        (["enqueue", "jobs", "NaN"], None, "not valid JSON"),
        (["enqueue", "bad name!", "1"], None, "invalid queue name"),
        (["enqueue", "jobs", "1", "--id", "no spaces"], None, "invalid task id"),
        (["enqueue", "jobs", "1", "2", "--id", "x"], None, "one task"),
        (["enqueue", "jobs"], None, "nothing to enqueue"),
        (["enqueue", "jobs", "1", "--delay", "-1"], None, "delay"),
        (["inspect", "bad name!"], None, "invalid queue name"),
        (["inspect", "seeded", "--limit", "0"], None, "between 1"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    run, sqlite_url: str, args: list[str], url: str | None, says: str
) -> None:
    ok(run("enqueue", "seeded", '{"keep": true}'))
    line = refused(run(*args, url=url or sqlite_url))
    assert says in line
    after = stats(run)
    assert list(after) == ["seeded"]
    assert after["seeded"]["counts"]["queued"] == 1
    assert sum(after["seeded"]["counts"].values()) == 1


def test_invalid_line_in_a_file_writes_nothing(run, tmp_path: Path) -> None:
    lines = tmp_path / "tasks.jsonl"
    lines.write_text("\n".join(["1"] * 1200 + ["{oops}"] + ["2"] * 10))
    ok(run("enqueue", "seeded", "1"))
    line = refused(run("enqueue", "jobs", "--file", str(lines)))
    assert "line 1201" in line
    assert refused(run("stats", "jobs")) == "error: no queue named 'jobs'"


def test_a_payload_too_large_in_a_later_chunk_writes_nothing(run, tmp_path: Path) -> None:
    lines = tmp_path / "tasks.jsonl"
    big = json.dumps("x" * 1_100_000)
    lines.write_text("\n".join(["1"] * 1200 + [big]))
    ok(run("enqueue", "seeded", "1"))
    assert "payload #1201" in refused(run("enqueue", "jobs", "--file", str(lines)))
    assert refused(run("stats", "jobs")) == "error: no queue named 'jobs'"


def test_reading_a_missing_database_does_not_create_it(run, tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    for command in (["stats"], ["inspect", "jobs"], ["dead", "jobs"]):
        assert "no SQLite database" in refused(run(*command, url=f"sqlite:///{missing}"))
    assert not missing.exists()


# -- worker -------------------------------------------------------------------------------------


@pytest.fixture
def handlers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of handlers in a temp directory, which becomes the working directory."""
    name = f"handlers_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            import logging
            import time

            def logged(ctx):
                logging.getLogger("my.handler").info("handling n=%s", ctx.payload["n"])
                return None

            def double(ctx):
                return {"double": ctx.payload["n"] * 2, "attempt": ctx.attempt}

            async def adouble(ctx):
                return {"double": ctx.payload["n"] * 2}

            def boom(ctx):
                raise ValueError(f"boom {ctx.payload['n']}")

            def slow(ctx):
                time.sleep(1.0)
                return "slept"

            async def aslow(ctx):
                import asyncio
                await asyncio.sleep(5.0)
                return "slept"

            class Tools:
                @staticmethod
                def triple(ctx):
                    return ctx.payload["n"] * 3

            not_callable = 42
            """
        )
    )
    (tmp_path / f"{name}_broken.py").write_text("raise RuntimeError('cannot load me')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for module in (name, f"{name}_broken"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    return name


def _enqueue_numbers(sqlite_url: str, count: int) -> None:
    with al.Queue.connect(sqlite_url) as q:
        q.enqueue_many("jobs", [al.TaskSpec(payload={"n": i}, id=f"t{i}") for i in range(count)])


@pytest.mark.parametrize(("function", "expected"), [("double", 2), ("adouble", 2)])
def test_worker_burst_runs_every_task(
    run, sqlite_url: str, handlers: str, function: str, expected: int
) -> None:
    _enqueue_numbers(sqlite_url, 6)
    spec = f"{handlers}:{function}"
    result = ok(
        run(
            "worker",
            spec,
            "--queue",
            "jobs",
            "--concurrency",
            "3",
            "--burst",
            "--poll-interval",
            "0.05",
        )
    )
    assert "worker stopped after 6 jobs" in result.stderr
    with al.Queue.connect(sqlite_url) as q:
        for i in range(6):
            task = q.get(f"t{i}")
            assert task.state == "done"
            assert isinstance(task.result, dict)
            assert task.result["double"] == expected * i


def test_worker_dotted_attribute(run, sqlite_url: str, handlers: str) -> None:
    _enqueue_numbers(sqlite_url, 2)
    ok(run("worker", f"{handlers}:Tools.triple", "--queue", "jobs", "--burst"))
    with al.Queue.connect(sqlite_url) as q:
        assert q.get("t1").result == 3


def test_worker_logs_handler_records_and_with_verbose_every_claim(
    run, sqlite_url: str, handlers: str
) -> None:
    _enqueue_numbers(sqlite_url, 1)
    quiet = ok(run("worker", f"{handlers}:logged", "--queue", "jobs", "--burst"))
    assert "handling n=0" in quiet.stderr
    assert "claimed" not in quiet.stderr
    _enqueue_numbers(sqlite_url, 2)  # t0 exists already: only t1 is new
    loud = ok(run("worker", f"{handlers}:logged", "--queue", "jobs", "--burst", "-v"))
    assert "claimed jobs/t1" in loud.stderr
    assert "completed jobs/t1" in loud.stderr


def test_worker_task_timeout_and_lease_options(run, sqlite_url: str, handlers: str) -> None:
    _enqueue_numbers(sqlite_url, 1)
    ok(run("enqueue", "jobs", '{"n": 9}', "--id", "own", "--timeout", "4"))
    argv = ["worker", f"{handlers}:aslow", "--queue", "jobs", "--burst", "--max-failures", "1"]
    argv += ["--task-timeout", "0.2", "--max-lease", "60", "--progress-timeout", "30"]
    ok(run(*argv))
    with al.Queue.connect(sqlite_url) as q:
        t0 = q.get("t0")
        assert t0.state == "dead"
        assert isinstance(t0.error, dict)
        assert t0.error["type"] == "TaskTimeout"
        own = q.get("own")
        assert own.timeout == 4.0
        assert own.state == "dead"  # its own 4 s limit, not the worker's 0.2 s: then it failed
        assert isinstance(own.error, dict)
        assert "time limit of 4 s" in own.error["message"]
    refused = run("worker", f"{handlers}:aslow", "--queue", "jobs", "--task-timeout", "-1")
    assert refused.exit_code == 2


def test_worker_dead_letters_after_max_failures(run, sqlite_url: str, handlers: str) -> None:
    _enqueue_numbers(sqlite_url, 2)
    ok(run("worker", f"{handlers}:boom", "--queue", "jobs", "--burst", "--max-failures", "1"))
    dead = json.loads(ok(run("dead", "jobs", "--json")).stdout)
    assert sorted(t["id"] for t in dead) == ["t0", "t1"]
    assert {t["error"]["message"] for t in dead} == {"boom 0", "boom 1"}


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("no_colon", "MODULE:FUNCTION"),
        (":func", "MODULE:FUNCTION"),
        ("mod:", "MODULE:FUNCTION"),
        ("a:b:c", "MODULE:FUNCTION"),
        ("surely_not_a_module_xyz:handle", "cannot import 'surely_not_a_module_xyz'"),
        ("{mod}_broken:handle", "RuntimeError: cannot load me"),
        ("{mod}:missing", "has no 'missing'"),
        ("{mod}:not_callable", "not a function"),
    ],
)
def test_worker_bad_handler_exits_2(
    run, sqlite_url: str, handlers: str, spec: str, says: str
) -> None:
    _enqueue_numbers(sqlite_url, 1)
    line = refused(run("worker", spec.format(mod=handlers), "--queue", "jobs", "--burst"))
    assert says in line
    assert stats(run, "jobs")["jobs"]["counts"]["queued"] == 1


def test_worker_bad_settings_exit_2(run, handlers: str) -> None:
    assert "queue name" in refused(run("worker", f"{handlers}:double", "--queue", "bad name"))
    assert "concurrency" in refused(
        run("worker", f"{handlers}:double", "--queue", "jobs", "--concurrency", "0")
    )
    assert "lease_for" in refused(
        run("worker", f"{handlers}:double", "--queue", "jobs", "--lease-for", "0")
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_worker_exits_0_on_signal_after_finishing_its_job(
    sqlite_url: str, handlers: str, tmp_path: Path, sig: signal.Signals
) -> None:
    _enqueue_numbers(sqlite_url, 1)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "agentlease", "worker", f"{handlers}:slow"),
            *("--queue", "jobs", "--backend", sqlite_url, "--grace", "10"),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        deadline = time.monotonic() + 30
        with al.Queue.connect(sqlite_url) as q:
            while q.get("t0").state != "leased":
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline
                time.sleep(0.02)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    assert b"worker stopped after 1 jobs" in stderr
    with al.Queue.connect(sqlite_url) as q:
        assert q.get("t0").result == "slept"


def test_keys_show_and_purge(run, sqlite_url: str) -> None:
    keys = al.Idempotency.connect(sqlite_url, settings=al.IdempotencySettings(window=0.2))
    try:
        done = keys.call(lambda: {"sent": 1}, tool="send", args={"to": "a"}, step="s", task_id="t")
        held = keys.begin("charge", {"cents": 5}, step="c", task_id="t")
        shown = json.loads(ok(run("keys", "show", done.key, "--json")).stdout)
        assert shown["state"] == "done"
        assert shown["result"] == {"sent": 1}
        assert shown["fence"] == 1
        flight = json.loads(ok(run("keys", "show", held.key, "--json")).stdout)
        assert flight["state"] == "in_flight"
        assert flight["in_flight_for"] > 0
        assert str(os.getpid()) in flight["holder"]
        assert "idempotency key" in ok(run("keys", "show", done.key)).stdout
        time.sleep(0.5)
        assert json.loads(ok(run("keys", "show", done.key, "--json")).stdout) is None
        assert "purged 1 keys" in ok(run("keys", "purge")).stdout
        assert ok(run("keys", "show", done.key)).stdout.startswith("no key")
        assert "printable ASCII" in refused(run("keys", "show", "not a key"))
        held.abandon()
    finally:
        keys.close()


def test_stats_show_hot_partitions(run) -> None:
    ok(run("enqueue", "ledger", "1", "2", "3", "--partition", "acct-7"))
    ok(run("enqueue", "ledger", "4", "--partition", "acct-9"))
    (row,) = json.loads(ok(run("stats", "--json", "ledger")).stdout)
    assert row["counts"]["parked"] == 2
    assert row["counts"]["queued"] == 2
    assert row["hot_partitions"] == [{"partition": "acct-7", "parked": 2}]
    assert "acct-7 (2 parked)" in ok(run("stats", "ledger")).stdout
    assert "partition key" in refused(run("enqueue", "ledger", "1", "--partition", "a b"))


def test_the_worker_command_imports_no_other_command_no_rich_and_no_driver(tmp_path: Path) -> None:
    """Start-up: ``agentlease worker`` on SQLite loads its own module only (no bench, demo or
    admin tables, no rich, no Redis or PostgreSQL driver, no dashboard, no scheduler, no
    OpenTelemetry without ``--otel``, no Prometheus client without ``--metrics-port``), and of
    the library only what a worker uses (no idempotency, shared state, counter holds or memory
    store)."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.argv = ["agentlease", "worker", "json:dumps", "--backend",
                    "sqlite:///{tmp_path / "w.db"}", "-q", "q", "--burst"]
        from agentlease.cli import main
        try:
            main()
        except SystemExit as exc:
            assert not exc.code, exc.code
        prefixes = ("rich", "agentlease.cli", "agentlease.bench", "agentlease._demo", "redis",
                    "psycopg", "agentlease._async.idempotency", "agentlease._sync.idempotency",
                    "agentlease._idempotent", "agentlease._outcomes", "agentlease._renewal",
                    "agentlease._async.state", "agentlease._sync.state", "agentlease._guards",
                    "agentlease._versioned_sql", "agentlease._policy.transitions",
                    "agentlease._async.holds", "agentlease._sync.holds", "cronsim",
                    "agentlease._schedule", "agentlease._async.scheduler",
                    "agentlease._sync.scheduler", "agentlease._wakeup",
                    "agentlease.backends.memory", "agentlease.backends._memory",
                    "agentlease.dashboard", "starlette", "uvicorn", "jinja2",
                    "opentelemetry", "agentlease.otel", "prometheus_client",
                    "agentlease.prometheus", "mcp", "agentlease.mcp", "agents", "openai",
                    "agentlease.openai_agents", "langgraph", "langchain_core",
                    "agentlease.langgraph", "pydantic_ai", "pydantic", "agentlease.pydantic_ai")
        print(",".join(sorted(m for m in sys.modules if m.startswith(prefixes))))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    loaded = out.stdout.strip().split(",")
    assert loaded == ["agentlease.cli", "agentlease.cli._app", "agentlease.cli.work"], loaded


def test_every_command_is_known_to_the_lazy_group() -> None:
    """The group's map names each command's module: a command added elsewhere is not lost."""
    import importlib
    import pkgutil

    import agentlease.cli as package
    from agentlease.cli._app import COMMANDS

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"agentlease.cli.{info.name}")
    importlib.import_module("agentlease.bench.command")
    assert set(cli.commands) == set(COMMANDS)
    for name, command in cli.commands.items():
        assert command.callback is not None
        assert command.callback.__module__ == COMMANDS[name], name


def test_enqueue_prints_the_ids_it_created(run, sqlite_url: str) -> None:
    out = ok(run("enqueue", "jobs", "1", "2", "3")).stdout.splitlines()
    assert out[0] == "enqueued 3 tasks to jobs:"
    ids = out[1:]
    assert len(ids) == 3
    with al.Queue.connect(sqlite_url) as q:
        assert sorted(t.id for t in q.dead("jobs")) == []
        assert {q.get(i).payload for i in ids} == {1, 2, 3}
    listed = json.loads(ok(run("enqueue", "jobs", "4", "--id", ids[0], "--json")).stdout)
    assert listed == [{"id": ids[0], "created": False}]


def test_an_error_with_brackets_is_printed_as_it_is(run) -> None:
    # rich markup must not eat text such as pip install 'agentlease[redis]'
    result = run("demo", "--backend", "foo://x[bold]y[/bold]", url=None)
    assert result.exit_code == 2
    assert "foo://x[bold]y[/bold]" in result.stderr + result.stdout
    malformed = run("demo", "--backend", "redis://x[bold]y/0", url=None)
    assert malformed.exit_code == 2
    assert "malformed backend URL 'redis://x[bold]y/0'" in malformed.stderr


def test_show_prints_everything_about_one_task(run, sqlite_url: str) -> None:
    ok(run("enqueue", "jobs", '{"order": 7}', "--id", "o7"))
    with al.Queue.connect(sqlite_url) as q:
        (job,) = q.claim("jobs")
        q.progress(job.lease, {"step": 2}, checkpoint={"done": ["a"]})

        def charge() -> None:
            raise ValueError("card declined")

        try:
            charge()
        except ValueError as exc:
            q.fail(job.lease, exc, retry_in=None)
    shown = json.loads(ok(run("show", "o7", "--json")).stdout)
    head = (shown["id"], shown["queue"], shown["state"], shown["attempt"])
    assert head == ("o7", "jobs", "dead", 1)
    assert shown["payload"] == {"order": 7}
    assert shown["progress"] == {"step": 2}
    assert shown["checkpoint"] == {"done": ["a"]}
    assert shown["error"]["type"] == "ValueError"
    assert "in charge" in shown["error"]["traceback"]
    text = ok(run("show", "o7")).stdout
    for part in ("dead", "ValueError: card declined", "traceback", "in charge", '"order": 7'):
        assert part in text
    missing = run("show", "nope")
    assert missing.exit_code == 2
    assert "no task with id 'nope'" in missing.stderr


def test_stats_fits_80_columns_without_dropping_a_column(run, sqlite_url: str) -> None:
    long = "customer-notifications-high-priority"
    with al.Queue.connect(sqlite_url) as q:
        q.enqueue_many("jobs", [1, 2])
        q.enqueue_many(long, [al.TaskSpec(payload=i, partition="acct-1") for i in range(3)])
    out = ok(run("stats")).stdout  # not a terminal: 80 columns
    assert all(len(line) <= 80 for line in out.splitlines())
    assert long in out.replace("\n", "")
    for part in ("parked 2", "oldest", "jobs"):
        assert part in out
    with al.Queue.connect(sqlite_url) as q:
        q.enqueue("x", 1)
    narrow = ok(run("stats", "jobs", "x")).stdout  # no parked column: the table fits
    assert "queue" in narrow
    assert "oldest" in narrow
    assert all(len(line) <= 80 for line in narrow.splitlines())
