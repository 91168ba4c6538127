"""A refusal as data: the JSON body that integrations hand to an agent instead of a stack trace.

An MCP tool error, a tool result for a model, a proxy's reply: each carries
:func:`error_body` of the exception, ``{"error": "LeaseLost", "message": ..., "task_id": ...,
"attempt": 3, "current_attempt": 4, ...}``: the class name, the message and the exception's own
public fields (those of every class in :mod:`agentlease.errors`), plain JSON. A refusal that
already has a payload for a planner (:class:`~agentlease.ToolUnavailable`) gives that payload.
Anything that is not an agentlease error is reported by its type and message only: its fields
are not part of any contract and may hold what an agent should not see.
"""

from __future__ import annotations

import math
from typing import Any

from agentlease.errors import AgentLeaseError, ToolUnavailable

__all__ = ["error_body"]

JSONValue = Any


def error_body(exc: BaseException) -> dict[str, JSONValue]:
    """``exc`` as a JSON-serialisable dict: ``error`` (the class name), ``message``, and, for an
    agentlease error, its public fields (values that are not plain JSON become their text)."""
    if isinstance(exc, ToolUnavailable):
        return dict(exc.payload())
    body: dict[str, JSONValue] = {"error": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, AgentLeaseError):
        for name, value in vars(exc).items():
            if not name.startswith("_") and name not in body:
                body[name] = _plain(value)
    return body


def _plain(value: object, depth: int = 0) -> JSONValue:
    """``value`` as plain JSON (bounded depth; what is not JSON becomes its text)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth < 4 and isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [_plain(v, depth + 1) for v in items]
    if depth < 4 and isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    return str(value)
