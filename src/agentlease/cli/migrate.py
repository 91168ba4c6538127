"""The ``migrate`` command: create or upgrade a store's schema.

On PostgreSQL it applies the pending versioned migrations (``backends/sql/postgres_migrations``)
in one transaction under an advisory lock, so running it from many machines at once is safe and
applies each version once; ``--check`` only reports. Backends also migrate on first use unless
their URL says ``migrate=false``; this command is for deployments that want the schema in place
(and the permissions to create it) before any worker starts. SQLite and memory stores need no
separate step: they create their schema when opened.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import click
from rich.markup import escape

from agentlease._redact import redact_url
from agentlease.backends import connect
from agentlease.cli._app import backend_option, cli, console, reports_errors
from agentlease.cli.admin import print_json

__all__ = ["migrate"]


@cli.command()
@click.option(
    "--check",
    is_flag=True,
    help="Change nothing: list pending migrations and exit 1 if there are any.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON: the store, and the migrations pending (--check) or applied.",
)
@backend_option
@reports_errors
def migrate(check: bool, as_json: bool, url: str) -> None:
    """Create or upgrade the store's schema (PostgreSQL: versioned, idempotent, safe to run
    from many processes at once)."""
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError:
        scheme = ""
    if scheme not in ("postgresql", "postgres"):
        connect(url).close()  # validates the URL; SQLite creates its schema on open
        if as_json:
            print_json({"store": redact_url(url), "pending" if check else "applied": []})
            return
        console.print(f"{scheme or 'this'} stores create their schema when opened: nothing to do")
        return

    from agentlease.backends._postgres_url import parse
    from agentlease.backends._sync.postgres_schema import migrate as apply_migrations
    from agentlease.backends._sync.postgres_schema import pending

    settings = parse(url)
    where = f"schema [bold]{escape(settings.schema)}[/] of {escape(settings.display)}"
    if check:
        missing = pending(settings)
        if as_json:
            names = [f"{m.version:04d}_{m.name}" for m in missing]
            print_json({"store": settings.display, "schema": settings.schema, "pending": names})
            if missing:
                raise click.exceptions.Exit(1)
            return
        if missing:
            for m in missing:
                console.print(f"pending: {m.version:04d}_{m.name}")
            raise click.exceptions.Exit(1)
        console.print(f"{where} is up to date")
        return
    applied = apply_migrations(settings, apply=True)
    if as_json:
        names = [f"{m.version:04d}_{m.name}" for m in applied]
        print_json({"store": settings.display, "schema": settings.schema, "applied": names})
        return
    for m in applied:
        console.print(f"applied {m.version:04d}_{m.name}")
    if not applied:
        console.print(f"{where} is up to date")
