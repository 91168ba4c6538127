"""The rules of a guarded record write: the refusal it meets, the record it leaves. Pure, no I/O.

Memory and SQLite decide with them inside their atomic step; PostgreSQL decides in its statement
and raises the refusal it reports with :func:`check_write`, so every backend raises the same;
Redis applies the same rules in its script. The contract suite holds every store to them.
"""

from __future__ import annotations

import orjson

from agentlease._records import RecordWrite, StateRecord
from agentlease.errors import ConflictError, FencedOff, TransitionRefused

__all__ = ["applied", "check_write"]


def _decoded(data: bytes | None) -> object:
    return None if data is None else orjson.loads(data)


def check_write(key: str, current: StateRecord | None, write: RecordWrite) -> None:
    """Raise the refusal a guarded write meets against the stored record, if any."""
    version = 0 if current is None else current.version
    fence = 0 if current is None else current.fence
    fields = {} if current is None else current.fields
    if write.fence is not None and write.fence < fence:
        raise FencedOff(key, write.fence, fence)
    if write.expected_version is not None and write.expected_version != version:
        value = None if current is None else current.value
        raise ConflictError(key, write.expected_version, version, value)
    if write.guard_field is not None:
        now_state = fields.get(write.guard_field)
        if now_state not in write.allowed_from:
            raise TransitionRefused(
                key,
                write.guard_field,
                _decoded(now_state),
                _decoded(write.fields.get(write.guard_field)),
            )


def applied(key: str, current: StateRecord | None, write: RecordWrite, now: float) -> StateRecord:
    """The record after a write that passed :func:`check_write`."""
    fields = {} if current is None or write.replace else dict(current.fields)
    fields.update(write.fields)
    fence = max(0 if current is None else current.fence, write.fence or 0)
    version = (0 if current is None else current.version) + 1
    return StateRecord(key, version, fields, fence, now)
