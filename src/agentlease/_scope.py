"""Who is acting: the task and step an idempotent action belongs to, and the running action's key.

Context variables, so they follow the code that runs for a task: a worker sets the task (and its
lease's attempt) around each handler, in the handler's own context; user code names a step, or a
task outside a worker, with :func:`idempotency_scope`. Sync handlers run with a copy of the
context, so they see the same values.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, replace

from agentlease import _validate as check
from agentlease.errors import MissingIdentity

__all__ = [
    "Scope",
    "current_fence",
    "current_key",
    "current_scope",
    "enter_task",
    "idempotency_scope",
]


@dataclass(frozen=True, slots=True)
class Scope:
    """The identity around an idempotent action.

    Attributes:
        task_id: the task the action belongs to.
        attempt: the fencing number of the lease running it (recorded, never part of a key).
        step: the step of the task, when named by :func:`idempotency_scope`.
    """

    task_id: str | None = None
    attempt: int | None = None
    step: str | None = None


_SCOPE: ContextVar[Scope | None] = ContextVar("agentlease_scope", default=None)
_NO_SCOPE = Scope()
_KEY: ContextVar[tuple[str, int] | None] = ContextVar("agentlease_key", default=None)


def current_scope() -> Scope:
    """The task and step that idempotent actions run now would be keyed on."""
    return _SCOPE.get() or _NO_SCOPE


def enter_task(task_id: str, attempt: int) -> Token[Scope | None]:
    """Set the task of the current context (the worker does this around each handler)."""
    return _SCOPE.set(Scope(task_id=task_id, attempt=attempt))


@contextmanager
def idempotency_scope(*, task_id: str | None = None, step: str | None = None) -> Iterator[Scope]:
    """Name the task and/or the step of the idempotent actions run inside the block.

    Inside a worker the task is already set; name the step. Outside one, name the task too (an
    order id, a conversation id: anything stable across retries). What is not given is kept from
    the enclosing scope.

    Raises:
        InvalidName: an id is empty, too long or has odd characters.
    """
    scope = current_scope()
    if task_id is not None:
        scope = replace(scope, task_id=check.task_id(task_id), attempt=None)
    if step is not None:
        scope = replace(scope, step=check.task_id(step))
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def set_key(key: str, fence: int) -> Token[tuple[str, int] | None]:
    """Mark ``key`` (reserved with ``fence``) as the running action's (reset with the token)."""
    return _KEY.set((key, fence))


def reset_key(token: Token[tuple[str, int] | None]) -> None:
    """Undo :func:`set_key`."""
    _KEY.reset(token)


def current_key() -> str:
    """The idempotency key of the action running now: pass it downstream (for example as an
    ``Idempotency-Key`` header) so the remote side can deduplicate too.

    Raises:
        MissingIdentity: no idempotent action is running in this context.
    """
    running = _KEY.get()
    if running is None:
        raise MissingIdentity("no idempotent action is running here, so there is no key")
    return running[0]


def current_fence() -> int:
    """The fencing number of the running action's reservation: +1 at every reservation of its
    key, so a remote side that keeps the highest it has seen can refuse an older holder.

    Raises:
        MissingIdentity: no idempotent action is running in this context.
    """
    running = _KEY.get()
    if running is None:
        raise MissingIdentity("no idempotent action is running here, so there is no fence")
    return running[1]
