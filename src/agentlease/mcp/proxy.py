"""``agentlease mcp proxy``: an MCP server that wraps another and makes its tool calls idempotent.

The proxy launches the wrapped server (any command speaking MCP over stdio), lists its tools
and serves them, unchanged, to its own client over stdio; every call is forwarded. A tool
annotated ``readOnlyHint`` passes straight through. Every other call is an idempotent action
(:class:`~agentlease.AsyncIdempotency`) on the store at ``--backend``: a retry returns the
first call's stored result (the whole ``CallToolResult``) instead of acting again.

**Which calls are the same action.** A call's key is, in this order:

1. the ``idempotency_key`` argument (each non-read-only tool's input schema gains this optional
   string; the proxy strips it before forwarding, so the wrapped server never sees it, unless
   the wrapped tool declares a parameter of that name itself, which then reaches it);
2. ``_meta["agentlease/idempotency_key"]`` (or ``_meta["idempotency_key"]``) of the request;
3. otherwise, derived from the proxy's session (one per proxy process, so one per client over
   stdio), the tool and the canonical JSON of its arguments, within a **window**: a call with
   the same tool and arguments as one that started less than ``window`` seconds before, in the
   same session, is that call again. This merges *intentional* repeats inside the window too
   (two identical "send this message" calls ten seconds apart send one message): a client that
   means to repeat an action gives each its own explicit key.

An explicit key is stored under ``<namespace>:<key>`` and its fingerprint covers the tool and
the arguments: the same key reused for other arguments (or another tool) is refused with
``IdempotencyConflict``, never replayed as the other action's result.

**Outcomes.** The wrapped tool's result is stored and replayed as it was, tool errors
(``isError``) included: a retry of a call that failed gets the same error (``release_errors``
makes a tool error release the key instead, so a retry runs the tool again). A JSON-RPC error
answered by the wrapped server (an unknown tool, invalid parameters) releases the key and is
passed on as it is. A call whose outcome is unknown (the wrapped server timed out or went away)
is ambiguous: its key stays in flight until its in-flight lease runs out, so an immediate retry
is refused (``DuplicateInFlight``, with ``retry_after``) rather than risk acting twice.

Refusals (``DuplicateInFlight``, ``IdempotencyConflict``, ``CircuitOpen``, an unreachable store,
a malformed key) are tool errors whose text is the JSON body of
:func:`agentlease._error_body.error_body`, never a stack trace.

**Edges.** An unreachable store fails closed: a non-read-only call is refused
(``BackendUnavailable``) and the wrapped tool is not called, since without its key the proxy
cannot promise once; read-only tools pass through. A hung store is given up after the store's
own timeouts (the Redis URL's ``socket_timeout``). A wrapped server that goes away mid-call
makes that call ambiguous (a ``ServerExited`` tool error, the key left in flight); the proxy
does not restart it (the client restarts the proxy), and refuses every later call at once
without reserving a key (:attr:`ToolProxy.lost`). A proxy paused past its in-flight lease
(``ProxySettings.idempotency.hold_for``) loses its keys: another holder may take one over and
act, and the paused proxy's late completion is refused (``ReservationLost``), never stored over
the taker's outcome.

**Circuit breakers.** With ``breaker_failures`` set, each tool has an
:class:`~agentlease.AsyncCircuitBreaker` in the store (``<namespace>:<tool>``): after that many
consecutive failed forwarded calls (tool errors, JSON-RPC errors, timeouts) the tool is refused
with ``CircuitOpen`` for ``breaker_reset`` seconds, then one trial call is let through.
Replays never reach the wrapped server and never count.

**Faults.** A :class:`~agentlease.mcp._faults.FaultPlan` injects seeded faults where the client
meets the proxy (delay, duplicate, drop_response, ack_lost, reorder), to prove a client and
the proxy together survive them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agentlease._async.budgets import AsyncCircuitBreaker
from agentlease._async.idempotency import AsyncIdempotency
from agentlease._async.state import AsyncSharedState
from agentlease._error_body import error_body
from agentlease._outcomes import NotApplied
from agentlease._policy.keys import canonical_json
from agentlease._settings import IdempotencySettings
from agentlease.errors import AgentLeaseError, InvalidInput
from agentlease.mcp._faults import Fault, FaultPlan

if TYPE_CHECKING:
    import mcp_types as types

__all__ = ["KEY_ARGUMENT", "META_KEYS", "Fault", "FaultPlan", "ProxySettings", "ToolProxy", "run"]

logger = logging.getLogger("agentlease.mcp.proxy")

KEY_ARGUMENT = "idempotency_key"
"""The optional argument that carries a call's idempotency key (stripped before forwarding)."""

META_KEYS = ("agentlease/idempotency_key", "idempotency_key")
"""The request ``_meta`` fields that carry a call's idempotency key, in order of precedence."""

_KEY_SCHEMA = {
    "type": "string",
    "description": (
        "Optional. A key naming this action (1 to 256 printable ASCII characters, no spaces): "
        "a retry with the same key returns the first call's result instead of acting again. "
        "Without it, identical calls within a short window are treated as one."
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxySettings:
    """How the proxy keys, forwards and guards calls.

    Attributes:
        window: seconds within which a call without a key and with the same tool and arguments
            as an earlier one in the session is that call again.
        namespace: prefix of explicit keys and breaker names in the store (two proxies of
            different servers on one store use different namespaces).
        call_timeout: seconds a forwarded call may take before it is given up (ambiguous).
        release_errors: a tool error releases the key (a retry runs again) instead of being
            stored and replayed.
        breaker_failures: consecutive failures that open a tool's circuit (0: no breakers).
        breaker_reset: seconds an open circuit refuses calls before its one trial.
        idempotency: the store's dedup retention and in-flight lease for the keys.
    """

    window: float = 60.0
    namespace: str = "mcp"
    call_timeout: float = 60.0
    release_errors: bool = False
    breaker_failures: int = 0
    breaker_reset: float = 30.0
    idempotency: IdempotencySettings = field(default_factory=IdempotencySettings)

    def __post_init__(self) -> None:
        for name in ("window", "call_timeout", "breaker_reset"):
            value = getattr(self, name)
            if not 0.0 < value <= 86_400.0:
                raise InvalidInput(f"{name} is in seconds, above 0 and at most 86400: {value!r}")
        if not 0 <= self.breaker_failures <= 1_000_000:
            raise InvalidInput(f"breaker_failures is 0 to 1000000, not {self.breaker_failures!r}")
        if not self.namespace or ":" in self.namespace or " " in self.namespace:
            raise InvalidInput(f"namespace {self.namespace!r} must be a word without ':'")


class Upstream(Protocol):
    """The wrapped server, as the proxy calls it (``mcp.Client`` fits)."""

    async def list_tools(self, *, cursor: str | None = None) -> types.ListToolsResult: ...

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
    ) -> types.CallToolResult: ...


class _Released(NotApplied):
    """A forwarded call's outcome that must not be stored: the key is released."""

    def __init__(self, result: types.CallToolResult | None, error: Exception | None) -> None:
        super().__init__("released")
        self.result = result
        self.error = error


class _Window:
    """The step id of a keyless call: the same for a call with the same tool and arguments as
    one that started less than ``window`` seconds before (the anchors are kept in memory: the
    session is this process)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._anchors: OrderedDict[tuple[str, bytes], tuple[float, str]] = OrderedDict()
        self._count = 0

    def step(self, tool: str, args: object) -> str:
        now = time.monotonic()
        while self._anchors:  # anchors are in order of age: drop those past the window
            oldest = next(iter(self._anchors.values()))
            if now - oldest[0] < self.window:
                break
            self._anchors.popitem(last=False)
        what = (tool, canonical_json(args))
        anchor = self._anchors.get(what)
        if anchor is None:
            self._count += 1
            anchor = (now, f"window:{self._count}")
            self._anchors[what] = anchor
        return anchor[1]


class _Reorder:
    """Answers held back until a later answer has been sent."""

    def __init__(self) -> None:
        self._held: list[asyncio.Event] = []

    async def hold(self, longest: float) -> None:
        event = asyncio.Event()
        self._held.append(event)
        try:
            await asyncio.wait_for(event.wait(), longest)
        except TimeoutError:  # nobody overtook: delivered late instead
            pass
        finally:
            if event in self._held:
                self._held.remove(event)
        for _ in range(20):  # let the overtaking answer be written first (best effort)
            await asyncio.sleep(0)

    def sent(self) -> None:
        held, self._held = self._held, []
        for event in held:
            event.set()


def _text(body: Mapping[str, object]) -> str:
    return json.dumps(body, sort_keys=True, default=str)


def refusal(exc: BaseException) -> types.CallToolResult:
    """A tool error whose text is the JSON body of ``exc`` (:func:`error_body`)."""
    import mcp_types as types

    return types.CallToolResult(
        content=[types.TextContent(type="text", text=_text(error_body(exc)))], is_error=True
    )


class ToolProxy:
    """The proxy's handling of ``tools/list`` and ``tools/call``, independent of transports.

    Args:
        upstream: the wrapped server (an entered ``mcp.Client``).
        keys: the idempotency store.
        settings: see :class:`ProxySettings`.
        state: the shared state for breakers (needed when ``breaker_failures`` is set).
        faults: the faults to inject (none by default).
        session: the session id that derived keys belong to (default: a random one).
    """

    def __init__(
        self,
        upstream: Upstream,
        keys: AsyncIdempotency,
        *,
        settings: ProxySettings | None = None,
        state: AsyncSharedState | None = None,
        faults: FaultPlan | None = None,
        session: str | None = None,
    ) -> None:
        self.upstream = upstream
        self.keys = keys
        self.settings = settings or ProxySettings()
        if self.settings.breaker_failures and state is None:
            raise InvalidInput("breakers need the shared state of the store (state=...)")
        self.state = state
        self.faults = faults or FaultPlan()
        self.session = session or uuid.uuid4().hex
        self._tools: dict[str, types.Tool] = {}
        self._window = _Window(self.settings.window)
        self._breakers: dict[str, AsyncCircuitBreaker] = {}
        self._calls = 0
        self._reorder = _Reorder()
        self.lost: str | None = None
        """Why the wrapped server can serve no more calls (it went away), once it has."""

    # -- tools/list --------------------------------------------------------------------------

    async def list_tools(self, cursor: str | None = None) -> types.ListToolsResult:
        """One page of the wrapped server's tools, each non-read-only one offering the optional
        ``idempotency_key`` argument."""
        page = await self.upstream.list_tools(cursor=cursor)
        for tool in page.tools:
            self._tools[tool.name] = tool
        return page.model_copy(update={"tools": [self._offered(t) for t in page.tools]})

    def _offered(self, tool: types.Tool) -> types.Tool:
        schema = dict(tool.input_schema)
        properties = schema.get("properties")
        if _read_only(tool) or (
            isinstance(properties, dict) and KEY_ARGUMENT in properties
        ):  # read-only, or the tool has such an argument of its own
            return tool
        schema["properties"] = {**(properties or {}), KEY_ARGUMENT: _KEY_SCHEMA}
        return tool.model_copy(update={"input_schema": schema})

    async def _tool(self, name: str) -> types.Tool | None:
        if name not in self._tools:  # listed since, or never listed by this client: look
            cursor: str | None = None
            for _ in range(100):  # a paginator that never ends cannot hang a call
                page = await self.upstream.list_tools(cursor=cursor)
                self._tools.update((t.name, t) for t in page.tools)
                cursor = page.next_cursor
                if cursor is None or name in self._tools:
                    break
        return self._tools.get(name)

    # -- tools/call --------------------------------------------------------------------------

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> types.CallToolResult:
        """Handle one ``tools/call`` with the faults the seed draws for it.

        Raises:
            MCPError: the wrapped server's JSON-RPC error, passed on; or an injected
                ``ack_lost`` or expired ``drop_response``.
        """
        from mcp.shared.exceptions import MCPError
        from mcp_types import INTERNAL_ERROR

        self._calls += 1
        struck = self.faults.draw(self._calls) if self.faults else frozenset()
        if struck:
            logger.info("call %d of %s: injecting %s", self._calls, name, ", ".join(sorted(struck)))
        if "delay" in struck:
            await asyncio.sleep(self.faults.delay)
        if "duplicate" in struck:
            first, _ = await asyncio.gather(
                self.handle(name, arguments, meta),
                self.handle(name, arguments, meta),
                return_exceptions=True,
            )
            if isinstance(first, BaseException):
                raise first
            result = first
        else:
            result = await self.handle(name, arguments, meta)
        if "drop_response" in struck:
            await asyncio.sleep(self.faults.drop_for)
            raise MCPError(INTERNAL_ERROR, "the response was dropped (injected drop_response)")
        if "ack_lost" in struck:
            raise MCPError(
                INTERNAL_ERROR,
                "the reply to this call was lost (injected ack_lost): it may have been applied;"
                " retry with the same idempotency_key",
            )
        if "reorder" in struck:
            await self._reorder.hold(self.faults.reorder_for)
        else:
            self._reorder.sent()
        return result

    async def handle(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> types.CallToolResult:
        """Handle one ``tools/call``: pass a read-only tool through, run any other as an
        idempotent action; a refusal is a tool error with a JSON body.

        Raises:
            MCPError: the wrapped server's JSON-RPC error, passed on.
        """
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        try:
            return await self._handle(name, dict(arguments or {}), meta or {})
        except AgentLeaseError as exc:
            return refusal(exc)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED or self.lost is None:
                raise
            return _gone(self.lost)

    async def _handle(
        self, name: str, args: dict[str, Any], meta: Mapping[str, Any]
    ) -> types.CallToolResult:
        if self.lost is not None:  # nothing can act: refuse before reserving a key
            return _gone(self.lost)
        tool = await self._tool(name)
        declared = tool is not None and KEY_ARGUMENT in (tool.input_schema.get("properties") or {})
        key = args.get(KEY_ARGUMENT) if declared else args.pop(KEY_ARGUMENT, None)
        if tool is not None and _read_only(tool):
            return await self._forward(name, args, idempotent=False)
        for field_name in META_KEYS:
            if key is None:
                key = meta.get(field_name)
        if key is not None and not isinstance(key, str):
            raise InvalidInput(f"{KEY_ARGUMENT} must be a string, not {type(key).__name__}")

        async def forward() -> dict[str, Any]:
            result = await self._forward(name, args, idempotent=True)
            return result.model_dump(mode="json", by_alias=True, exclude_none=True)

        try:
            if key is not None:
                key = f"{self.settings.namespace}:{key}"
                outcome = await self.keys.call(forward, tool=name, args=args, key=key)
            else:
                outcome = await self.keys.call(
                    forward,
                    tool=name,
                    args=args,
                    task_id=f"mcp-proxy:{self.session}",
                    step=self._window.step(name, args),
                )
        except _Released as released:
            if released.result is None:
                raise released.error or InvalidInput("released with no outcome") from None
            return released.result
        import mcp_types as types

        result = types.CallToolResult.model_validate(outcome.value)
        if outcome.replayed:
            meta_out = {**(result.meta or {}), "agentlease/replayed": True}
            result = result.model_copy(update={"meta": meta_out})
        return result

    async def _forward(
        self, name: str, args: dict[str, Any], *, idempotent: bool
    ) -> types.CallToolResult:
        """Call the wrapped tool (through its breaker, if any). Inside an idempotent action an
        outcome known not to be stored raises :class:`_Released`."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        breaker = self._breaker(name)
        if breaker is not None:
            try:
                await breaker.before()
            except AgentLeaseError as exc:
                if idempotent:
                    raise _Released(refusal(exc), None) from exc
                raise
        try:
            result = await self.upstream.call_tool(
                name, args, read_timeout_seconds=self.settings.call_timeout
            )
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED and self.lost is None:
                self.lost = (
                    f"the wrapped server went away during a call of {name!r}: that call's outcome"
                    " is unknown (its key stays in flight until its lease runs out) and no"
                    " further call can be served; restart the proxy"
                )
                logger.error("%s", self.lost)
            if breaker is not None:
                await breaker.failure(exc)
            if exc.code in (REQUEST_TIMEOUT, CONNECTION_CLOSED) or not idempotent:
                raise  # ambiguous: it may have acted; the key stays in flight
            raise _Released(None, exc) from exc
        except Exception as exc:
            if breaker is not None:
                await breaker.failure(exc)
            raise
        if breaker is not None:
            await (breaker.failure() if result.is_error else breaker.success())
        if idempotent and result.is_error and self.settings.release_errors:
            raise _Released(result, None)
        return result

    def _breaker(self, tool: str) -> AsyncCircuitBreaker | None:
        if not self.settings.breaker_failures or self.state is None:
            return None
        breaker = self._breakers.get(tool)
        if breaker is None:
            name = f"{self.settings.namespace}:{tool}"
            try:
                from agentlease._guards import record_key

                record_key(name)
            except InvalidInput:  # a tool name outside the store's name rules
                name = f"{self.settings.namespace}:{uuid.uuid5(uuid.NAMESPACE_URL, tool).hex}"
            reset = self.settings.breaker_reset
            breaker = AsyncCircuitBreaker(
                self.state,
                name,
                threshold=self.settings.breaker_failures,
                cooldown=reset,
                staleness=min(1.0, reset / 2),
                tool=tool,
            )
            self._breakers[tool] = breaker
        return breaker


def _gone(why: str) -> types.CallToolResult:
    """The tool error of a call that the wrapped server, gone, cannot answer."""
    import mcp_types as types

    text = _text({"error": "ServerExited", "message": why})
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def _read_only(tool: types.Tool) -> bool:
    return bool(tool.annotations is not None and tool.annotations.read_only_hint)


async def run(
    command: Sequence[str],
    url: str,
    *,
    settings: ProxySettings | None = None,
    faults: FaultPlan | None = None,
    cwd: str | None = None,
    ready: Callable[[ToolProxy], Awaitable[None]] | None = None,
) -> None:
    """Launch ``command`` (an MCP server over stdio) and serve it, proxied, over this
    process's stdin and stdout until the client goes away.

    Args:
        command: the wrapped server's command line.
        url: the agentlease store that keeps keys (and breakers).
        settings: see :class:`ProxySettings`.
        faults: faults to inject between the client and the proxy.
        cwd: the wrapped server's working directory (default: this one).
        ready: awaited with the proxy once the wrapped server is connected.
    """
    from mcp import Client, StdioServerParameters, stdio_client
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    if not command:
        raise InvalidInput("give the wrapped server's command after --")
    settings = settings or ProxySettings()
    params = StdioServerParameters(
        command=command[0], args=list(command[1:]), env=dict(os.environ), cwd=cwd
    )
    keys = AsyncIdempotency.connect(url, settings=settings.idempotency)
    state = AsyncSharedState.connect(url) if settings.breaker_failures else None
    try:
        # A transport, not the parameters, for mcp 2.0 (whose Client takes no parameters).
        async with Client(stdio_client(params), cache=None) as upstream:
            proxy = ToolProxy(upstream, keys, settings=settings, state=state, faults=faults)
            if ready is not None:
                await ready(proxy)

            async def on_list_tools(
                ctx: Any, params: types.PaginatedRequestParams | None
            ) -> types.ListToolsResult:
                return await proxy.list_tools(None if params is None else params.cursor)

            async def on_call_tool(
                ctx: Any, params: types.CallToolRequestParams
            ) -> types.CallToolResult:
                return await proxy.call_tool(params.name, params.arguments, params.meta)

            info = upstream.server_info
            server: Server[Any] = Server(
                f"{info.name if info else 'mcp'} (agentlease proxy)",
                version=info.version if info else "",
                instructions=upstream.instructions,
                on_list_tools=on_list_tools,
                on_call_tool=on_call_tool,
            )
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
    finally:
        await keys.close()
        if state is not None:
            await state.close()
