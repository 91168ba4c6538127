"""agentlease for LangGraph (the ``langgraph`` extra: ``pip install 'agentlease[langgraph]'``).

LangGraph re-runs a node from its start when a thread resumes after ``interrupt()``, when a
run that failed is invoked again, and when a retry policy retries it; and a process that dies
between a node's side effect and the checkpoint that records the node's writes runs the node
again on the next invocation. Each of those re-runs repeats the email, the charge or the
ticket. This module keys such side effects on what LangGraph itself keeps stable across them:

* the **thread** (``config["configurable"]["thread_id"]``), as the action's task id;
* the **task of the step**, as the action's step id: LangGraph derives each task's id from the
  checkpoint it starts from, the node and the task's place in the step (its ``Send`` index), so
  a node that re-runs from the same checkpoint (a resume, a retry, a re-invocation after a
  crash) has the same id, and the next pass through the same node (a loop: a later step) has a
  new one. The step id is the task's checkpoint namespace (``"node:<task id>"``, nested for
  subgraphs), read from :attr:`langgraph.runtime.Runtime.execution_info` (or the task's config
  metadata).

:func:`idempotent` decorates a function called inside a node (the email sender): its key is
(thread, step, tool, arguments), so one node may call several tools, or one tool with other
arguments, each once per step. :func:`idempotent_node` wraps a whole node whose state update
is plain JSON: a re-run returns the stored update without running the node. An ``interrupt()``
(any ``GraphBubbleUp``) that escapes a wrapped node releases its key, so a node that asks for
approval first and acts after it acts once, on the resume; a node that acts *before* it
interrupts must use :func:`idempotent` on the action instead, since its whole run is not one
action. Both build on :class:`agentlease.Idempotency` (:class:`agentlease.AsyncIdempotency` for
async functions and nodes), so replays, ``fail_on``, ``release_on``, ambiguous failures and
takeovers behave as described there.

Reducers. State fields that parallel branches (``Send`` fan-outs, parallel edges) write in one
superstep are merged by :func:`agentlease.reconcile`'s policies, as LangGraph channels used in
``Annotated`` (``Annotated[list[str], UnionReducer]``):

* :class:`UnionReducer`: list items once each, in order of first appearance (the current value
  first);
* :class:`MaxByVersionReducer`: values written as ``{"value": ..., "version": n}`` (or
  :class:`agentlease.Fact` with a version); the highest version wins, across steps too, and two
  different values at the top version raise :class:`~agentlease.errors.ReconciliationConflict`;
* :class:`MustAgreeReducer`: the writes of one superstep must agree, else
  :class:`~agentlease.errors.ReconciliationConflict` names the field and both writes; the
  agreed value replaces the previous one (a later step may change it, as with a plain field).

A write may be an :class:`agentlease.Fact` to give its source and evidence to the conflict's
message; a plain write is named by its place in the step (``write-1``, ``write-2``, ...). Values
are compared as canonical JSON, as :func:`agentlease.reconcile` does, and stored as plain JSON.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, ClassVar, ParamSpec, TypeVar, cast, overload

from agentlease import _idempotent
from agentlease._async.idempotency import AsyncIdempotency
from agentlease._codec import JSON
from agentlease._outcomes import ErrorTypes, error_types
from agentlease._reconcile import Fact, LatestByVersion, MustAgree, Policy, Union
from agentlease._sync.idempotency import Idempotency
from agentlease.errors import InvalidInput, MissingDriver, MissingIdentity

try:
    from langgraph.channels.base import BaseChannel
    from langgraph.channels.last_value import LastValue
    from langgraph.config import get_config
    from langgraph.errors import EmptyChannelError, GraphBubbleUp
    from langgraph.runtime import get_runtime
except ImportError as exc:  # the langgraph extra is not installed
    _missing = MissingDriver("langgraph", "langgraph")
    _missing.args = ("agentlease.langgraph needs LangGraph: pip install 'agentlease[langgraph]'",)
    raise _missing from exc

__all__ = [
    "AsyncIdempotentFunction",
    "IdempotentFunction",
    "MaxByVersionReducer",
    "MustAgreeReducer",
    "UnionReducer",
    "idempotent",
    "idempotent_node",
    "step_identity",
]

P = ParamSpec("P")
R = TypeVar("R")

# LangGraph's marker of a channel with no value (what an empty channel checkpoints as), taken
# from a public channel rather than from LangGraph's private modules.
_MISSING: Any = LastValue(object).checkpoint()


# -- identity ------------------------------------------------------------------------------------


def step_identity() -> tuple[str, str]:
    """The (thread id, step id) of the LangGraph task running now.

    The step id is the task's checkpoint namespace (``"node:<task id>"``): the same when the
    task re-runs from the same checkpoint (a resume after ``interrupt()``, a retry, a run
    invoked again after a crash), different for every later step. Pass them to
    :meth:`agentlease.Idempotency.action` (``task_id=``, ``step=``) for code that is not one
    function.

    Raises:
        MissingIdentity: called outside a LangGraph node, or the graph runs without a thread
            (no checkpointer, or no ``thread_id`` in the config).
    """
    try:
        config = get_config()
    except RuntimeError as exc:
        raise MissingIdentity(
            "an idempotent LangGraph action runs outside a graph's node: call it inside a node"
        ) from exc
    configurable = config.get("configurable") or {}
    info = getattr(get_runtime(), "execution_info", None)
    thread = getattr(info, "thread_id", None) or configurable.get("thread_id")
    step = getattr(info, "checkpoint_ns", None) or (config.get("metadata") or {}).get(
        "langgraph_checkpoint_ns"
    )
    if not isinstance(thread, str) or not thread:
        raise MissingIdentity(
            "an idempotent LangGraph action needs the graph's thread: compile the graph with a"
            " checkpointer and invoke it with config={'configurable': {'thread_id': ...}}"
        )
    if not isinstance(step, str) or not step:
        raise MissingIdentity("the LangGraph task running now has no checkpoint namespace")
    return thread, step


# -- functions called inside a node ---------------------------------------------------------------


class IdempotentFunction(_idempotent.IdempotentFunction[P, R]):
    """A sync function that runs at most once per (thread, step, arguments); call it as the
    function itself, inside a node."""

    def _identity(self) -> dict[str, Any]:
        thread, step = step_identity()
        return {"task_id": thread, "step": step}


class AsyncIdempotentFunction(_idempotent.AsyncIdempotentFunction[P, R]):
    """An async function that runs at most once per (thread, step, arguments); await it as the
    function itself, inside a node."""

    def _identity(self) -> dict[str, Any]:
        thread, step = step_identity()
        return {"task_id": thread, "step": step}


class _Decorator(_idempotent._Decorator):
    sync_type = IdempotentFunction
    async_type = AsyncIdempotentFunction


def idempotent(
    *,
    tool: str,
    store: Idempotency | AsyncIdempotency,
    exclude: Collection[str] = (),
    wait: float | None = None,
    fail_on: ErrorTypes = (),
    release_on: ErrorTypes = (),
) -> _Decorator:
    """Make a side-effecting function called inside a LangGraph node run once per step::

        keys = agentlease.Idempotency.connect("sqlite:///agents.db")

        @agentlease.langgraph.idempotent(tool="send_email", store=keys)
        def send_email(to: str) -> dict[str, str]:
            return mailer.send(to, idempotency_key=agentlease.current_key())

        def notify(state: State) -> dict[str, str]:
            receipt = send_email(state["to"])  # once, however often the node re-runs
            answer = interrupt("sent; anything else?")
            ...

    The key is (thread id, step id, ``tool``, the arguments): see :func:`step_identity`. The
    options are :func:`agentlease.idempotent`'s.

    Raises:
        InvalidInput: the store's face does not match the function, or a bad option.
        MissingIdentity: (at the call) outside a node, or a graph without a thread.
    """
    return _Decorator(store, tool, None, exclude, wait, fail_on, release_on)


# -- whole nodes -----------------------------------------------------------------------------------


@overload
def idempotent_node(
    fn: Callable[P, Awaitable[R]],
    *,
    store: AsyncIdempotency,
    tool: str | None = ...,
    wait: float | None = ...,
    fail_on: ErrorTypes = ...,
    release_on: ErrorTypes = ...,
) -> Callable[P, Awaitable[R]]: ...
@overload
def idempotent_node(
    fn: Callable[P, R],
    *,
    store: Idempotency,
    tool: str | None = ...,
    wait: float | None = ...,
    fail_on: ErrorTypes = ...,
    release_on: ErrorTypes = ...,
) -> Callable[P, R]: ...
def idempotent_node(
    fn: Callable[P, Any],
    *,
    store: Idempotency | AsyncIdempotency,
    tool: str | None = None,
    wait: float | None = None,
    fail_on: ErrorTypes = (),
    release_on: ErrorTypes = (),
) -> Callable[P, Any]:
    """A node that runs once per step: a re-run (resume, retry, re-invocation after a crash)
    returns the state update the first run returned, without running the node::

        graph.add_node("charge", idempotent_node(charge, store=keys))

    The node's update must be plain JSON (a dict of JSON values: no ``Command``, ``Send`` or
    message objects); one that is not is stored as a permanent failure and its ``NotJSON``
    raised, since the node did run. The node's signature is kept, so LangGraph still passes it
    ``config``, ``runtime`` and the rest. An ``interrupt()`` (any ``GraphBubbleUp``) that
    escapes the node releases the key: interrupt before acting, or use :func:`idempotent` on
    the action of a node that acts and then interrupts.

    Args:
        fn: the node (sync with an :class:`~agentlease.Idempotency`, async with an
            :class:`~agentlease.AsyncIdempotency`).
        store: where keys live.
        tool: the action's name (default: the function's qualified name).
        wait, fail_on, release_on: as for :func:`agentlease.idempotent`.

    Raises:
        InvalidInput: the store's face does not match the node, or a bad option.
    """
    name = tool or fn.__qualname__
    fail = error_types(fail_on, "fail_on")
    release = (*error_types(release_on, "release_on"), GraphBubbleUp)
    options: dict[str, Any] = {"tool": name, "wait": wait, "fail_on": fail, "release_on": release}
    if inspect.iscoroutinefunction(fn):
        if not isinstance(store, AsyncIdempotency):
            raise InvalidInput(f"async node {fn.__qualname__} needs an AsyncIdempotency store")
        astore = store

        @functools.wraps(fn)
        async def arun(*args: P.args, **kwargs: P.kwargs) -> Any:
            thread, step = step_identity()

            async def run() -> Any:
                return await fn(*args, **kwargs)

            got = await astore.call(run, args={}, task_id=thread, step=step, **options)
            return got.value

        return arun
    if not isinstance(store, Idempotency):
        raise InvalidInput(f"node {fn.__qualname__} needs an Idempotency store (sync)")
    sstore = store

    @functools.wraps(fn)
    def srun(*args: P.args, **kwargs: P.kwargs) -> Any:
        thread, step = step_identity()
        got = sstore.call(
            functools.partial(fn, *args, **kwargs), args={}, task_id=thread, step=step, **options
        )
        return got.value

    return srun


# -- reducers --------------------------------------------------------------------------------------


class _Reconciled(BaseChannel[Any, Any, Any]):
    """A state channel whose writes in one superstep are merged by a reconciliation policy."""

    __slots__ = ("value",)
    policy: ClassVar[Policy]

    def __init__(self, typ: Any, key: str = "") -> None:
        super().__init__(typ, key)
        self.value: Any = self._empty()

    def _empty(self) -> Any:
        return _MISSING

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    @property
    def ValueType(self) -> Any:
        return self.typ

    @property
    def UpdateType(self) -> Any:
        return self.typ

    def from_checkpoint(self, checkpoint: Any) -> _Reconciled:
        empty = type(self)(self.typ, self.key)
        if checkpoint is not _MISSING:
            empty.value = checkpoint
        return empty

    def get(self) -> Any:
        if self.value is _MISSING:
            raise EmptyChannelError()
        return self.value

    def is_available(self) -> bool:
        return self.value is not _MISSING

    def update(self, values: Sequence[Any]) -> bool:
        if not values:
            return False
        facts = [self._fact(v, f"write-{i}") for i, v in enumerate(values, 1)]
        self.value = self._merge(facts)
        return True

    @property
    def _field(self) -> str:
        return self.key or "state"

    def _fact(self, value: Any, source: str) -> Fact:
        if isinstance(value, Fact):
            return Fact(
                field=self._field,
                value=value.value,
                source=value.source,
                step=value.step,
                evidence=value.evidence,
                version=value.version,
            )
        return Fact(field=self._field, value=cast(JSON, value), source=source)

    def _merge(self, facts: list[Fact]) -> Any:
        return self.policy.merge(self._field, facts)


class UnionReducer(_Reconciled):
    """A list field that parallel writes extend: each item once, in order of first appearance
    (the current items first). ``Annotated[list[str], UnionReducer]``; starts as ``[]``."""

    policy = Union()

    def _empty(self) -> Any:
        return []

    def _merge(self, facts: list[Fact]) -> Any:
        current = Fact(field=self._field, value=list(self.value), source="state")
        return self.policy.merge(self._field, [current, *facts])


class MaxByVersionReducer(_Reconciled):
    """A field whose writes carry a version: ``{"value": ..., "version": n}`` (``"source"`` and
    ``"evidence"`` optional) or an :class:`agentlease.Fact` with a version. The value read at the
    highest version wins, across steps too (a stale write is ignored); two different values at
    that version raise :class:`~agentlease.errors.ReconciliationConflict`. The field reads as
    ``{"value", "version", "source"}``. ``Annotated[dict, MaxByVersionReducer]``."""

    policy = LatestByVersion()

    def _fact(self, value: Any, source: str) -> Fact:
        if isinstance(value, Fact):
            return super()._fact(value, source)
        if not isinstance(value, dict) or not {"value", "version"} <= value.keys():
            raise InvalidInput(
                f"field {self._field!r} takes {{'value': ..., 'version': n}} or a Fact with a"
                f" version, not {value!r}"
            )
        return Fact(
            field=self._field,
            value=value["value"],
            source=value.get("source") or source,
            evidence=value.get("evidence"),
            version=value["version"],
        )

    def _merge(self, facts: list[Fact]) -> Any:
        if self.value is not _MISSING:
            facts = [self._fact(self.value, "state"), *facts]
        winner = self.policy.merge(self._field, facts)
        top = max(f.version or 0 for f in facts)
        chosen = next(f for f in facts if f.version == top)
        return {"value": winner, "version": top, "source": chosen.source}


class MustAgreeReducer(_Reconciled):
    """A field that parallel branches must agree on: the writes of one superstep must be equal
    (as canonical JSON), else :class:`~agentlease.errors.ReconciliationConflict` names the
    field and two writes that differ; the agreed value replaces the previous one.
    ``Annotated[str, MustAgreeReducer]``."""

    policy = MustAgree()
