"""The handler of the bench's worker row: ``agentlease.bench.noop_handler:noop`` does nothing,
so the row measures what ``agentlease worker`` itself costs per task."""

from __future__ import annotations

from agentlease._context import JobContext

__all__ = ["noop"]


def noop(job: JobContext) -> None:
    """Return at once (the task's result is ``null``)."""
    return None
