"""``agentlease mcp proxy`` at its edges: the store down, hung and restarted; the wrapped server
dying mid-call; the proxy signalled (SIGTERM, SIGINT, SIGKILL) and paused past its in-flight
lease. The SDK's own client launches the proxy as the other proxy tests do; the stores that are
broken are private ``redis-server`` processes, never the shared one."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import require

require("mcp", "mcp")

import anyio  # noqa: E402

from tests.integrations.test_mcp_proxy import (  # noqa: E402
    body,
    call_until_answered,
    effects,
    proxied,
    text,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.xdist_group("processes")]

FAST = "?socket_timeout=1&connect_timeout=1"  # a hung store is given up within seconds


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def proxy_pid(lines: Path) -> int:
    """The pid of the proxy process serving the side-effect file ``lines`` (by its command line,
    which names that file only there and in its wrapped server's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"proxy" in argv and str(lines).encode() in argv:
            found.append(int(entry.name))
    [pid] = found
    return pid


async def wrapped_pid(client: object) -> int:
    return int(text(await client.call_tool("pid", {})))  # type: ignore[attr-defined]


async def test_store_down_fails_closed_then_recovers(private_redis, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = private_redis()
    async with proxied(server.url + FAST, tmp_path) as (client, lines):
        first = await client.call_tool("record", {"text": "a", "idempotency_key": "k-a"})
        assert text(first) == "recorded 'a' as line 1"
        server.kill()
        refused = body(await client.call_tool("record", {"text": "b", "idempotency_key": "k-b"}))
        assert refused["error"] == "BackendUnavailable"
        assert "Traceback" not in refused["message"]
        assert effects(lines) == ["a x1"]  # without its key the call is not made
        read = await client.call_tool("count", {})  # read-only: needs no key
        assert not read.is_error
        assert text(read).startswith("1 lines")
        server.start()  # the store comes back with its data gone (no persistence)
        again = await client.call_tool("record", {"text": "b", "idempotency_key": "k-b"})
        assert text(again) == "recorded 'b' as line 2"
        replay = await client.call_tool("record", {"text": "b", "idempotency_key": "k-b"})
        assert (replay.meta or {}).get("agentlease/replayed") is True
        assert effects(lines) == ["a x1", "b x1"]


async def test_a_hung_store_refuses_within_its_timeout(private_redis, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = private_redis()
    async with proxied(server.url + FAST, tmp_path, "--hold-for", "1") as (client, lines):
        await client.call_tool("record", {"text": "a"})
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        try:
            with anyio.fail_after(10):  # the URL's socket_timeout bounds it, not the client
                hung = await client.call_tool("record", {"text": "b", "idempotency_key": "h"})
        finally:
            server.process.send_signal(signal.SIGCONT)
        assert body(hung)["error"] == "BackendUnavailable"
        assert effects(lines) == ["a x1"]
        # The reservation the store got before it hung may have landed after the proxy gave up:
        # then the key is in flight until its lease runs out, and the call acts after it.
        woke = await call_until_answered(client, "record", {"text": "b", "idempotency_key": "h"})
        assert text(woke) == "recorded 'b' as line 2"
        assert effects(lines) == ["a x1", "b x1"]


async def test_the_wrapped_server_dying_mid_call(sqlite_url: str, tmp_path: Path) -> None:
    async with proxied(sqlite_url, tmp_path) as (client, lines):
        child = await wrapped_pid(client)
        died = body(await client.call_tool("crash", {"text": "x", "idempotency_key": "c"}))
        assert died["error"] == "ServerExited"
        assert "unknown" in died["message"]
        assert gone_within(child, 10)
        assert effects(lines) == ["x crash"]
        # Another call of this proxy is refused at once, and reserves no key.
        after = body(await client.call_tool("record", {"text": "y", "idempotency_key": "y"}))
        assert after["error"] == "ServerExited"
    # The ambiguous call's key stays in flight: a retry through a new proxy does not act again.
    async with proxied(sqlite_url, tmp_path) as (client, again):
        retry = body(await client.call_tool("crash", {"text": "x", "idempotency_key": "c"}))
        assert retry["error"] == "DuplicateInFlight"
        assert retry["retry_after"] > 0
        fresh = await client.call_tool("record", {"text": "y", "idempotency_key": "y"})
        assert text(fresh) == "recorded 'y' as line 1"  # "y" was never reserved
        assert effects(again) == ["y x1"]
    assert effects(lines) == ["x crash"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
async def test_a_signalled_proxy_leaves_no_orphan(
    signum: signal.Signals, sqlite_url: str, tmp_path: Path
) -> None:
    async with proxied(sqlite_url, tmp_path) as (client, lines):
        child = await wrapped_pid(client)
        proxy = proxy_pid(lines)
        await client.call_tool("record", {"text": "a"})
        os.kill(proxy, signum)
        assert gone_within(proxy, 10), f"the proxy outlived {signum.name}"
        assert gone_within(child, 10), f"the wrapped server outlived the proxy ({signum.name})"


async def test_a_paused_proxy_past_its_lease_is_refused_as_stale(
    sqlite_url: str, tmp_path: Path
) -> None:
    hold = ("--hold-for", "1")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with (
        proxied(sqlite_url, tmp_path / "a", *hold) as (first, first_lines),
        proxied(sqlite_url, tmp_path / "b", *hold) as (second, second_lines),
    ):
        paused = proxy_pid(first_lines)
        args = {"text": "pay", "idempotency_key": "order-9"}
        async with anyio.create_task_group() as tg:
            answer: list[object] = []

            async def call_first() -> None:
                answer.append(await first.call_tool("gated", args))

            tg.start_soon(call_first)
            with anyio.fail_after(10):  # until the first proxy's call is under way
                while not first_lines.with_suffix(".waiting").exists():
                    await anyio.sleep(0.02)
            os.kill(paused, signal.SIGSTOP)
            try:
                # Past the paused proxy's lease, the second proxy takes the key over and acts.
                second_lines.with_suffix(".gate").touch()
                taken = await call_until_answered(second, "gated", args)
                assert text(taken) == "gated 'pay' as line 1"
                first_lines.with_suffix(".gate").touch()
            finally:
                os.kill(paused, signal.SIGCONT)
        [stale] = answer
        refused = body(stale)  # type: ignore[arg-type]
        assert refused["error"] == "ReservationLost"
        # The one stored outcome is the second proxy's: the stale writer did not overwrite it.
        replay = await first.call_tool("gated", args)
        assert text(replay) == "gated 'pay' as line 1"
        assert (replay.meta or {}).get("agentlease/replayed") is True
        # Each proxy's wrapped server acted once: two side effects, at most one per live lease.
        assert effects(second_lines) == ["pay gated"]
        assert effects(first_lines) == ["pay gated"]
