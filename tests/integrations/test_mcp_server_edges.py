"""``agentlease mcp serve`` at its edges, driven by the MCP SDK's own client on real stores: the
store killed, restarted and hung (a private ``redis-server``, never the shared one), and the
server itself sent SIGTERM, SIGINT, SIGKILL and SIGSTOP while a session holds a task and a lock.

What each proves: a tool call on a dead or hung store is a prompt, typed ``BackendUnavailable``
(no traceback, no driver exception) and the same session works once the store is back; a
stopping server gives its task back to the front of the queue and releases its locks before it
exits; a killed or paused server's lease expires, its late write is refused with ``LeaseLost``
and nothing it renews afterwards comes back to life; a session that ends while the store is down
logs a typed warning and leaves the lease to expire.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from agentlease import AsyncQueue, AsyncSharedState
from tests.conftest import require

mcp_client = require("mcp.client", "mcp")
stdio = require("mcp.client.stdio", "mcp")
shttp = require("mcp.client.streamable_http", "mcp")
httpx2 = require("httpx2", "mcp")

pytestmark = [
    pytest.mark.xdist_group("processes"),  # several server processes on short leases each
    pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux (pidfd, signals)"),
]

SERVE = [sys.executable, "-m", "agentlease", "mcp", "serve"]
SLACK = 5.0  # beyond the server's own bound, for a loaded machine


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


@dataclass
class Served:
    """One stdio server process and the SDK client talking to it."""

    client: Any
    pid: int
    errlog: Path

    async def call(self, tool: str, /, **args: Any) -> tuple[bool, Any]:
        result = await self.client.call_tool(tool, args)
        text = result.content[0].text
        assert "Traceback" not in text, text
        assert "redis.exceptions" not in text, text
        return bool(result.is_error), result.structured_content


@asynccontextmanager
async def served(url: str, tmp: Path, *extra: str) -> AsyncIterator[Served]:
    """A stdio server on ``url`` as a host launches it, with its pid (the shell execs it)."""
    n = len(list(tmp.glob("server*.pid")))
    pidfile, errlog = tmp / f"server{n}.pid", tmp / f"server{n}.log"
    params = stdio.StdioServerParameters(
        command="sh",
        args=["-c", 'echo $$ > "$0"; exec "$@"', str(pidfile), *SERVE, "--backend", url, *extra],
        env=_env(),
    )
    with errlog.open("w") as err:
        async with mcp_client.Client(stdio.stdio_client(params, errlog=err)) as client:
            yield Served(client, int(pidfile.read_text()), errlog)


async def exited(pid: int, within: float = 10.0) -> None:
    """Wait (at most ``within`` seconds) for process ``pid`` to end."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready = await anyio.to_thread.run_sync(lambda: select.select([fd], [], [], within)[0])
    finally:
        os.close(fd)
    assert ready, f"process {pid} still runs {within} s later"


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


async def enqueue(url: str, n: int) -> list[str]:
    async with AsyncQueue.connect(url) as queue:
        return [(await queue.enqueue("jobs", {"n": i})).task_id for i in range(n)]


async def claim_when_expired(url: str, within: float = 15.0) -> Any:
    """Claim through a plain client, polling until a lease expires (bounded)."""
    async with AsyncQueue.connect(url) as queue:
        with anyio.fail_after(within):
            while not (jobs := await queue.claim("jobs", 1)):
                await anyio.sleep(0.1)
    return jobs[0]


def assert_unavailable(error: bool, body: Any) -> None:
    assert error, body
    assert body["error"] == "BackendUnavailable", body
    assert "ConnectionError" not in body["message"], body
    assert "TimeoutError" not in body["message"], body


# -- the store down, restarted, hung --------------------------------------------------------------


async def test_store_down_is_a_prompt_typed_refusal_and_the_session_recovers(
    private_redis: Callable[..., Any], tmp_path: Path
) -> None:
    # Durable (append-only, fsync always): a restart keeps the tasks and the live lease.
    store = private_redis(appendonly="yes", appendfsync="always")
    held, *_ = await enqueue(store.url, 3)
    # lease_for 10: the outage (calls refused at once) is well inside the lease, so the lease
    # claimed before it is still held after it: the server's renewals pick up again.
    async with served(store.url, tmp_path, "--lease-for", "10") as a:
        bound = 10 / 3 + SLACK
        error, body = await a.call("claim", queue="jobs")
        assert not error, body
        assert body["task"]["task_id"] == held
        lease = body["task"]["lease"]
        store.kill()
        with anyio.fail_after(bound):
            assert_unavailable(*await a.call("claim", queue="jobs"))
        with anyio.fail_after(bound):
            assert_unavailable(*await a.call("complete", lease=lease, result="during"))
        with anyio.fail_after(bound):
            assert_unavailable(*await a.call("state_get", key="k"))
        with anyio.fail_after(1 + bound):
            assert_unavailable(*await a.call("locks_acquire", names=["acct"], timeout=1))
        assert alive(a.pid)
        store.start()
        error, body = await a.call("claim", queue="jobs")
        assert not error, body
        assert body["task"]["attempt"] == 1
        assert body["task"]["task_id"] != held
        # Still held: completing it now succeeds (the refused completion changed nothing).
        error, body = await a.call("complete", lease=lease, result="after")
        assert (error, body) == (False, {"task_id": held, "state": "done"})
        error, locks = await a.call("locks_acquire", names=["acct"], timeout=2)
        assert not error, locks
    log = a.errlog.read_text()
    assert "Traceback" not in log, log
    async with AsyncQueue.connect(store.url) as queue:
        done = await queue.get(held)
        assert (done.state, done.attempt) == ("done", 1)


async def test_hung_store_is_refused_within_the_call_bound_then_works_again(
    private_redis: Callable[..., Any], tmp_path: Path
) -> None:
    store = private_redis()
    await enqueue(store.url, 3)
    async with served(store.url, tmp_path, "--lease-for", "3") as a:
        assert store.process is not None
        store.process.send_signal(signal.SIGSTOP)
        try:
            with anyio.fail_after(1 + SLACK):  # the call bound: lease_for / 3
                error, body = await a.call("claim", queue="jobs")
            assert_unavailable(error, body)
            assert "no answer from the store" in body["message"]
            with anyio.fail_after(1 + SLACK):
                assert_unavailable(*await a.call("state_get", key="k"))
            with anyio.fail_after(1 + 1 + SLACK):  # the lock set's timeout, then the bound
                args = {"names": ["acct"], "timeout": 1, "hold": 1}
                assert_unavailable(*await a.call("locks_acquire", **args))
        finally:
            store.process.send_signal(signal.SIGCONT)
        # The refused claim may still land once the store wakes (a lease nobody was told of:
        # it expires); three tasks leave one for this claim either way.
        error, body = await a.call("claim", queue="jobs")
        assert not error, body
        assert body["task"] is not None
        assert (await a.call("complete", lease=body["task"]["lease"]))[0] is False
        # An acquisition the store may still grant is bounded by its hold (1 s).
        assert (await a.call("locks_acquire", names=["acct"], timeout=1 + SLACK))[0] is False


async def test_a_session_ending_while_the_store_is_down_logs_and_leaves_the_lease_to_expire(
    private_redis: Callable[..., Any], tmp_path: Path
) -> None:
    store = private_redis(appendonly="yes", appendfsync="always")
    (task_id,) = await enqueue(store.url, 1)
    with anyio.fail_after(30):
        async with served(store.url, tmp_path, "--lease-for", "3") as a:
            error, body = await a.call("claim", queue="jobs")
            assert not error, body
            store.kill()
        # Standard input closed: the server tried to give the task back, could not, and
        # exited on its own.
        await exited(a.pid)
        log = a.errlog.read_text()
        assert f"could not give task {task_id} (attempt 1) back" in log, log
        assert "BackendUnavailable" in log, log
        assert "Traceback" not in log, log
        store.start()
        job = await claim_when_expired(store.url)
    assert (job.task_id, job.attempt) == (task_id, 2)


# -- the server stopped, killed, paused -----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def http_process(url: str) -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    port = _free_port()
    args = ["--backend", url, "--transport", "http", "--port", str(port), "--no-token"]
    proc = subprocess.Popen([*SERVE, *args], env=_env(), stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        line = (await anyio.to_thread.run_sync(proc.stderr.readline)).decode()
        assert "agentlease MCP server on" in line, line
        for _ in range(200):  # bounded: the socket opens just after the line
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None
                await anyio.sleep(0.05)
        yield proc, f"http://127.0.0.1:{port}/mcp"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        assert proc.stderr is not None
        proc.stderr.close()


async def assert_given_back(url: str, task_id: str) -> None:
    """The task is at the front of its queue (claimable now, attempt 2) and the lock is free."""
    async with AsyncSharedState.connect(url) as state:
        assert await state.lock_holders(["acct"]) == {"acct": None}
    async with AsyncQueue.connect(url) as queue:
        (job,) = await queue.claim("jobs", 1)  # at once: the lease (30 s) did not expire
        assert (job.task_id, job.attempt) == (task_id, 2)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
async def test_stdio_server_gives_back_on_signal(
    signum: signal.Signals, sqlite_url: str, tmp_path: Path
) -> None:
    await stdio_signal(sqlite_url, tmp_path, signum)


async def stdio_signal(url: str, tmp: Path, signum: signal.Signals) -> None:
    task_id, _ = await enqueue(url, 2)  # the first is claimed; the second is behind it
    with anyio.fail_after(30):
        async with served(url, tmp) as a:
            error, body = await a.call("claim", queue="jobs")
            assert (error, body["task"]["task_id"]) == (False, task_id)
            assert (await a.call("locks_acquire", names=["acct"], timeout=2))[0] is False
            os.kill(a.pid, signum)
            await exited(a.pid)
            log = a.errlog.read_text()
            assert f"{signum.name}: giving back" in log, log
            assert "Traceback" not in log, log
        await assert_given_back(url, task_id)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
async def test_http_server_gives_back_on_signal(signum: signal.Signals, sqlite_url: str) -> None:
    task_id, _ = await enqueue(sqlite_url, 2)
    with anyio.fail_after(30):
        async with (
            http_process(sqlite_url) as (proc, url),
            httpx2.AsyncClient(timeout=10) as http,
            mcp_client.Client(shttp.streamable_http_client(url, http_client=http)) as c,
        ):
            result = await c.call_tool("claim", {"queue": "jobs"})
            assert result.structured_content["task"]["task_id"] == task_id
            result = await c.call_tool("locks_acquire", {"names": ["acct"], "timeout": 2})
            assert not result.is_error
            proc.send_signal(signum)  # the session is still open
            returncode = await anyio.to_thread.run_sync(proc.wait, 10)
            assert returncode in (0, -signum)
            await assert_given_back(sqlite_url, task_id)


@pytest.fixture(params=["sqlite", "redis"])
def url(request: pytest.FixtureRequest) -> str:
    name = "sqlite_url" if request.param == "sqlite" else "served_url_redis"
    return str(request.getfixturevalue(name))


async def test_sigkilled_server_lease_expires_and_its_late_completion_is_refused(
    url: str, tmp_path: Path
) -> None:
    (task_id,) = await enqueue(url, 1)
    short = ("--lease-for", "1")
    with anyio.fail_after(40):
        async with served(url, tmp_path, *short) as a:
            error, body = await a.call("claim", queue="jobs")
            assert (error, body["task"]["attempt"]) == (False, 1)
            old = body["task"]["lease"]
            os.kill(a.pid, signal.SIGKILL)  # nothing can give the task back
            await exited(a.pid)
        async with served(url, tmp_path, *short) as b:
            for _ in range(150):  # bounded: until the dead server's lease expires
                error, body = await b.call("claim", queue="jobs")
                assert not error, body
                if body["task"] is not None:
                    break
                await anyio.sleep(0.1)
            assert (body["task"]["task_id"], body["task"]["attempt"]) == (task_id, 2)
            # The first agent's late completion, through a new server (here B's), is refused.
            error, late = await b.call("complete", lease=old, result="late")
            assert error
            assert late["error"] == "LeaseLost"
            assert (late["task_id"], late["attempt"], late["current_attempt"]) == (task_id, 1, 2)
            error, _ = await b.call("complete", lease=body["task"]["lease"], result="b")
            assert not error
    async with AsyncQueue.connect(url) as queue:
        task = await queue.get(task_id)
        assert (task.state, task.attempt, task.result) == ("done", 2, "b")


async def test_sigstopped_server_resumes_without_resurrecting_its_lease(
    sqlite_url: str, tmp_path: Path
) -> None:
    (task_id,) = await enqueue(sqlite_url, 1)
    short = ("--lease-for", "1")
    with anyio.fail_after(40):
        async with served(sqlite_url, tmp_path, *short) as a:
            error, body = await a.call("claim", queue="jobs")
            assert (error, body["task"]["attempt"]) == (False, 1)
            old = body["task"]["lease"]
            os.kill(a.pid, signal.SIGSTOP)
            try:
                async with served(sqlite_url, tmp_path, *short) as b:
                    for _ in range(150):  # bounded: until the paused server's lease expires
                        error, got = await b.call("claim", queue="jobs")
                        assert not error, got
                        if got["task"] is not None:
                            break
                        await anyio.sleep(0.1)
                    assert (got["task"]["task_id"], got["task"]["attempt"]) == (task_id, 2)
                    os.kill(a.pid, signal.SIGCONT)
                    # A wakes with its renewals overdue: they are refused, not re-granted.
                    error, late = await a.call("complete", lease=old, result="a")
                    assert error
                    assert late["error"] == "LeaseLost"
                    assert (late["attempt"], late["current_attempt"]) == (1, 2)
                    error, again = await a.call("heartbeat", lease=old)
                    assert (error, again["error"]) == (True, "LeaseLost")
                    error, _ = await b.call("complete", lease=got["task"]["lease"], result="b")
                    assert not error
            finally:
                os.kill(a.pid, signal.SIGCONT)
    async with AsyncQueue.connect(sqlite_url) as queue:
        task = await queue.get(task_id)
        assert (task.state, task.attempt, task.result) == ("done", 2, "b")
        assert (await queue.stats("jobs")).counts == {"done": 1}
