"""The ``mcp`` command group: ``agentlease mcp serve`` (:mod:`agentlease.mcp.server`) and
``agentlease mcp proxy`` (:mod:`agentlease.mcp.proxy`).

Each subcommand lives in a module of its own, imported only when it runs (or help lists it); the
MCP SDK comes with the ``mcp`` extra and is imported only then: without it the subcommand says
which extra to install.
"""

from __future__ import annotations

import importlib

import click

from agentlease.cli._app import cli

__all__ = ["SUBCOMMANDS", "mcp"]

# Each subcommand, and the module that defines it (registering it on this group).
SUBCOMMANDS = {"serve": "agentlease.cli._mcp_serve", "proxy": "agentlease.cli._mcp_proxy"}


class _LazyMCPGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*SUBCOMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = SUBCOMMANDS.get(cmd_name)
        if module is not None and cmd_name not in self.commands:
            importlib.import_module(module)
        return super().get_command(ctx, cmd_name)


@cli.group(cls=_LazyMCPGroup)
def mcp() -> None:
    """Serve queues and shared state to MCP agents, or make another MCP server's tool calls
    idempotent (needs the mcp extra: pip install 'agentlease[mcp]')."""
