"""The ``rights`` command: the least rights agentlease needs on a Redis or PostgreSQL store.

It prints, for the URL's prefix (Redis) or schema and database (PostgreSQL), the ACL rule or the
GRANT statements of :mod:`agentlease._rights`; it connects to nothing.
"""

from __future__ import annotations

import os

import click

from agentlease._rights import rights as least_rights
from agentlease.cli._app import cli, fail, reports_errors

__all__ = ["rights"]


@cli.command()
@click.argument("url", required=False)
@click.option(
    "--role",
    default=None,
    help="The Redis ACL user, or the PostgreSQL worker role (default: the URL's user, else "
    "agentlease_worker).",
)
@click.option(
    "--owner",
    default=None,
    help="The PostgreSQL role that migrates and owns the schema (default: agentlease_owner).",
)
@reports_errors
def rights(url: str | None, role: str | None, owner: str | None) -> None:
    """Print the least rights agentlease needs on the store of URL (default $AGENTLEASE_URL):
    a Redis ACL rule, or PostgreSQL GRANT statements. Connects to nothing."""
    url = url or os.environ.get("AGENTLEASE_URL")
    if not url:
        fail("give a redis:// or postgresql:// URL (or set $AGENTLEASE_URL)")
    if owner is not None and not url.lower().startswith("postgres"):
        fail("--owner is for PostgreSQL URLs (Redis has one ACL user)")
    click.echo(least_rights(url, role=role, owner=owner).text())
