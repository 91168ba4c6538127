"""The handler the TLS tests' worker processes run (``tests.security._tls_jobs:double``)."""

from __future__ import annotations

from agentlease import JSON, JobContext


def double(ctx: JobContext) -> JSON:
    """Twice the task's number."""
    value = ctx.payload
    assert isinstance(value, int)
    return value * 2
