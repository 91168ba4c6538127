"""Handlers for the secrets test's workers: one that succeeds, one that always fails."""

from __future__ import annotations

import agentlease as al


def ok(ctx: al.JobContext) -> al.JSON:
    ctx.progress({"step": 1})
    return {"done": ctx.task_id}


def boom(ctx: al.JobContext) -> al.JSON:
    raise RuntimeError(f"handler failed on {ctx.task_id}")


def slow(ctx: al.JobContext) -> al.JSON:
    """Long enough that a rollover happens while the task is leased."""
    ctx.wait(0.8)
    return {"done": ctx.task_id, "pid": __import__("os").getpid()}
