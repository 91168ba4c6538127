"""``agentlease mcp serve`` driven by the MCP SDK's own client: on stdio (the server a
subprocess per client, as an agent's host launches it), over streamable HTTP (a subprocess on a
free loopback port) and in process. Each proves a promise of the server on real stores: racing
claims are disjoint, a zombie's write is refused with a structured LeaseLost, a session that
ends gives back its task and its locks, HTTP needs the bearer token, bad input is a typed
refusal that changes nothing, and the tools say truthfully what they do.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from agentlease import AsyncQueue, AsyncSharedState
from tests.conftest import require

mcp_client = require("mcp.client", "mcp")
stdio = require("mcp.client.stdio", "mcp")
shttp = require("mcp.client.streamable_http", "mcp")
httpx2 = require("httpx2", "mcp")

from agentlease.mcp.server import build_server  # noqa: E402

SERVE = [sys.executable, "-m", "agentlease", "mcp", "serve"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


@asynccontextmanager
async def stdio_client(url: str, *extra: str) -> AsyncIterator[Any]:
    params = stdio.StdioServerParameters(
        command=SERVE[0], args=[*SERVE[1:], "--backend", url, *extra], env=_env()
    )
    async with mcp_client.Client(stdio.stdio_client(params)) as client:
        yield client


async def call(client: Any, tool: str, /, **args: Any) -> tuple[bool, Any]:
    result = await client.call_tool(tool, args)
    return bool(result.is_error), result.structured_content


async def enqueue_many(url: str, n: int) -> set[str]:
    async with AsyncQueue.connect(url) as queue:
        return {(await queue.enqueue("jobs", {"n": i})).task_id for i in range(n)}


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def any_url(request: pytest.FixtureRequest) -> str:
    fixture = {"sqlite": "sqlite_url", "redis": "served_url_redis"}
    return str(request.getfixturevalue(fixture.get(request.param, "served_url_postgres")))


async def test_two_clients_racing_claim_disjoint_tasks_each_once(any_url: str) -> None:
    wanted = await enqueue_many(any_url, 8)
    got: dict[str, list[str]] = {"a": [], "b": []}

    async def drain(name: str) -> None:
        async with stdio_client(any_url) as client:
            for _ in range(20):  # bounded: 8 tasks between two
                error, body = await call(client, "claim", queue="jobs")
                assert not error, body
                if body["task"] is None:
                    return
                got[name].append(body["task"]["task_id"])
                error, body = await call(client, "complete", lease=body["task"]["lease"])
                assert not error, body

    with anyio.fail_after(40):
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain, "a")
            tg.start_soon(drain, "b")
    assert not set(got["a"]) & set(got["b"])
    assert sorted(got["a"] + got["b"]) == sorted(wanted)
    async with AsyncQueue.connect(any_url) as queue:
        assert (await queue.stats("jobs")).counts == {"done": 8}


async def test_zombie_completion_is_refused_with_structured_lease_lost(sqlite_url: str) -> None:
    (task_id,) = await enqueue_many(sqlite_url, 1)
    short = ("--lease-for", "1", "--lease-cap", "1")
    with anyio.fail_after(30):
        async with stdio_client(sqlite_url, *short) as a, stdio_client(sqlite_url, *short) as b:
            error, body = await call(a, "claim", queue="jobs")
            assert not error
            assert body["task"]["attempt"] == 1
            old = body["task"]["lease"]
            # The cap ends A's lease however often the server renews it; B reclaims the task.
            for _ in range(100):
                error, claimed = await call(b, "claim", queue="jobs")
                assert not error, claimed
                if claimed["task"] is not None:
                    break
                await anyio.sleep(0.05)
            assert claimed["task"] == {**claimed["task"], "task_id": task_id, "attempt": 2}
            result = await a.call_tool("complete", {"lease": old, "result": {"late": True}})
            assert result.is_error
            body = result.structured_content
            assert body["error"] == "LeaseLost"
            assert (body["task_id"], body["attempt"], body["current_attempt"]) == (task_id, 1, 2)
            assert "Traceback" not in result.content[0].text
            error, _ = await call(b, "complete", lease=claimed["task"]["lease"], result="b")
            assert not error
    async with AsyncQueue.connect(sqlite_url) as queue:
        assert (await queue.get(task_id)).state == "done"


async def test_a_session_that_ends_gives_back_its_task_and_locks(sqlite_url: str) -> None:
    (task_id,) = await enqueue_many(sqlite_url, 1)
    with anyio.fail_after(30):
        async with stdio_client(sqlite_url) as a:
            error, body = await call(a, "claim", queue="jobs")
            assert not error
            assert body["task"]["attempt"] == 1
            error, locks = await call(a, "locks_acquire", names=["acct:1", "inv:2"], timeout=2)
            assert not error, locks
        # A's stdin closed and its server process gave everything back before exiting.
        async with AsyncSharedState.connect(sqlite_url) as state:
            assert await state.lock_holders(["acct:1", "inv:2"]) == {"acct:1": None, "inv:2": None}
        async with stdio_client(sqlite_url) as b:
            error, body = await call(b, "claim", queue="jobs")
            assert not error
            assert body["task"]["task_id"] == task_id
            assert body["task"]["attempt"] == 2
            error, locks = await call(b, "locks_acquire", names=["inv:2"], timeout=2)
            assert not error
            assert locks["tokens"] == {"inv:2": 2}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_server(sqlite_url: str) -> Iterator[tuple[str, str, str]]:
    port, token = _free_port(), "s3cret-token"
    args = ["--backend", sqlite_url, "--transport", "http", "--port", str(port)]
    proc = subprocess.Popen(
        [*SERVE, *args], env={**_env(), "AGENTLEASE_MCP_TOKEN": token}, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline().decode()  # printed once the app is built
        assert "agentlease MCP server on" in line, line
        for _ in range(200):  # the socket opens just after
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None
                anyio.run(anyio.sleep, 0.05)
        yield url, token, sqlite_url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        assert proc.stderr is not None
        proc.stderr.close()


async def test_http_needs_the_bearer_token(http_server: tuple[str, str, str]) -> None:
    url, token, store = http_server
    hello = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with httpx2.AsyncClient(timeout=10) as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
            response = await http.post(url, json=hello, headers=headers)
            assert response.status_code == 401, headers
    (task_id,) = await enqueue_many(store, 1)
    with anyio.fail_after(20):
        authed = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=10)
        async with (
            authed,
            mcp_client.Client(shttp.streamable_http_client(url, http_client=authed)) as c,
        ):
            error, body = await call(c, "claim", queue="jobs")
            assert not error
            assert body["task"]["task_id"] == task_id
            error, _locks = await call(c, "locks_acquire", names=["x"], timeout=1)
            assert not error
        # The client deleted its session on the way out: the server gives the task and the
        # lock back as the session ends, which may be just after the DELETE is answered.
        async with AsyncQueue.connect(store) as queue, AsyncSharedState.connect(store) as state:
            while (await queue.stats("jobs")).counts != {"queued": 1} or (
                await state.lock_holders(["x"])
            ) != {"x": None}:
                await anyio.sleep(0.05)  # bounded by the fail_after above


@asynccontextmanager
async def in_process(url: str, **options: Any) -> AsyncIterator[Any]:
    async with mcp_client.Client(build_server(url, **options), mode="legacy") as client:
        yield client


async def test_bad_input_is_a_typed_refusal_that_changes_nothing(sqlite_url: str) -> None:
    async with in_process(sqlite_url, max_payload_bytes=1000) as c:
        refusals = [
            ("enqueue", {"queue": 5, "payload": 1}, "InvalidInput"),
            ("enqueue", {"queue": "bad queue!", "payload": 1}, "InvalidName"),
            ("enqueue", {"queue": "q", "payload": "x" * 5000}, "PayloadTooLarge"),
            ("enqueue", {"queue": "q", "priority": "high"}, "InvalidInput"),
            ("enqueue", {"queue": "q", "surprise": 1}, "InvalidInput"),
            ("stats", {"queue": "q"}, "UnknownQueue"),
            ("complete", {"lease": "not-a-lease"}, "InvalidInput"),
            ("locks_acquire", {"names": ["a"]}, "InvalidInput"),  # the timeout is required
            ("locks_acquire", {"names": ["a"], "timeout": 1, "hold": 3600}, "InvalidInput"),
            ("state_compare_and_set", {"key": "k", "expected_version": 0, "value": [1]}, None),
            ("counter_add", {"name": "c", "n": 1.5}, "InvalidInput"),
            ("nope", {}, "InvalidInput"),
        ]
        for tool, args, expected in refusals:
            result = await c.call_tool(tool, args)
            assert result.is_error, (tool, args)
            body = result.structured_content
            assert body["error"] == (expected or "InvalidInput"), body
            assert "Traceback" not in result.content[0].text
        error, body = await call(c, "counter_add", name="seats", n=3, limit=2)
        assert error
        assert body["error"] == "LimitReached"
        assert await call(c, "counter_get", name="seats") == (False, {"value": 0})
        assert await call(c, "state_get", key="k") == (False, {"value": {}, "version": 0})
    async with AsyncQueue.connect(sqlite_url) as queue:
        assert await queue.queues() == []


async def test_session_owned_tools_renew_and_replay(sqlite_url: str) -> None:
    async with in_process(sqlite_url, lease_for=1, lease_cap=60) as c:
        await call(c, "enqueue", queue="q", payload={"to": "ada"})
        _, body = await call(c, "claim", queue="q")
        lease = body["task"]["lease"]
        begin = {"tool": "send", "args": {"to": "ada"}, "task_id": "t", "step": "mail"}
        error, act = await call(c, "action_begin", **begin)
        assert not error
        assert not act["replayed"]
        await anyio.sleep(2.5)  # past two lease lengths the agent never heartbeat through
        async with AsyncQueue.connect(sqlite_url) as queue:
            (live,) = await queue.inspect("q")
            assert live.expires_in > 0  # the server renewed it
        assert (await call(c, "action_complete", key=act["key"], result={"id": 1}))[0] is False
        error, again = await call(c, "action_begin", **begin)
        assert (error, again["replayed"], again["result"]) == (False, True, {"id": 1})
        assert (await call(c, "complete", lease=lease, result="sent"))[0] is False


async def test_tools_and_their_annotations(sqlite_url: str) -> None:
    async with in_process(sqlite_url) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    assert {"enqueue", "claim", "heartbeat", "complete", "fail", "release", "stats"} <= set(tools)
    assert {"action_begin", "action_complete", "action_fail", "locks_acquire"} <= set(tools)
    assert {"locks_release", "state_get", "state_compare_and_set", "state_set_field"} <= set(tools)
    assert {"counter_get", "counter_add"} <= set(tools)
    read_only = {n for n, t in tools.items() if t.annotations.read_only_hint}
    assert read_only == {"stats", "state_get", "counter_get"}
    assert not tools["claim"].annotations.idempotent_hint
    assert tools["complete"].annotations.idempotent_hint
    assert not tools["complete"].annotations.destructive_hint
    assert tools["state_compare_and_set"].annotations.destructive_hint
    assert all(t.annotations.open_world_hint is False for t in tools.values())
    assert tools["locks_acquire"].input_schema["required"] == ["names", "timeout"]
