"""The command line: ``agentlease demo | worker | enqueue | stats | inspect | show | dead | keys |
bench | migrate | rights | explore | replay | check``.

Each command lives in its own module and registers itself on :data:`cli`; the group imports a
command's module only when that command runs (see :mod:`agentlease.cli._app`).
"""

from __future__ import annotations

from agentlease.cli._app import cli

__all__ = ["cli", "main"]


def main() -> None:
    """Run the command line."""
    cli()
