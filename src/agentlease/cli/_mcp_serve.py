"""``agentlease mcp serve``: serve the store's queues and shared state to MCP agents
(:mod:`agentlease.mcp.server`), on stdio or streamable HTTP.

The MCP SDK comes with the ``mcp`` extra and is imported only when the command runs; without it
the command says which extra to install.
"""

from __future__ import annotations

import os

import click

from agentlease.cli._app import backend_option, fail, reports_errors
from agentlease.cli.dashboard import _loopback
from agentlease.cli.mcp import mcp

__all__ = ["serve"]

EXTRA_ADVICE = "the MCP server needs its extra: pip install 'agentlease[mcp]'"


@mcp.command("serve")
@backend_option
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio: one session on standard input and output; http: streamable HTTP at /mcp.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (http).")
@click.option("--port", type=click.IntRange(0, 65535), default=8788, show_default=True)
@click.option(
    "--token",
    default=lambda: os.environ.get("AGENTLEASE_MCP_TOKEN") or None,
    show_default="$AGENTLEASE_MCP_TOKEN",
    help="The bearer token every HTTP request must carry (required for --transport http).",
)
@click.option(
    "--no-token",
    is_flag=True,
    help="Serve HTTP without a token: only on a loopback host, for local experiments.",
)
@click.option(
    "--lease-for",
    type=click.FloatRange(1, 3600),
    default=30.0,
    show_default=True,
    help="Seconds a claimed task's lease lasts between the server's renewals.",
)
@click.option(
    "--lease-cap",
    type=click.FloatRange(1, 86_400),
    default=300.0,
    show_default=True,
    help="The longest a session holds a task or an idempotency reservation, renewals "
    "included (and how long an idle HTTP session lives).",
)
@click.option(
    "--lock-cap",
    type=click.FloatRange(0.1, 600),
    default=30.0,
    show_default=True,
    help="The longest a session holds a lock set: short, since a lock held across an agent's "
    "model turns stalls every other agent.",
)
@reports_errors
def serve(
    url: str,
    transport: str,
    host: str,
    port: int,
    token: str | None,
    no_token: bool,
    lease_for: float,
    lease_cap: float,
    lock_cap: float,
) -> None:
    """Serve the store's queues and shared state to MCP agents: claim, complete, fail and
    release tasks, idempotent side effects, lock sets, versioned records and counters.

    Leases, locks and reservations taken through the tools belong to the MCP session: the
    server renews them while it lives, within --lease-cap and --lock-cap, and gives them back
    when it ends."""
    if transport == "http":
        if token is None and not no_token:
            fail(
                "--transport http needs a bearer token: --token T or $AGENTLEASE_MCP_TOKEN "
                "(--no-token serves without one, on a loopback host only)"
            )
        if token is None and not _loopback(host):
            fail(f"--no-token is refused on {host}: without a token, listen on loopback only")
    if lease_cap < lease_for:
        fail(f"--lease-cap ({lease_cap}) must be at least --lease-for ({lease_for})")
    try:
        import anyio

        from agentlease.mcp.server import SHUTDOWN_GRACE, build_server, http_app, serve_stdio
    except ImportError:
        fail(EXTRA_ADVICE)
    server = build_server(url, lease_for=lease_for, lease_cap=lease_cap, lock_cap=lock_cap)
    if transport == "stdio":
        anyio.run(serve_stdio, server)
        return
    import uvicorn

    app = http_app(server, token=token, host=host, idle_timeout=lease_cap)
    mode = "bearer token required" if token else "NO TOKEN (loopback only)"
    click.echo(f"agentlease MCP server on http://{host}:{port}/mcp ({mode})", err=True)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        server_header=False,
        timeout_graceful_shutdown=round(SHUTDOWN_GRACE),  # SIGTERM: bounded, then sessions end
    )
