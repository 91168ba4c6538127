"""``agentlease mcp proxy``: serve another MCP server's tools with idempotent calls
(:mod:`agentlease.mcp.proxy`).

The MCP SDK comes with the ``mcp`` extra and is imported only when the command runs; without
it the command says which extra to install. Everything the proxy says goes to stderr: stdout
is the MCP transport.
"""

from __future__ import annotations

import asyncio
import signal

import click

from agentlease.cli._app import backend_option, fail, reports_errors
from agentlease.cli.mcp import mcp

__all__ = ["proxy"]

EXTRA_ADVICE = "the MCP proxy needs its extra: pip install 'agentlease[mcp]'"


@mcp.command("proxy", context_settings={"ignore_unknown_options": True})
@backend_option
@click.option(
    "--window",
    type=click.FloatRange(0, 86_400, min_open=True),
    default=60.0,
    show_default=True,
    help="Seconds within which a call without a key, with the same tool and arguments as an "
    "earlier one of the session, is that call again (intentional repeats inside it merge: "
    "give them their own idempotency_key).",
)
@click.option(
    "--namespace",
    default="mcp",
    show_default=True,
    help="Prefix of explicit keys and breaker names in the store.",
)
@click.option(
    "--call-timeout",
    type=click.FloatRange(0, 86_400, min_open=True),
    default=60.0,
    show_default=True,
    help="Seconds a forwarded call may take (past it the outcome is unknown and the key stays "
    "in flight until its lease runs out).",
)
@click.option(
    "--hold-for",
    type=click.FloatRange(0, 86_400, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds of a call's in-flight lease, renewed while the call runs: a proxy that stops "
    "(crashed, paused) loses its calls' keys this long after its last renewal, and a retry "
    "may then act.",
)
@click.option(
    "--release-errors",
    is_flag=True,
    help="A tool error releases the key (a retry runs the tool again) instead of being stored "
    "and replayed.",
)
@click.option(
    "--breaker-failures",
    type=click.IntRange(0, 1_000_000),
    default=0,
    show_default=True,
    help="Consecutive failures that open a tool's circuit breaker (0: no breakers).",
)
@click.option(
    "--breaker-reset",
    type=click.FloatRange(0, 86_400, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds an open circuit refuses calls before it lets one trial through.",
)
@click.option(
    "--fault",
    "faults",
    multiple=True,
    metavar="KIND[:PROB[:TIMES]]",
    help="Inject a fault (delay, duplicate, drop_response, ack_lost, reorder) into calls, "
    "with a probability (default 1) and at most TIMES times; repeatable.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Decides which calls faults strike."
)
@click.option(
    "--delay",
    type=click.FloatRange(0, 86_400),
    default=1.0,
    show_default=True,
    help="Seconds a delay fault waits.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@reports_errors
def proxy(
    url: str,
    window: float,
    namespace: str,
    call_timeout: float,
    hold_for: float,
    release_errors: bool,
    breaker_failures: int,
    breaker_reset: float,
    faults: tuple[str, ...],
    seed: int,
    delay: float,
    command: tuple[str, ...],
) -> None:
    """Serve the tools of the MCP server that COMMAND starts (over stdio), with every call that
    is not read-only made idempotent in the store:

    \b
        agentlease mcp proxy --backend sqlite:///keys.db -- npx -y some-mcp-server

    A call's key is its idempotency_key argument, else _meta["agentlease/idempotency_key"],
    else the session, the tool and the arguments within --window. A retry returns the first
    call's result; refusals are tool errors with a JSON body."""
    try:
        import mcp  # noqa: F401
        import mcp_types  # noqa: F401

        from agentlease._settings import IdempotencySettings
        from agentlease.mcp.proxy import Fault, FaultPlan, ProxySettings, run
    except ImportError:
        fail(EXTRA_ADVICE)
    settings = ProxySettings(
        window=window,
        namespace=namespace,
        call_timeout=call_timeout,
        release_errors=release_errors,
        breaker_failures=breaker_failures,
        breaker_reset=breaker_reset,
        idempotency=IdempotencySettings(hold_for=hold_for),
    )
    plan = FaultPlan(faults=[Fault.parse(f) for f in faults], seed=seed, delay=delay)
    # SIGINT ends the proxy at once, as SIGTERM and SIGKILL do: a graceful stop would wait for
    # the thread that reads stdin, that is, for the client. Its wrapped server then sees its
    # stdin close and exits; a call under way is ambiguous, its key left in flight.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    asyncio.run(run(list(command), url, settings=settings, faults=plan))
