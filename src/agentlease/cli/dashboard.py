"""The ``dashboard`` command: serve the web dashboard (:mod:`agentlease.dashboard`) with uvicorn.

Starlette, Jinja2 and uvicorn come with the ``dashboard`` extra and are imported only when the
command runs; without them the command says which extra to install.
"""

from __future__ import annotations

import ipaddress
import os

import click

from agentlease._redact import redact_url
from agentlease.cli._app import backend_option, cli, fail, reports_errors
from agentlease.errors import BackendUnavailable

__all__ = ["dashboard"]

EXTRA_ADVICE = "the dashboard needs its extra: pip install 'agentlease[dashboard]'"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@cli.command()
@backend_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8787, show_default=True)
@click.option(
    "--token",
    default=lambda: os.environ.get("AGENTLEASE_DASHBOARD_TOKEN") or None,
    show_default="$AGENTLEASE_DASHBOARD_TOKEN",
    help="Allow writes (requeueing dead letters, cancelling tasks) to those who give this token; "
    "without it the dashboard is read-only.",
)
@click.option(
    "--refresh",
    type=click.IntRange(0, 3600),
    default=5,
    show_default=True,
    help="Seconds between reloads of the list pages (0: never).",
)
@click.option(
    "--metrics-interval",
    type=click.FloatRange(0, 3600),
    default=5.0,
    show_default=True,
    help="Seconds /metrics keeps its read of the store, however often it is scraped.",
)
@reports_errors
def dashboard(
    url: str, host: str, port: int, token: str | None, refresh: int, metrics_interval: float
) -> None:
    """Serve a web dashboard of the store: queues with counts and rates, live leases, dead
    letters (requeue with --token), tasks by state (cancel with --token), workers and hot
    partitions.

    /metrics gives each queue's tasks by state, leases, dead letters and live workers in the
    Prometheus text format; like the pages it is read-only and needs no token."""
    try:
        import uvicorn

        from agentlease.dashboard import create_app
    except ImportError:
        fail(EXTRA_ADVICE)
    from agentlease.cli.admin import _missing_sqlite_file

    missing = _missing_sqlite_file(url)
    if missing is not None:  # a mistyped path: say so now (a store that is down is shown later)
        raise BackendUnavailable(f"no SQLite database at {missing!r} (from {redact_url(url)!r})")
    local = _loopback(host)
    allowed = [*LOOPBACK_NAMES, host] if local else None
    app = create_app(
        url,
        token=token,
        refresh=refresh,
        allowed_hosts=allowed,
        metrics_interval=metrics_interval,
    )
    mode = "writes need the token" if token else "read-only (no --token)"
    click.echo(f"agentlease dashboard on http://{host}:{port}/ ({mode})", err=True)
    if not local:
        click.secho(
            f"warning: listening on {host}, not on loopback: anyone who reaches it reads "
            "every payload and error of the store",
            fg="yellow",
            err=True,
        )
    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False)
