"""The handler of the ``agentlease worker`` processes in test_rights.py: each job records an
idempotent action and adds to a guarded counter, on the worker's own store and rights."""

from __future__ import annotations

import functools
import os

import agentlease as al

COUNTER = "rights-processed"


@functools.cache
def _stores() -> tuple[al.Idempotency, al.SharedState]:
    url = os.environ["AGENTLEASE_URL"]
    return al.Idempotency.connect(url), al.SharedState.connect(url)


def handle(ctx: al.JobContext) -> al.JSON:
    """Send a notification once (an idempotency key per task), then count the task."""
    keys, state = _stores()
    with keys.action("notify", {"n": ctx.payload}, step="notify") as act:
        if not act.replayed:
            act.result = {"sent": ctx.payload}
    state.add(COUNTER, 1)
    return {"n": ctx.payload, "sent": act.result}
