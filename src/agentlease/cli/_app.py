"""The click group every command registers on, the options they share, and error reporting.

Commands are loaded lazily: the group knows which module defines each command and imports it
only when that command runs (or help lists them), so ``agentlease worker`` never imports the
bench (:mod:`agentlease.bench`), the demo or rich's tables. The consoles (rich) are made on
first use for the same reason. When stdout is not a terminal the output is plain text: no colour
codes, tables (made with :func:`new_table`) drawn in ASCII, lines of text not broken at the width.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar

import click

from agentlease import __version__
from agentlease.errors import AgentLeaseError, InvalidDuration

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = [
    "DEFAULT_URL",
    "ERROR_STATUS",
    "backend_option",
    "cli",
    "fail",
    "new_table",
    "parse_age",
    "plain",
    "reports_errors",
]

DEFAULT_URL = "sqlite:///agentlease.db"
ERROR_STATUS = 2
F = TypeVar("F", bound=Callable[..., object])
P = ParamSpec("P")
R = TypeVar("R")

# Each command, and the module that defines it.
COMMANDS = {
    "bench": "agentlease.bench.command",
    "cancel": "agentlease.cli.cancel",
    "check": "agentlease.cli.harness",
    "dashboard": "agentlease.cli.dashboard",
    "dead": "agentlease.cli.admin",
    "delete-queue": "agentlease.cli.cancel",
    "demo": "agentlease.cli.demo",
    "enqueue": "agentlease.cli.admin",
    "explore": "agentlease.cli.harness",
    "inspect": "agentlease.cli.admin",
    "keys": "agentlease.cli.keys",
    "mcp": "agentlease.cli.mcp",
    "migrate": "agentlease.cli.migrate",
    "purge": "agentlease.cli.purge",
    "queues": "agentlease.cli.admin",
    "replay": "agentlease.cli.harness",
    "rights": "agentlease.cli.rights",
    "scheduler": "agentlease.cli.schedule",
    "show": "agentlease.cli.show",
    "stats": "agentlease.cli.admin",
    "tasks": "agentlease.cli.tasks",
    "worker": "agentlease.cli.work",
    "workers": "agentlease.cli.admin",
}


class _LazyGroup(click.Group):
    """A group that imports a command's module only when the command is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is not None and cmd_name not in self.commands:
            importlib.import_module(module)  # registers it on this group
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup)
@click.version_option(__version__, prog_name="agentlease")
def cli() -> None:
    """Leased work queues for many agents: nothing runs twice, nothing is lost."""


@functools.cache
def _console(stderr: bool) -> Console:
    from rich.console import Console

    # No emoji codes: a name such as tool:ship:drop would print as a ship.
    console = Console(stderr=stderr, emoji=False)
    if console.is_terminal:
        return console

    class Plain(Console):
        """Piped or redirected: plain text. No colour codes (rich sends none to a file), no
        highlighting, and a line of text is not broken at the width (a path or a cursor stays
        whole); tables still fit the width ($COLUMNS, else 80), drawn in ASCII (new_table)."""

        def print(self, *objects: Any, **kwargs: Any) -> None:
            if all(isinstance(o, str) for o in objects):
                kwargs.setdefault("soft_wrap", True)
            super().print(*objects, **kwargs)

    return Plain(stderr=stderr, emoji=False, highlight=False)


def plain() -> bool:
    """Whether stdout is not a terminal (a pipe, a file): then output is plain text."""
    return not _console(False).is_terminal


_HORIZONTAL = "─━═┄┅┈┉╌╍"
_VERTICAL = "│┃║┆┇┊┋╎╏"
# Box-drawing characters in ASCII: lines are - and |, corners and crossings +.
_TO_ASCII = str.maketrans(
    {
        chr(c): "-" if chr(c) in _HORIZONTAL else "|" if chr(c) in _VERTICAL else "+"
        for c in range(0x2500, 0x2580)
    }
)


def new_table(*args: Any, **kwargs: Any) -> Table:
    """A rich ``Table(*args, **kwargs)``; when stdout is not a terminal, its box is drawn in
    ASCII (``-``, ``|``, ``+``) instead of box-drawing characters."""
    from rich.box import Box
    from rich.table import Table

    made = Table(*args, **kwargs)
    b = made.box
    if b is not None and plain():
        lines = (
            (b.top_left, b.top, b.top_divider, b.top_right),
            (b.head_left, " ", b.head_vertical, b.head_right),
            (b.head_row_left, b.head_row_horizontal, b.head_row_cross, b.head_row_right),
            (b.mid_left, " ", b.mid_vertical, b.mid_right),
            (b.row_left, b.row_horizontal, b.row_cross, b.row_right),
            (b.foot_row_left, b.foot_row_horizontal, b.foot_row_cross, b.foot_row_right),
            (b.foot_left, " ", b.foot_vertical, b.foot_right),
            (b.bottom_left, b.bottom, b.bottom_divider, b.bottom_right),
        )
        text = "".join("".join(line) + "\n" for line in lines)
        made.box = Box(text.translate(_TO_ASCII), ascii=True)
    return made


def __getattr__(name: str) -> Any:
    # ``console`` and ``err_console`` (rich consoles on stdout and stderr) are made on first use:
    # importing rich costs start-up time that a worker should not pay.
    if name == "console":
        return _console(False)
    if name == "err_console":
        return _console(True)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def backend_option(fn: F) -> F:
    """The ``--backend URL`` option (default: $AGENTLEASE_URL or sqlite:///agentlease.db)."""
    return click.option(
        "--backend",
        "url",
        default=lambda: os.environ.get("AGENTLEASE_URL", DEFAULT_URL),
        show_default="$AGENTLEASE_URL or " + DEFAULT_URL,
        help="Store URL: sqlite:///path.db, redis://host:6379/0, postgresql://user@host/db.",
    )(fn)


def fail(message: str, *, status: int = ERROR_STATUS) -> NoReturn:
    """Print ``message`` as one red line on stderr and exit with ``status``."""
    line = " ".join(message.split())  # one line, whatever the message holds
    click.secho(f"error: {line}", fg="red", err=True, color=None if sys.stderr.isatty() else False)
    raise click.exceptions.Exit(status)


def reports_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Wrap a command so that every agentlease error exits with status 2 and one red line."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except AgentLeaseError as exc:
            fail(str(exc) or type(exc).__name__)

    return wrapper


_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 7 * 86_400.0}
_AGE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*")


def parse_age(text: str) -> float:
    """Seconds from an age such as ``90``, ``90s``, ``15m``, ``12h``, ``1d`` or ``2w``."""
    match = _AGE.fullmatch(text)
    if match is None:
        raise InvalidDuration(
            f"age {text!r}: give a number and a unit: s, m, h, d or w (e.g. 1d, 12h)"
        )
    return float(match.group(1)) * _UNITS[match.group(2)]
