"""The ``scheduler`` command: fire the ticks of the schedules named ``FILE.py:NAME`` or
``MODULE:NAME`` until SIGTERM or SIGINT."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path

import click

from agentlease._schedule import Schedule
from agentlease._sync.queue import Queue
from agentlease._sync.scheduler import Scheduler
from agentlease.cli._app import backend_option, cli, reports_errors
from agentlease.cli.work import _connect_patiently, _logging
from agentlease.errors import InvalidSchedule, WorkerError

__all__ = ["load_schedules"]

log = logging.getLogger("agentlease.cli")


def _module(source: str, spec: str) -> object:
    """The module ``source`` names: a ``.py`` file's path, or a dotted module name (the current
    directory is importable)."""
    try:
        if source.endswith(".py"):
            path = Path(source).resolve()
            loader = importlib.util.spec_from_file_location(path.stem, path)
            if loader is None or loader.loader is None or not path.is_file():
                raise WorkerError(f"no such file {source!r} (schedules {spec!r})")
            module = importlib.util.module_from_spec(loader)
            sys.modules[path.stem] = module
            loader.loader.exec_module(module)
            return module
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        return importlib.import_module(source)
    except WorkerError:
        raise
    except Exception as exc:  # any failure while importing user code is the user's to see
        raise WorkerError(
            f"cannot import {source!r} for schedules {spec!r}: {type(exc).__name__}: {exc}"
        ) from exc


def load_schedules(spec: str) -> list[Schedule]:
    """The schedules named ``path/to/file.py:NAME`` or ``module.sub:NAME``: a Schedule, or a
    list (any iterable) of them.

    Raises:
        WorkerError: the spec is malformed, or the file or module cannot be imported, or has
            no such name.
        InvalidSchedule: the name holds something other than schedules (or a schedule it
            builds is refused: any error of :class:`~agentlease.Schedule` is raised as it is).
    """
    source, sep, attribute = spec.rpartition(":")
    if not sep or not source or not attribute:
        raise WorkerError(
            f"schedules must be FILE.py:NAME or MODULE:NAME (e.g. jobs.py:SCHEDULES), not {spec!r}"
        )
    target = _module(source, spec)
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise WorkerError(f"{source!r} has no {attribute!r} (schedules {spec!r})") from exc
    if isinstance(target, Schedule):
        return [target]
    if isinstance(target, str | bytes) or not isinstance(target, Iterable):
        raise InvalidSchedule(f"{spec!r} is a {type(target).__name__}, not a list of Schedule")
    items = list(target)
    for item in items:
        if not isinstance(item, Schedule):
            raise InvalidSchedule(f"{spec!r} holds a {type(item).__name__}, not a Schedule")
    if not items:
        raise InvalidSchedule(f"{spec!r} holds no schedule")
    return items


@cli.command()
@click.argument("schedules_spec", metavar="FILE.py:NAME")
@backend_option
@click.option(
    "--max-sleep",
    type=float,
    default=1.0,
    show_default=True,
    help="The longest sleep between passes (seconds).",
)
@click.option(
    "--verbose", "-v", is_flag=True, help="Also log the ticks another scheduler fired first."
)
@reports_errors
def scheduler(schedules_spec: str, url: str, max_sleep: float, verbose: bool) -> None:
    """Fire the ticks of the schedules FILE.py:NAME (or MODULE:NAME: a Schedule or a list of
    them) until SIGTERM or SIGINT.

    Run as many schedulers as you like against one store: each tick becomes one task however
    many of them fire it. An unreachable store is logged and retried (the due ticks fire once
    it is back, within each schedule's grace); a store that refuses the scheduler for good
    ends it with status 2.
    """
    schedules = load_schedules(schedules_spec)
    with _logging(verbose):
        backend = _connect_patiently(url, give_up_after=None)
    queue = Queue(backend)
    try:
        runner = Scheduler(queue, schedules, max_sleep=max_sleep)
        with _logging(verbose):
            runner.run()
    finally:
        queue.close()
