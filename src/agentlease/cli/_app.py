"""The click group every command registers on, and the options they share."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import click
from rich.console import Console

from agentlease import __version__

__all__ = ["DEFAULT_URL", "backend_option", "cli", "console", "err_console"]

DEFAULT_URL = "sqlite:///agentlease.db"
F = TypeVar("F", bound=Callable[..., object])

console = Console()
err_console = Console(stderr=True)


@click.group()
@click.version_option(__version__, prog_name="agentlease")
def cli() -> None:
    """Leased work queues for many agents: nothing runs twice, nothing is lost."""


def backend_option(fn: F) -> F:
    """The ``--backend URL`` option (default: $AGENTLEASE_URL or sqlite:///agentlease.db)."""
    return click.option(
        "--backend",
        "url",
        default=lambda: os.environ.get("AGENTLEASE_URL", DEFAULT_URL),
        show_default="$AGENTLEASE_URL or " + DEFAULT_URL,
        help="Store URL: sqlite:///path.db, redis://host:6379/0, postgresql://user@host/db.",
    )(fn)
