"""The command line: ``agentlease demo | worker | enqueue | stats | inspect | dead | keys | bench``.

Each command lives in its own module and registers itself on :data:`cli`.
"""

from __future__ import annotations

from agentlease.cli import admin, bench, demo, keys, migrate, work  # noqa: F401 - registers
from agentlease.cli._app import cli

__all__ = ["cli", "main"]


def main() -> None:
    """Run the command line."""
    cli()
