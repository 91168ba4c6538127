"""Idempotent tool calls for Pydantic AI agents (the ``pydantic-ai`` extra).

:class:`IdempotentTools` is a Pydantic AI capability: give it to an agent
(``Agent(model, capabilities=[IdempotentTools(keys)])``) and every call of the agent's tools,
function tools and toolsets' tools alike, runs at most once per tool call. A tool call that runs
again (a run resumed from a message history whose last response holds calls that were executed
but whose results were never saved, a durable engine replaying a run, two processes resuming
the same conversation) replays the first outcome instead of acting; a new tool call, with a new
``tool_call_id``, acts even with the same arguments.

It hooks ``wrap_tool_execute``, Pydantic AI's extension point around a tool's execution, in the
innermost position: other capabilities' wrappers (instrumentation, logging) still see every call,
replayed or not, and the arguments keyed are the ones the tool would run with.

**The key.** Each call is an :class:`agentlease.AsyncIdempotency` action: ``tool`` = the tool's
name, ``args`` = its validated arguments (as JSON), ``step`` = the call's ``tool_call_id``, and
``task_id`` = the run's identity:

1. the task of the current agentlease scope, always first: a worker's job (the agent runs inside
   a handler), or ``agentlease.idempotency_scope(task_id=...)`` around the run (an order id, a
   conversation id the application keeps);
2. else, with ``identity="conversation"``, the run's ``conversation_id``: a run started with a
   ``message_history`` inherits it from that history (or pass ``conversation_id=`` to the run),
   so a resumed run keeps it. Not the ``run_id``: Pydantic AI gives every run a new one and
   refuses one that already appears in the history. A function ``identity(ctx)`` may return any
   other id that is the same every time the run is resumed (``None``: none is known);
3. else :class:`~agentlease.errors.MissingIdentity` is raised and nothing runs: a key made of a
   fresh random id would protect nothing and look as if it did.

Keying on ``tool_call_id`` protects the re-execution of a call that is already recorded in the
history. A call the model plans anew (a run restarted from its prompt, the model asked again)
gets a new id and acts again: pass the key of the action itself downstream
(:func:`agentlease.current_key`, as an ``Idempotency-Key`` header) or key the tool on its own
semantic identity with ``@agentlease.idempotent`` where that matters. Tool call ids are unique
per provider response in practice; an id reused for the same tool with the same arguments
within one identity would replay (with other arguments it raises
:class:`~agentlease.errors.IdempotencyConflict`).

**Outcomes.** The tool's result is stored as JSON (a :class:`pydantic_ai.messages.ToolReturn`
with its content and metadata, multimodal content in base64), and the model is given the tool
result rebuilt from that JSON, at the first execution as at every replay, so it reads the same
result either way (other capabilities' wrappers see the rebuilt value, not the original object).
A tool that raises ``ToolFailed`` (a terminal failure the model should see) has that failure
stored and replayed.
``ModelRetry``, a deferral (``CallDeferred``, ``ApprovalRequired``), a skipped execution and an
agentlease refusal release the key: the tool did not act, and the next execution of the call
runs it. Any other error is ambiguous (the side effect may have happened): the reservation stays
in flight until its in-flight lease runs out, as everywhere in agentlease, and a re-execution
meanwhile raises :class:`~agentlease.errors.DuplicateInFlight` (inside a worker's job it waits
for the lease to run out and then takes the call over).

**Refusals.** An agentlease refusal meant for a planner (:class:`~agentlease.ToolUnavailable`:
the deadline in force has passed, a circuit breaker is open, a retry or spend budget is spent),
whether raised before the call or by the tool itself, reaches the model as the tool's result
(:meth:`~agentlease.ToolUnavailable.as_tool_result`: one sentence and the refusal as JSON), so it
re-plans instead of retrying; ``raise_refusals=True`` raises it out of the run instead.
Idempotency refusals (``DuplicateInFlight``, ``IdempotencyConflict``, ``ReservationLost``,
``MissingIdentity``) are raised out of the run: they are the application's to handle.

Needs the ``pydantic-ai`` extra (``pip install 'agentlease[pydantic-ai]'``): without it,
importing this module raises :class:`~agentlease.errors.MissingDriver` naming it.
``import agentlease`` never imports this module.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Literal

from agentlease.errors import MissingDriver

try:
    import pydantic
    import pydantic_core
    from pydantic_ai import RunContext, ToolDefinition
    from pydantic_ai.capabilities import AbstractCapability, CapabilityOrdering
    from pydantic_ai.capabilities.abstract import ValidatedToolArgs, WrapToolExecuteHandler
    from pydantic_ai.exceptions import (
        ApprovalRequired,
        CallDeferred,
        ModelRetry,
        SkipToolExecution,
        ToolFailed,
        ToolFailedError,
        ToolRetryError,
    )
    from pydantic_ai.messages import ToolCallPart, ToolReturn, ToolReturnContent
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    missing = MissingDriver("pydantic-ai", "pydantic-ai")
    missing.args = (
        f"agentlease.pydantic_ai needs Pydantic AI: pip install 'agentlease[pydantic-ai]' ({exc})",
    )
    raise missing from exc

from agentlease._async.idempotency import AsyncIdempotency
from agentlease._codec import JSON
from agentlease._outcomes import ErrorTypes, error_types
from agentlease._scope import current_scope
from agentlease.errors import MissingIdentity, NotJSON, ToolUnavailable

__all__ = ["IdempotentTools", "Identity"]

Identity = Literal["scope", "conversation"] | Callable[[RunContext[Any]], str | None]
"""How a run is identified when no agentlease scope names its task (see the module's account)."""

# Errors by which a tool says it did not act: the key is released.
_NOT_RUN: tuple[type[BaseException], ...] = (
    ModelRetry,
    ToolRetryError,
    CallDeferred,
    ApprovalRequired,
    SkipToolExecution,
    ToolUnavailable,
)
_RESULT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ToolReturnContent)
_TOOL_RETURN: pydantic.TypeAdapter[ToolReturn[Any]] = pydantic.TypeAdapter(ToolReturn[Any])


class IdempotentTools(AbstractCapability[Any]):
    """A capability that runs each tool call of an agent at most once, keyed by the run's
    identity and the call's ``tool_call_id`` (see the module's account).

    Args:
        keys: the idempotency store (:meth:`agentlease.AsyncIdempotency.connect`), used from
            the event loop the agent runs in.
        identity: the run's identity when no agentlease scope names a task: ``"scope"`` (none:
            :class:`~agentlease.errors.MissingIdentity`), ``"conversation"`` (the run's
            ``conversation_id``) or a function of the run context returning a stable id.
        tools: the only tools to make idempotent (default: every tool).
        read_only: tools run as they are, never keyed (lookups, searches).
        wait: seconds to wait for another execution of the same call to finish before raising
            ``DuplicateInFlight`` (default: agentlease's, no wait outside a worker's job).
        raise_refusals: raise ``ToolUnavailable`` refusals instead of giving them to the model.
        fail_on: more error types stored as the call's permanent outcome and raised again at
            every re-execution (``ToolFailed`` always is).
        release_on: more error types by which a tool says it did not act (the key is released).
    """

    def __init__(
        self,
        keys: AsyncIdempotency,
        *,
        identity: Identity = "scope",
        tools: Collection[str] | None = None,
        read_only: Collection[str] = (),
        wait: float | None = None,
        raise_refusals: bool = False,
        fail_on: ErrorTypes = (),
        release_on: ErrorTypes = (),
    ) -> None:
        if not isinstance(keys, AsyncIdempotency):
            raise TypeError(f"keys must be an agentlease.AsyncIdempotency, got {keys!r}")
        if not (identity in ("scope", "conversation") or callable(identity)):
            raise ValueError(
                f"identity must be 'scope', 'conversation' or a function, got {identity!r}"
            )
        self.keys = keys
        self.identity = identity
        self.tools = None if tools is None else frozenset(tools)
        self.read_only = frozenset(read_only)
        self.wait = wait
        self.raise_refusals = raise_refusals
        self.fail_on: ErrorTypes = (ToolFailed, *error_types(fail_on, "fail_on"))
        self.release_on: ErrorTypes = (*_NOT_RUN, *error_types(release_on, "release_on"))

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a store client: not built from an agent spec

    def get_ordering(self) -> CapabilityOrdering:
        return CapabilityOrdering(position="innermost")

    def covers(self, tool: str) -> bool:
        """Whether calls of ``tool`` are made idempotent."""
        return tool not in self.read_only and (self.tools is None or tool in self.tools)

    def task_id(self, ctx: RunContext[Any], tool: str = "") -> str:
        """The run's identity: the agentlease scope's task, else what ``identity`` gives.

        Raises:
            MissingIdentity: neither is known.
        """
        task = current_scope().task_id
        if task is not None:
            return task
        found: str | None = None
        if self.identity == "conversation":
            found = ctx.conversation_id
        elif callable(self.identity):
            found = self.identity(ctx)
        if found:
            return found
        how = (
            "identity='conversation' found no conversation_id"
            if self.identity == "conversation"
            else "the identity function returned none"
            if callable(self.identity)
            else "or pass identity='conversation' to key on the run's conversation_id"
        )
        raise MissingIdentity(
            f"tool {tool!r} of a Pydantic AI run has no task to be keyed on: run the agent in a"
            f" worker's job or inside agentlease.idempotency_scope(task_id=...), {how}"
        )

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        """Run the call at most once for this run's identity and ``tool_call_id``, or replay
        its stored outcome; an agentlease refusal becomes the tool's result."""
        tool = call.tool_name
        if not self.covers(tool):
            return await handler(args)
        task_id = self.task_id(ctx, tool)
        if not call.tool_call_id:
            raise MissingIdentity(f"a call of tool {tool!r} has no tool_call_id to be keyed on")
        try:
            keyed_args = pydantic_core.to_jsonable_python(args)
        except pydantic_core.PydanticSerializationError as exc:
            raise NotJSON(f"the arguments of tool {tool!r} are not JSON: {exc}") from exc

        async def act() -> JSON:
            try:
                result = await handler(args)
            except ToolFailedError as failed:  # the tool raised ToolFailed: a stored outcome
                raise ToolFailed(str(failed)) from failed
            return _stored(result)

        try:
            outcome = await self.keys.call(
                act,
                tool=tool,
                args=keyed_args,
                step=call.tool_call_id,
                task_id=task_id,
                wait=self.wait,
                fail_on=self.fail_on,
                release_on=self.release_on,
            )
        except ToolUnavailable as refused:
            if self.raise_refusals:
                raise
            if refused.tool is None:
                refused.tool = tool
            return refused.as_tool_result()
        return _restored(outcome.value)


def _stored(result: Any) -> JSON:
    """The tool's result as JSON to store: ``{"return": ...}`` or ``{"tool_return": ...}``.

    A result that cannot be serialised is returned as it is, for the store to refuse
    (:class:`~agentlease.errors.NotJSON`, recorded as the call's permanent failure: the tool
    did act)."""
    try:
        if isinstance(result, ToolReturn):
            dumped = _TOOL_RETURN.dump_python(result, mode="json", by_alias=True)
            return {"tool_return": dumped}
        return {"return": _RESULT.dump_python(result, mode="json", by_alias=True)}
    except pydantic_core.PydanticSerializationError:
        return result  # type: ignore[no-any-return]


def _restored(stored: JSON) -> Any:
    """The tool result rebuilt from what :func:`_stored` made of it."""
    if isinstance(stored, dict):
        if "tool_return" in stored:
            return _TOOL_RETURN.validate_python(stored["tool_return"])
        if "return" in stored:
            return _RESULT.validate_python(stored["return"])
    return stored
