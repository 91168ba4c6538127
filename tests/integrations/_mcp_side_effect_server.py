"""A tiny MCP server for the proxy's tests, run as ``python -m tests.integrations.
_mcp_side_effect_server FILE``: ``record`` appends a line to FILE per call (the side effect
whose count the tests check), ``refuse`` always answers with a tool error, ``count`` reads FILE
and is annotated read-only, ``pid`` answers with this server's process id, ``crash`` appends a
line and then kills this server (a wrapped server dying mid-call), and ``gated`` appends a line
once the file FILE.gate exists, creating FILE.waiting meanwhile (a call held mid-way)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

PATH = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("side-effects.txt")
server = MCPServer("side-effects", instructions="Appends a line to a file per recorded call.")
reads = [0]  # read-only calls served


@server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=False))
def record(text: str, copies: int = 1) -> str:
    """Append ``text`` to the file (once per call): the side effect."""
    with PATH.open("a", encoding="utf-8") as f:
        f.write(f"{text} x{copies}\n")
    lines = PATH.read_text(encoding="utf-8").splitlines()
    return f"recorded {text!r} as line {len(lines)}"


@server.tool()
def refuse(reason: str) -> str:
    """Always fails: a tool error."""
    raise ToolError(f"refused: {reason}")


@server.tool(annotations=ToolAnnotations(read_only_hint=True, title="Count lines"))
def count() -> str:
    """How many lines the file has, and how many reads this server has served."""
    reads[0] += 1
    lines = PATH.read_text(encoding="utf-8").splitlines() if PATH.exists() else []
    return f"{len(lines)} lines; read {reads[0]}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool()
def crash(text: str) -> str:
    """Append ``text`` to the file, then die before answering."""
    with PATH.open("a", encoding="utf-8") as f:
        f.write(f"{text} crash\n")
    os._exit(3)


@server.tool()
async def gated(text: str) -> str:
    """Wait (at most 60 s) until FILE.gate exists, then append ``text`` to the file."""
    import anyio

    gate = PATH.with_suffix(".gate")
    PATH.with_suffix(".waiting").touch()
    with anyio.fail_after(60):
        while not gate.exists():
            await anyio.sleep(0.02)
    with PATH.open("a", encoding="utf-8") as f:
        f.write(f"{text} gated\n")
    return f"gated {text!r} as line {len(PATH.read_text(encoding='utf-8').splitlines())}"


if __name__ == "__main__":
    server.run()
