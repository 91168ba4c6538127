"""Secrets never leak: with store URLs that carry a password (and a TLS key path), every CLI
command, the worker, the demo and the typed error paths run, and the password appears in none of
their output, logs, events, exception messages (causes included) or ``repr`` of settings and
clients.

The stores are private servers that check the password: a ``redis-server`` with ``requirepass``
and a PostgreSQL whose role logs in with scram-sha-256, so the right password works and a wrong
one is refused (and must not be quoted either).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import agentlease as al
from agentlease.cli import cli
from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parents[2]


@dataclass(repr=False)
class Secrets:
    """What must never be shown, and where it was put."""

    password: str
    wrong: str
    key_path: str
    good: str  # a URL with the right password
    bad: str  # the same with a wrong password
    tls: str  # rediss:// with the key path (and the password)
    seen: list[str] = field(default_factory=list)

    def forbidden(self) -> list[str]:
        return [self.password, self.wrong, self.key_path, Path(self.key_path).name]

    def check(self, text: str, where: str) -> None:
        for secret in self.forbidden():
            assert secret not in text, f"{where} shows a secret:\n{text}"
        self.seen.append(where)


@pytest.fixture(params=["redis", "postgres"])
def secrets(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Secrets]:
    token = uuid.uuid4().hex[:10]
    password, wrong = f"pw-{token}-right", f"pw-{token}-wrong"
    key_path = tmp_path / f"client-{token}-key.pem"
    key_path.write_text("not a key\n")
    cert = tmp_path / "client.pem"
    cert.write_text("not a certificate\n")
    if request.param == "redis":
        start: Callable[..., Any] = request.getfixturevalue("private_redis")
        server = start(requirepass=password)
        base = f"127.0.0.1:{server.port}/0"
        tls = (
            f"rediss://:{password}@{base}?ssl_keyfile={key_path}&ssl_certfile={cert}"
            "&connect_timeout=1&socket_timeout=1"
        )
        yield Secrets(
            password,
            wrong,
            str(key_path),
            f"redis://:{password}@{base}?prefix=sec",
            f"redis://:{wrong}@{base}?prefix=sec",
            tls,
        )
        return
    from tests import _private_postgres as pg

    try:
        server = pg.start()
    except pg.CannotStart as exc:
        unavailable("private postgres", str(exc))
    try:
        server.sql(f"ALTER ROLE {pg.PASSWORD_ROLE} PASSWORD '{password}'")
        base = f"{pg.PASSWORD_ROLE}:{{}}@127.0.0.1:{server.port}/postgres?schema=sec"
        yield Secrets(
            password,
            wrong,
            str(key_path),
            "postgresql://" + base.format(password),
            "postgresql://" + base.format(wrong),
            "postgresql://" + base.format(password) + f"&sslmode=require&sslkey={key_path}",
        )
    finally:
        server.stop()


def _chain(exc: BaseException) -> str:
    """An exception as a user sees it: its traceback with every cause and context, and its
    repr (which shows the fields of a typed error)."""
    return "".join(traceback.format_exception(exc)) + repr(exc)


def _reprs(obj: object, depth: int = 3, seen: set[int] | None = None) -> Iterator[str]:
    """``repr`` of an object and of the objects it holds (attributes, slots, container items), a
    few levels down: settings, clients, pools, connections. Strings and the builtin containers
    are walked through, not shown: the password is held in memory to log in with, and only what
    an object shows of itself can leak it."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth < 0 or isinstance(obj, str | bytes | int | float | type(None)):
        return
    seen.add(id(obj))
    members: list[object] = []
    if isinstance(obj, dict):
        members = list(obj.values())
    elif isinstance(obj, list | tuple | set | frozenset):
        members = list(obj)
    else:
        try:
            yield repr(obj)
        except Exception as exc:  # a repr that fails shows nothing
            yield f"<repr failed: {type(exc).__name__}>"
        for name in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, name):
                members.append(getattr(obj, name))
        members.extend(getattr(obj, "__dict__", {}).values())
    for member in members:
        if callable(member) and not hasattr(member, "__dict__"):
            continue
        yield from _reprs(member, depth - 1, seen)


def _cli(secrets: Secrets, *args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=True)
    text = result.output + (_chain(result.exception) if result.exception else "")
    secrets.check(text, "agentlease " + " ".join(a for a in args if "://" not in a))
    return text


def _run(secrets: Secrets, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    env.pop("AGENTLEASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "agentlease", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    label = "agentlease " + " ".join(a for a in args if "://" not in a)
    secrets.check(done.stdout + done.stderr, label)
    return done


def test_no_output_log_event_error_or_repr_shows_a_password(
    secrets: Secrets, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    good, bad = secrets.good, secrets.bad
    events: list[al.Event] = []

    # The CLI, every command, with the right password; its output is checked as it runs.
    assert _cli(secrets, "migrate", "--backend", good).strip()
    _cli(secrets, "migrate", "--check", "--backend", good)
    _cli(secrets, "enqueue", "jobs", '{"n": 1}', '{"n": 2}', "--backend", good)
    _cli(secrets, "enqueue", "bad", '{"n": 3}', "--backend", good)
    _cli(secrets, "enqueue", "jobs", "not json", "--backend", good)  # refused: not JSON
    # The worker in a process of its own, verbose, on both handlers (one task dead-lettered).
    for queue, handler in (("jobs", "ok"), ("bad", "boom")):
        done = _run(
            secrets,
            "worker",
            f"tests.security._secret_handler:{handler}",
            "-q",
            queue,
            "--burst",
            "-v",
            "--max-failures",
            "1",
            "--backend",
            good,
        )
        assert done.returncode == 0, done.stderr
    assert "handler failed" in done.stderr + done.stdout  # the failure is logged, not the URL
    for args in (
        ("stats",),
        ("stats", "--json"),
        ("stats", "jobs", "nosuchqueue"),
        ("inspect", "jobs"),
        ("inspect", "jobs", "--json"),
        ("dead", "bad"),
        ("dead", "bad", "--json"),
        ("dead", "bad", "--requeue", "--all"),
        ("keys", "show", "no-such-key"),
        ("keys", "purge"),
    ):
        _cli(secrets, *args, "--backend", good)
    # The same URL from the environment, as workers are often configured.
    _cli(secrets, "stats", env={"AGENTLEASE_URL": good})
    # The demo (which starts worker processes) on Redis, the bench (which prints tables with the
    # store's name) on PostgreSQL: small, since each costs seconds of process start-up.
    if good.startswith("redis"):
        done = _run(secrets, "demo", "--backend", good, "--workers", "2", "--tasks", "6",
                    "--kill", "1", "--freeze", "0", "--lease-for", "1")  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    else:
        _cli(secrets, "bench", "--backend", good, "--tasks", "3", "--batch", "2",
             "--processes", "1", "--keys", "3", "--guards", "3", "--worker-tasks", "0")  # fmt: skip

    # Refusals: a wrong password, an unreachable port, bad options, a TLS setup that fails.
    unreachable = good.replace(good.split("@")[1].split("/")[0], "127.0.0.1:1")
    for url in (
        bad,
        unreachable,
        secrets.tls,
        good + "&bogus=1",
        good.replace("@", "/x@", 1),  # an unescaped '/' in the password
        good + "&prefix=a:b" if good.startswith("redis") else good + "&schema=A",
    ):
        for args in (("stats",), ("migrate",), ("enqueue", "jobs", "1"), ("keys", "purge")):
            text = _cli(secrets, *args, "--backend", url)
            assert text.strip(), f"{args} said nothing"
    for url in (bad, secrets.tls):  # refused for good: the worker process stops at once
        done = _run(secrets, "worker", "tests.security._secret_handler:ok", "-q", "jobs",
                    "--burst", "--backend", url, timeout=60)  # fmt: skip
        assert done.returncode == 2, (url.split("@")[-1], done.stdout, done.stderr)

    # The API on both faces: typed errors with their causes, reprs of clients and settings.
    errors: list[BaseException] = []
    for url in (bad, unreachable, secrets.tls, good + "&bogus=1"):
        for opener in (al.Queue.connect, al.Idempotency.connect, al.SharedState.connect):
            try:
                client = opener(url)
                try:
                    client.backend.get("t-none")  # type: ignore[attr-defined]
                finally:
                    client.close()
            except al.AgentLeaseError as exc:
                errors.append(exc)

        async def on_async(url: str = url) -> None:
            try:
                async with al.AsyncQueue.connect(url) as queue:
                    await queue.stats("jobs")
            except al.AgentLeaseError as exc:
                errors.append(exc)

        asyncio.run(on_async())
    assert len(errors) == 16, [type(e).__name__ for e in errors]
    for exc in errors:
        assert isinstance(exc, al.AgentLeaseError)
        secrets.check(_chain(exc), f"{type(exc).__name__} raised by the API")

    queue = al.Queue.connect(good, on_event=events.append)
    keys = al.Idempotency.connect(good)
    state = al.SharedState.connect(good)
    try:
        queue.enqueue("api", {"n": 1})
        worker = al.Worker(queue, "api", lambda ctx: {"ok": True})
        worker.run(burst=True)
        with keys.action("tool", {"a": 1}, step="s", task_id="t") as act:
            act.result = {"r": 1}
        state.compare_and_set("rec", 0, {"v": 1})
        with state.locks(["l"], timeout=1, ttl=5) as held:
            objects: list[object] = [queue, keys, state, held, worker, queue.backend]
            for obj in objects:
                for text in _reprs(obj):
                    secrets.check(text, f"repr inside {type(obj).__name__}")
    finally:
        state.close()
        keys.close()
        queue.close()
    assert events, "the worker reported no events"
    for event in events:
        secrets.check(repr(event), f"event {event.name}")
    secrets.check(
        "\n".join(
            r.getMessage() + repr(r.__dict__) + (_chain(r.exc_info[1]) if r.exc_info else "")
            for r in caplog.records
        ),
        "log records",
    )
    assert len(secrets.seen) > 40


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_the_plan_secret_is_in_no_sealed_plan_log_repr_or_error(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = "memory://" if kind == "memory" else f"sqlite:///{tmp_path / 's.db'}"
    state = al.SharedState.connect(url, space="shop")
    try:
        secret = state.backend.plan_secret()
        forbidden = [secret.hex(), secret.hex().upper(), repr(secret), secret.decode("latin-1")]
        seen: list[str] = []
        with state.plan(step="refund") as plan:
            state.get("order")
            plan.set_field("order", "status", "refunded")
        sealed = plan.seal()
        seen += [sealed, repr(plan), repr(state), repr(state.backend)]
        tampered = sealed.replace("refunded", "refundex")
        for text in [tampered, sealed[:-3], "{}"]:
            with pytest.raises(al.PlanRefused) as info:
                state.act(text, approved_by="ada")
            seen += [
                str(info.value),
                repr(info.value),
                "".join(traceback.format_exception(info.value)),
            ]
        state.set_field("order", "status", "cancelled")
        with pytest.raises(al.StalePlan) as stale:
            plan.act("ada")
        seen += [str(stale.value), repr(stale.value.stale)]
        seen += [r.getMessage() for r in caplog.records]
        for text in seen:
            for secret_form in forbidden:
                assert secret_form not in text
    finally:
        state.close()
