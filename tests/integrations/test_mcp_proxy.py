"""``agentlease mcp proxy`` end to end: the SDK's own client launches the proxy (``python -m
agentlease mcp proxy ... -- python -m tests.integrations._mcp_side_effect_server FILE``) over
stdio, and the side-effect file counts what the wrapped tool really did."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require

require("mcp", "mcp")

import mcp_types as types  # noqa: E402
from mcp import Client, StdioServerParameters, stdio_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

from agentlease.mcp._faults import Fault, FaultPlan  # noqa: E402

WT = Path(__file__).resolve().parents[2]
CALL = 15.0  # the bound on every call that is meant to be answered

pytestmark = pytest.mark.timeout(60)


@asynccontextmanager
async def proxied(url: str, tmp_path: Path, *options: str) -> AsyncIterator[tuple[Client, Path]]:
    """A client of the proxy, which wraps the side-effect server writing to a fresh file."""
    lines = tmp_path / f"effects-{len(list(tmp_path.glob('effects-*')))}.txt"
    env = {**os.environ, "PYTHONPATH": f"{WT / 'src'}{os.pathsep}{WT}"}
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            *("-m", "agentlease", "mcp", "proxy", "--backend", url, *options, "--"),
            *(sys.executable, "-m", "tests.integrations._mcp_side_effect_server", str(lines)),
        ],
        cwd=str(WT),
        env=env,
    )
    async with Client(stdio_client(params), cache=None, read_timeout_seconds=CALL) as client:
        yield client, lines


def effects(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def text(result: types.CallToolResult) -> str:
    [block] = result.content
    assert isinstance(block, types.TextContent)
    return block.text


def body(result: types.CallToolResult) -> dict[str, Any]:
    assert result.is_error
    parsed: dict[str, Any] = json.loads(text(result))
    return parsed


async def call_until_answered(
    client: Client, tool: str, args: dict[str, Any]
) -> types.CallToolResult:
    """Call, retrying (a bounded number of times, after retry_after) while the first
    attempt is still in flight: what a careful client does."""
    import anyio

    for _ in range(20):
        result = await client.call_tool(tool, args)
        if not (result.is_error and body(result).get("error") == "DuplicateInFlight"):
            return result
        await anyio.sleep(min(1.0, float(body(result)["retry_after"]) + 0.05))
    raise AssertionError("still in flight after 20 retries")


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def any_url(request: pytest.FixtureRequest) -> str:
    fixture = {"sqlite": "sqlite_url", "redis": "served_url_redis"}.get(
        request.param, "served_url_postgres"
    )
    url: str = request.getfixturevalue(fixture)
    return url


async def test_retry_after_a_dropped_response_acts_once(any_url: str, tmp_path: Path) -> None:
    async with proxied(any_url, tmp_path, "--fault", "drop_response:1:1") as (client, lines):
        args = {"text": "pay", "idempotency_key": "order-17"}
        with pytest.raises(MCPError) as lost:
            await client.call_tool("record", args, read_timeout_seconds=1.5)
        assert lost.value.code == types.REQUEST_TIMEOUT
        retried = await call_until_answered(client, "record", args)
        assert not retried.is_error
        assert text(retried) == "recorded 'pay' as line 1"  # the first call's own result
        assert (retried.meta or {}).get("agentlease/replayed") is True
        assert effects(lines) == ["pay x1"]  # and the wrapped server never saw the key


async def test_a_duplicated_request_acts_once(sqlite_url: str, tmp_path: Path) -> None:
    async with proxied(sqlite_url, tmp_path, "--fault", "duplicate") as (client, lines):
        result = await client.call_tool("record", {"text": "mail"})
        assert text(result) == "recorded 'mail' as line 1"
        assert effects(lines) == ["mail x1"]


async def test_keyless_calls_merge_within_the_window_by_arguments(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with proxied(sqlite_url, tmp_path, "--window", "600") as (client, lines):
        first = await client.call_tool("record", {"text": "a"})
        again = await client.call_tool("record", {"text": "a"})
        other = await client.call_tool("record", {"text": "a", "copies": 2})
        assert text(first) == text(again) == "recorded 'a' as line 1"
        assert (again.meta or {}).get("agentlease/replayed") is True
        assert text(other) == "recorded 'a' as line 2"
        assert effects(lines) == ["a x1", "a x2"]


async def test_a_read_only_tool_passes_through(sqlite_url: str, tmp_path: Path) -> None:
    async with proxied(sqlite_url, tmp_path) as (client, _):
        first = await client.call_tool("count", {})
        second = await client.call_tool("count", {})
        assert (text(first), text(second)) == ("0 lines; read 1", "0 lines; read 2")


async def test_an_explicit_key_reused_with_other_arguments_conflicts(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with proxied(sqlite_url, tmp_path) as (client, lines):
        await client.call_tool("record", {"text": "x", "idempotency_key": "k-1"})
        clash = await client.call_tool("record", {"text": "y", "idempotency_key": "k-1"})
        refused = body(clash)
        assert refused["error"] == "IdempotencyConflict"
        assert refused["key"] == "mcp:k-1"
        # The key in _meta is the same key.
        meta = await client.call_tool(
            "record", {"text": "x"}, meta={"agentlease/idempotency_key": "k-1"}
        )
        assert text(meta) == "recorded 'x' as line 1"
        assert effects(lines) == ["x x1"]


async def test_tool_errors_are_replayed_and_breakers_open(sqlite_url: str, tmp_path: Path) -> None:
    options = ("--breaker-failures", "2", "--breaker-reset", "600")
    async with proxied(sqlite_url, tmp_path, *options) as (client, _):
        first = await client.call_tool("refuse", {"reason": "r", "idempotency_key": "e"})
        again = await client.call_tool("refuse", {"reason": "r", "idempotency_key": "e"})
        assert first.is_error
        assert again.is_error
        assert text(first) == text(again)
        assert (again.meta or {}).get("agentlease/replayed") is True  # stored, not run again
        assert "refused: r" in text(first)
        await client.call_tool("refuse", {"reason": "other"})  # the second failure: open
        refused = body(await client.call_tool("refuse", {"reason": "third"}))
        assert refused["error"] == "CircuitOpen"
        assert refused["tool"] == "refuse"
        assert refused["retry_after_s"] > 0


async def test_the_tool_list_and_annotations_pass_through(sqlite_url: str, tmp_path: Path) -> None:
    direct = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tests.integrations._mcp_side_effect_server", str(tmp_path / "direct.txt")],
        cwd=str(WT),
    )
    async with Client(stdio_client(direct), cache=None, read_timeout_seconds=CALL) as wrapped:
        expected = {t.name: t for t in (await wrapped.list_tools()).tools}
    async with proxied(sqlite_url, tmp_path) as (client, _):
        listed = {t.name: t for t in (await client.list_tools()).tools}
    assert (
        listed.keys() == expected.keys() == {"record", "refuse", "count", "pid", "crash", "gated"}
    )
    for name, tool in expected.items():
        got = listed[name]
        assert got.annotations == tool.annotations
        assert got.description == tool.description
        assert got.output_schema == tool.output_schema
        props = dict(got.input_schema["properties"])
        if name in ("count", "pid"):  # read-only: offered as it is
            assert got.input_schema == tool.input_schema
        else:
            assert props.pop("idempotency_key")["type"] == "string"
            assert props == tool.input_schema["properties"]
    assert expected["count"].annotations is not None
    assert expected["count"].annotations.read_only_hint is True


def test_faults_are_drawn_from_the_seed() -> None:
    def schedule(seed: int) -> list[frozenset[str]]:
        plan = FaultPlan(
            faults=[Fault.parse("delay:0.5"), Fault.parse("ack_lost:0.5:2")], seed=seed
        )
        return [plan.draw(n) for n in range(1, 41)]

    assert schedule(7) == schedule(7)
    assert schedule(7) != schedule(8)
    assert sum("ack_lost" in s for s in schedule(7)) == 2  # its limit
    assert 5 < sum("delay" in s for s in schedule(7)) < 35


class FakeUpstream:
    """A wrapped server in memory whose one tool, ``record``, answers with its call count."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def list_tools(self, *, cursor: str | None = None) -> types.ListToolsResult:
        schema = {"type": "object", "properties": {"text": {"type": "string"}}}
        return types.ListToolsResult(tools=[types.Tool(name="record", input_schema=schema)])

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
    ) -> types.CallToolResult:
        self.calls.append({"tool": name, **(arguments or {})})
        reply = f"{name} {len(self.calls)}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=reply)])


async def test_ack_lost_then_retry_replays_in_process() -> None:
    from agentlease import AsyncIdempotency
    from agentlease.mcp.proxy import ToolProxy

    upstream = FakeUpstream()
    async with AsyncIdempotency.connect("memory://") as keys:
        plan = FaultPlan(faults=[Fault.parse("ack_lost:1:1")])
        proxy = ToolProxy(upstream, keys, faults=plan)
        with pytest.raises(MCPError, match="lost"):
            await proxy.call_tool("record", {"text": "a", "idempotency_key": "k"})
        again = await proxy.call_tool("record", {"text": "a", "idempotency_key": "k"})
        assert text(again) == "record 1"
        assert upstream.calls == [{"tool": "record", "text": "a"}]


async def test_reorder_delivers_a_held_answer_after_the_next_one() -> None:
    import asyncio

    from agentlease import AsyncIdempotency
    from agentlease.mcp.proxy import ToolProxy

    upstream = FakeUpstream()
    answered: list[str] = []
    async with AsyncIdempotency.connect("memory://") as keys:
        plan = FaultPlan(faults=[Fault.parse("reorder:1:1")], reorder_for=CALL)
        proxy = ToolProxy(upstream, keys, faults=plan)

        async def call(tool: str, text_: str) -> None:
            result = await proxy.call_tool(tool, {"text": text_})
            answered.append(text(result))

        first = asyncio.ensure_future(call("record", "first"))
        for _ in range(1000):  # until the first call has reached the wrapped server
            if upstream.calls:
                break
            await asyncio.sleep(0)
        await asyncio.wait_for(call("record", "second"), CALL)
        await asyncio.wait_for(first, CALL)
    assert answered == ["record 2", "record 1"]
