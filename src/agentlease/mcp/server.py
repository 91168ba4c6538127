"""``agentlease mcp serve``: an MCP server whose tools let any agent take part in shared queues
and shared state (claim and complete tasks, idempotent side effects, lock sets, versioned
records and counters) on one agentlease store.

:func:`build_server` returns the MCP SDK's low-level ``Server``; :func:`serve_stdio` runs it on
standard input and output, :func:`http_app` wraps it as a streamable-HTTP ASGI app that demands
a bearer token.

**What a session takes, the session gives back.** A claim's lease, a lock set and an
idempotency reservation taken through the tools belong to the MCP session that took them (the
one opened by the ``initialize`` handshake): the server renews them while it lives, since an
agent cannot heartbeat while its model thinks; caps their total length (``lease_cap`` for
leases and reservations, a short ``lock_cap`` for locks: a lock held across model turns is what
agentlease's guards forbid); and releases them when the session ends: on stdio when standard
input closes, on HTTP when the client deletes the session or the session is idle (no request
in flight, no open stream) for ``lease_cap`` seconds. A client that vanishes without either is
bounded by the caps. The stateless 2026 protocol era has no session: the server answers
``server/discover`` with "method not found", so clients fall back to the handshake, and the
three tools that take something on a session's behalf refuse a request without one.

**Refusals are data.** Every refusal (a lost lease, a conflict, a bad argument, an unknown
queue, a payload that is too large, a store that is down or does not answer) is a tool error
(``isError``) whose text and structured content are the JSON of
:func:`agentlease._error_body.error_body`; never a stack trace. A call waits for the store at
most a third of ``lease_for`` (plus a lock set's own ``timeout``): a hung store is refused with
``BackendUnavailable``, it never hangs the agent.

**Stopping gives back too.** On SIGTERM or SIGINT the server ends its sessions (what they hold
is given back, within :data:`SHUTDOWN_GRACE` seconds) and then exits; a second signal ends it at
once. On stdio :func:`serve_stdio` does this and the process then ends by the signal it got; on
HTTP uvicorn stops serving and the lifespan's end gives back what is left. SIGKILL, or a store
that is down at that moment, leaves the leases to expire (at most ``lease_for`` later) and locks
to their TTL, as after any crash.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import inspect
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import mcp_types as types
import orjson
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.runner import serve_loop
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agentlease._async.idempotency import AsyncIdempotency
from agentlease._async.queue import AsyncQueue
from agentlease._async.state import AsyncSharedState
from agentlease._error_body import error_body
from agentlease._settings import QueueSettings
from agentlease._validate import duration
from agentlease.errors import AgentLeaseError, InvalidInput

from ._sessions import Holdings, Runtime
from ._tools import TOOLS, call

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext

__all__ = [
    "DEFAULT_LEASE_CAP",
    "DEFAULT_LOCK_CAP",
    "SHUTDOWN_GRACE",
    "build_server",
    "http_app",
    "serve_stdio",
]

logger = logging.getLogger("agentlease.mcp")

DEFAULT_LEASE_FOR = 30.0
"""Seconds a claim's lease lasts between the server's renewals (every third of it)."""
DEFAULT_LEASE_CAP = 300.0
"""The longest a session may hold a task (and an idempotency reservation), renewals included."""
DEFAULT_LOCK_CAP = 30.0
"""The longest a session may hold a lock set."""
SHUTDOWN_GRACE = 5.0
"""The longest a stopping server spends giving back what its sessions hold."""

_STATE_KEY = "agentlease.holdings"
_BY_NAME = {tool.name: tool for tool in TOOLS}

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


def _text(body: object) -> list[types.ContentBlock]:
    return [types.TextContent(type="text", text=orjson.dumps(body).decode())]


def _refusal(exc: BaseException) -> types.CallToolResult:
    body = error_body(exc)
    return types.CallToolResult(content=_text(body), structured_content=body, is_error=True)


def _holdings(ctx: ServerRequestContext[Runtime, Any]) -> Holdings | None:
    """The calling session's holdings, opened on first use and closed with the connection;
    ``None`` for a request without a session (the 2026 per-request era)."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return None
    # The SDK keeps the connection (its per-session state and teardown stack) on the session
    # object it hands each request; it has no public accessor yet.
    connection = getattr(ctx.session, "_connection", None)
    if not isinstance(connection, Connection):
        return None
    holdings = connection.state.get(_STATE_KEY)
    if not isinstance(holdings, Holdings):
        runtime: Runtime = ctx.lifespan_context
        holdings = runtime.open_session()
        connection.state[_STATE_KEY] = holdings
        connection.exit_stack.push_async_callback(holdings.close)
    return holdings


async def _list_tools(
    ctx: ServerRequestContext[Runtime, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(
        tools=[
            types.Tool(
                name=tool.name,
                description=tool.description,
                input_schema=tool.input_schema,
                annotations=types.ToolAnnotations(
                    read_only_hint=tool.read_only,
                    destructive_hint=tool.destructive,
                    idempotent_hint=tool.idempotent,
                    open_world_hint=False,
                ),
            )
            for tool in TOOLS
        ]
    )


async def _call_tool(
    ctx: ServerRequestContext[Runtime, Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    tool = _BY_NAME.get(params.name)
    runtime: Runtime = ctx.lifespan_context
    try:
        if tool is None:
            raise InvalidInput(f"no tool {params.name!r}: see tools/list")
        args = params.arguments or {}
        if not isinstance(args, dict):
            raise InvalidInput("arguments must be a JSON object")
        with runtime.calling():
            result = await call(tool, runtime, _holdings(ctx), args)
    except AgentLeaseError as exc:
        return _refusal(exc)
    except Exception as exc:  # a bug or a driver's surprise: logged here, not shown in full
        logger.exception("tool %s failed", params.name)
        return _refusal(exc)
    return types.CallToolResult(content=_text(result), structured_content=result)


async def _no_discover(
    ctx: ServerRequestContext[Runtime, Any], params: types.RequestParams
) -> None:
    # This server's guarantees rest on sessions, which the 2026 era does not have: answering
    # discover with "method not found" sends clients in "auto" mode to the handshake.
    raise MCPError(code=types.METHOD_NOT_FOUND, message="Method not found", data="server/discover")


def build_server(
    url: str,
    *,
    lease_for: float = DEFAULT_LEASE_FOR,
    lease_cap: float = DEFAULT_LEASE_CAP,
    lock_cap: float = DEFAULT_LOCK_CAP,
    max_payload_bytes: int | None = None,
) -> Server[Runtime]:
    """The MCP server of the store at ``url`` (its clients connect when the server starts).

    Args:
        url: the agentlease store (``sqlite:///tasks.db``, ``redis://...``, ...).
        lease_for: seconds a claim's lease lasts between renewals (renewed every third).
        lease_cap: the longest a session holds a task or a reservation, renewals included.
        lock_cap: the longest a session holds a lock set.
        max_payload_bytes: the largest encoded payload or result (default: the queue's).
    """
    lease_for = duration(lease_for, "lease_for")
    lease_cap = duration(lease_cap, "lease_cap")
    lock_cap = duration(lock_cap, "lock_cap")
    if lease_cap < lease_for:
        raise InvalidInput(f"lease_cap ({lease_cap} s) must be at least lease_for ({lease_for} s)")
    settings = QueueSettings(lease_for=lease_for, max_lease=lease_cap)
    if max_payload_bytes is not None:
        settings = dataclasses.replace(settings, max_payload_bytes=max_payload_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(_: Server[Runtime]) -> AsyncIterator[Runtime]:
        async with contextlib.AsyncExitStack() as stack:
            queue = await stack.enter_async_context(AsyncQueue.connect(url, settings=settings))
            state = await stack.enter_async_context(AsyncSharedState.connect(url))
            keys = await stack.enter_async_context(AsyncIdempotency.connect(url))
            runtime = Runtime(queue, state, keys, lease_for, lease_cap, lock_cap)
            stack.push_async_callback(runtime.shutdown, SHUTDOWN_GRACE)
            import anyio

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(runtime.renew_forever)
                try:
                    yield runtime
                finally:
                    tasks.cancel_scope.cancel()

    server: Server[Runtime] = Server(
        "agentlease",
        instructions=(
            "Shared work queues and shared state. claim a task, do it, then complete (or fail, "
            "or release) it with the lease string; a refusal such as LeaseLost means stop. "
            "Wrap side effects in action_begin / action_complete. Hold locks briefly: never "
            "across your own thinking."
        ),
        lifespan=lifespan,
        on_list_tools=_list_tools,
        on_call_tool=_call_tool,
    )
    server.add_request_handler("server/discover", types.RequestParams, _no_discover)
    return server


async def serve_stdio(server: Server[Runtime]) -> None:
    """Serve one session on standard input and output, until standard input closes (then
    everything the session holds is given back) or, on POSIX, SIGTERM or SIGINT arrives: then
    everything is given back (within :data:`SHUTDOWN_GRACE` seconds) and the process ends by
    that signal, as it would have without a handler; a second signal ends it at once. Call it
    in the main thread (where signal handlers go)."""
    import anyio
    from mcp.server.stdio import stdio_server

    async with server.lifespan(server) as runtime, anyio.create_task_group() as tasks:
        if os.name == "posix":
            tasks.start_soon(_stop_on_signal, runtime)
        async with stdio_server() as (read, write):
            await serve_loop(
                server,
                read,
                write,
                lifespan_state=runtime,
                init_options=server.create_initialization_options(),
            )
        tasks.cancel_scope.cancel()


async def _stop_on_signal(runtime: Runtime) -> None:
    """On SIGTERM or SIGINT: give back what the session holds, then end the process by that
    signal. Ending it is the only way out: the SDK reads standard input in a thread that
    nothing can interrupt, so the loop cannot wind down while the host keeps the pipe open."""
    import anyio

    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for received in signals:
            signum = received
            break
        else:  # pragma: no cover - the receiver never ends by itself
            return
    for each in (signal.SIGTERM, signal.SIGINT):
        signal.signal(each, signal.SIG_DFL)  # a second signal ends the process at once
    logger.warning("%s: giving back what the session holds, then stopping", signum.name)
    await runtime.shutdown(SHUTDOWN_GRACE)
    os.kill(os.getpid(), signum)


def http_app(
    server: Server[Runtime],
    *,
    token: str | None,
    host: str = "127.0.0.1",
    idle_timeout: float = DEFAULT_LEASE_CAP,
) -> ASGIApp:
    """The streamable-HTTP app (at ``/mcp``) of ``server``: every request must carry
    ``Authorization: Bearer <token>`` or gets 401 (``token=None``: no check, for a loopback
    host only; the command refuses it elsewhere). A session with no request in flight and no
    open stream for ``idle_timeout`` seconds (give the lease cap) ends, and gives back what it
    holds."""
    options: dict[str, Any] = {}
    if "session_idle_timeout" in inspect.signature(server.streamable_http_app).parameters:
        options["session_idle_timeout"] = idle_timeout  # mcp 2.0 has none: DELETE or the caps
    app = server.streamable_http_app(host=host, **options)
    if token is None:
        return app
    expected = f"Bearer {token}".encode()

    async def guarded(
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                body = orjson.dumps({"error": "Unauthorized", "message": "bearer token required"})
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b'Bearer realm="agentlease"'),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded
