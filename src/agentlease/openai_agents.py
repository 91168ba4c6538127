"""The OpenAI Agents SDK, made safe to retry and resume (the ``openai-agents`` extra:
``pip install 'agentlease[openai-agents]'``).

The Agents SDK runs the tool calls a model asks for, and runs them again when a run is retried
from its input, or resumed twice from the same saved :class:`agents.RunState` (an approval
resumed, the resumed run failed, and it is resumed again from what was saved). Nothing in the
SDK stops the email going out twice. Three pieces fix that, and one recipe puts them in a queue:

``@idempotent(store=...)``, applied under ``@function_tool``, keys each call of a function tool
on **the run's identity** and **the tool call's id** (``ToolContext.tool_call_id``, which the
SDK keeps for the life of a run and its resumes), and claims the key in the store before
acting (:class:`~agentlease.AsyncIdempotency` / :class:`~agentlease.Idempotency`): a re-run of
the same call returns the first call's stored result, a new call acts, even with the same
arguments. The key is derived as every agentlease key is (task id, step id, tool name, canonical
JSON of the arguments): task = the run's identity, step = the call id, tool = the tool's name,
arguments = the call's JSON arguments as the model sent them.

The run's identity, in this order:

1. ``run_id(ctx)``, when the decorator is given one (a function of the tool's
   :class:`agents.RunContextWrapper`, for example ``lambda ctx: ctx.context.conversation_id``)
   and it returns a str;
2. the current agentlease task: the task a worker runs (see :func:`agent_handler`), or the one
   named by ``with agentlease.idempotency_scope(task_id=...):`` around ``Runner.run``.

With neither, the call is refused with :class:`~agentlease.errors.MissingIdentity` rather than
keyed on something that would merge two runs. A resume must run under the identity of the run
it resumes (the same task, or the same ``idempotency_scope``) for its calls to replay.

The decorated function may take the SDK's context as its first parameter (annotated
``RunContextWrapper[...]`` or ``ToolContext[...]``, as ``function_tool`` expects) or not: the
wrapper always asks the SDK for the :class:`agents.ToolContext`, and hands it on only to a
function that declares it. The wrapper is a plain function with the original's name, docstring
and parameters, so ``function_tool`` builds the same schema from it. A sync function needs an
:class:`~agentlease.Idempotency` (the SDK runs it in a thread), an async one an
:class:`~agentlease.AsyncIdempotency`. Its result must be JSON (str, numbers, lists, dicts):
that is what is stored and replayed.

Refusals reach the model as data. A call made after the current agentlease deadline
(:func:`agentlease.deadline`, or a task's deadline in a worker) does not act, and one refused
with a :class:`~agentlease.errors.ToolUnavailable` (:class:`~agentlease.errors.CircuitOpen`,
:class:`~agentlease.errors.RetryBudgetExhausted`, :class:`~agentlease.errors.BudgetExceeded`,
:class:`~agentlease.errors.DeadlineExceeded`), raised by the function or by agentlease, returns
:meth:`~agentlease.errors.ToolUnavailable.as_tool_result` as the tool's output: one sentence the
model can act on (do not call it again, re-plan) and the refusal as JSON, instead of the SDK's
generic "please try again". With ``on_unavailable="raise"`` the refusal propagates instead (the
SDK then applies the tool's ``failure_error_function``). A breaker, retry-budget or spend refusal
raised by the function is taken to mean the side effect did not happen: the key is released, so
a later call acts. A :class:`~agentlease.errors.DeadlineExceeded` from inside the function may
have come mid-call, so its key stays in flight as for any ambiguous error (see
:mod:`agentlease._async.idempotency`). Other errors go to the SDK as they would without the
decorator (by default it shows the model an error message and the run goes on; pass
``failure_error_function=None`` to ``function_tool`` to make them end the run).

Two calls with one call id at once (a duplicate in one response, a resume racing a retry): the
second waits for the first's outcome and replays it (``wait``, by default the store's
``hold_for`` plus one second, and never past the deadline).

:class:`GuardedModel` wraps any :class:`agents.Model` (and :class:`GuardedModelProvider` any
provider) so that a model call made while the task holds an agentlease lock is refused with
:class:`~agentlease.errors.LockHeldAcrossModelCall` (or logged, ``on_lock="warn"``): see
:func:`agentlease.model_call`.

:func:`agent_handler` builds an :class:`~agentlease.AsyncWorker` handler that runs one agent run
per queue task, with the task's id as the run's identity: a task retried after a crash or an
error replays the tool calls its earlier attempt completed, and acts only for the rest.
"""

from __future__ import annotations

import functools
import inspect
import json
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from agentlease import _deadline
from agentlease._async.idempotency import AsyncIdempotency
from agentlease._guards import ModelCall
from agentlease._outcomes import ErrorTypes, error_types
from agentlease._scope import current_scope
from agentlease._sync.idempotency import Idempotency
from agentlease.errors import (
    BudgetExceeded,
    CircuitOpen,
    InvalidInput,
    MissingDriver,
    MissingIdentity,
    RetryBudgetExhausted,
    ToolUnavailable,
)

try:
    from agents import Agent, Runner, RunState
    from agents.models.interface import Model, ModelProvider
    from agents.run_context import RunContextWrapper
    from agents.tool_context import ToolContext
except ImportError as exc:  # the openai-agents extra is not installed
    _missing = MissingDriver("openai-agents", "openai-agents")
    _missing.args = (
        "the OpenAI Agents SDK adapter needs its extra: pip install 'agentlease[openai-agents]'",
    )
    raise _missing from exc

if TYPE_CHECKING:
    from agents.agent_output import AgentOutputSchemaBase
    from agents.handoffs import Handoff
    from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
    from agents.model_settings import ModelSettings
    from agents.models.interface import ModelTracing
    from agents.result import RunResult
    from agents.run_config import RunConfig
    from agents.tool import Tool

    from agentlease._codec import JSON
    from agentlease._context import AsyncJobContext

__all__ = [
    "GuardedModel",
    "GuardedModelProvider",
    "agent_handler",
    "idempotent",
]

F = TypeVar("F", bound=Callable[..., Any])
RunId = Callable[[RunContextWrapper[Any]], "str | None"]

_REFUSED_BEFORE_ACTING = (CircuitOpen, RetryBudgetExhausted, BudgetExceeded)
_CONTEXT_TYPES = (RunContextWrapper, ToolContext)


def _takes_context(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` declares the SDK's context as its first parameter (the rule of
    ``function_tool``: the first parameter annotated ``RunContextWrapper`` or ``ToolContext``)."""
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        return False
    first = params[0]
    try:
        ann = typing.get_type_hints(fn).get(first.name, first.annotation)
    except Exception:  # an annotation that does not resolve here: read it as written
        ann = first.annotation
    if isinstance(ann, str):
        head = ann.split("[", 1)[0].rsplit(".", 1)[-1].strip()
        return head in ("RunContextWrapper", "ToolContext")
    origin = typing.get_origin(ann) or ann
    return origin in _CONTEXT_TYPES


class _Tool:
    """What the sync and async wrappers share: the identity of a call and the refusals."""

    def __init__(
        self,
        store: Idempotency | AsyncIdempotency,
        tool: str | None,
        run_id: RunId | None,
        step: str | Callable[[ToolContext[Any]], str] | None,
        on_unavailable: Literal["result", "raise"],
        wait: float | None,
        fail_on: ErrorTypes,
        release_on: ErrorTypes,
    ) -> None:
        if on_unavailable not in ("result", "raise"):
            raise InvalidInput(
                f"on_unavailable must be 'result' or 'raise', not {on_unavailable!r}"
            )
        if run_id is not None and not callable(run_id):
            raise InvalidInput("run_id must be a function of the run context returning a str")
        self.store = store
        self.tool = tool
        self.run_id = run_id
        self.step = step
        self.on_unavailable = on_unavailable
        self.wait = store.settings.hold_for + 1.0 if wait is None else wait
        self.fail_on = error_types(fail_on, "fail_on")
        self.release_on = (*_REFUSED_BEFORE_ACTING, *error_types(release_on, "release_on"))

    def identity(self, ctx: object, fn: Callable[..., Any]) -> dict[str, Any]:
        """The keyword arguments of ``store.call`` for this call: tool, args, step, task_id.

        Raises:
            MissingIdentity: not called by the SDK as a function tool, or no run identity.
            DeadlineExceeded: the deadline has passed (nothing is reserved).
        """
        if not isinstance(ctx, ToolContext):
            raise MissingIdentity(
                f"{fn.__qualname__} is an idempotent function tool: the Agents SDK must call it"
                " (through @function_tool), which gives it the tool call's id"
            )
        tool = self.tool or ctx.tool_name
        _deadline.check_deadline(f"the tool {tool!r}")
        task_id = self.run_id(ctx) if self.run_id is not None else None
        if task_id is None:
            task_id = current_scope().task_id
        if task_id is None:
            raise MissingIdentity(
                f"idempotent tool {tool!r} has no run identity: run the agent in an agentlease"
                " worker, inside agentlease.idempotency_scope(task_id=...), or give run_id="
            )
        if self.step is None:
            step = ctx.tool_call_id
        else:
            step = self.step if isinstance(self.step, str) else self.step(ctx)
        return {
            "tool": tool,
            "args": json.loads(ctx.tool_arguments or "{}"),
            "step": step,
            "task_id": task_id,
            "wait": self.wait,
            "fail_on": self.fail_on,
            "release_on": self.release_on,
        }

    def refused(self, exc: ToolUnavailable, ctx: object) -> str:
        """The refusal as the tool's output, or raise it again (``on_unavailable="raise"``)."""
        if self.on_unavailable == "raise":
            raise exc
        if exc.tool is None:
            exc.tool = self.tool or getattr(ctx, "tool_name", None)
        return exc.as_tool_result()


def _with_context(fn: Callable[..., Any], wrapper: F, takes_context: bool) -> F:
    """``wrapper`` dressed as ``fn`` for ``function_tool``: same name, docstring and
    parameters, with the SDK's context first (added when ``fn`` does not take it)."""
    functools.update_wrapper(wrapper, fn)
    if not takes_context:
        sig = inspect.signature(fn)
        ctx = inspect.Parameter(
            "agentlease_tool_context",
            inspect.Parameter.POSITIONAL_ONLY,
            annotation=ToolContext[Any],
        )
        wrapper.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=[ctx, *sig.parameters.values()]
        )
        wrapper.__annotations__ = {ctx.name: ctx.annotation, **getattr(fn, "__annotations__", {})}
    return wrapper


def idempotent(
    *,
    store: Idempotency | AsyncIdempotency,
    tool: str | None = None,
    run_id: RunId | None = None,
    step: str | Callable[[ToolContext[Any]], str] | None = None,
    on_unavailable: Literal["result", "raise"] = "result",
    wait: float | None = None,
    fail_on: ErrorTypes = (),
    release_on: ErrorTypes = (),
) -> Callable[[F], Callable[..., Any]]:
    """Make a function tool act at most once per tool call; apply it under ``@function_tool``::

        keys = agentlease.AsyncIdempotency.connect("sqlite:///agents.db")

        @function_tool
        @openai_agents.idempotent(store=keys)
        async def send_email(to: str, body: str) -> str:
            return await mailer.send(to, body, idempotency_key=agentlease.current_key())

    Args:
        store: where keys live; :class:`~agentlease.AsyncIdempotency` for an async function,
            :class:`~agentlease.Idempotency` for a sync one.
        tool: the tool's name in the key (by default the name the SDK calls it by).
        run_id: the run's identity from the run context, when not the current agentlease
            task (see the module's account); return ``None`` to fall back to the task.
        step: the step id in the key: by default the tool call's id. A str (or a function of
            the :class:`agents.ToolContext`) keys on the run, the tool and the arguments
            instead: then the same arguments act once per run even when the model is asked
            again and gives the call a new id (a whole run retried from its input).
        on_unavailable: ``"result"`` (default) returns a refusal's ``as_tool_result()`` text
            to the model; ``"raise"`` raises it.
        wait: seconds a second call with the same id waits for the first's outcome (by
            default the store's ``hold_for`` plus one second).
        fail_on: errors that are permanent: stored, and raised again by a re-run.
        release_on: errors known to mean the side effect did not happen (the key is released);
            breaker, retry-budget and spend refusals always are.

    Raises:
        InvalidInput: the store's face does not match the function, or an option is invalid.
    """
    spec = _Tool(store, tool, run_id, step, on_unavailable, wait, fail_on, release_on)

    def decorate(fn: F) -> Callable[..., Any]:
        takes_context = _takes_context(fn)
        if inspect.iscoroutinefunction(fn):
            astore = store
            if not isinstance(astore, AsyncIdempotency):
                raise InvalidInput(
                    f"async function tool {fn.__qualname__} needs an AsyncIdempotency store"
                )

            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                ctx = args[0] if args else None
                call = args if takes_context else args[1:]
                try:
                    options = spec.identity(ctx, fn)

                    async def run() -> Any:
                        return await fn(*call, **kwargs)

                    return (await astore.call(run, **options)).value
                except ToolUnavailable as exc:
                    return spec.refused(exc, ctx)

            return _with_context(fn, awrapper, takes_context)

        sstore = store
        if not isinstance(sstore, Idempotency):
            raise InvalidInput(f"function tool {fn.__qualname__} needs an Idempotency store (sync)")

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = args[0] if args else None
            call = args if takes_context else args[1:]
            try:
                options = spec.identity(ctx, fn)
                return sstore.call(lambda: fn(*call, **kwargs), **options).value
            except ToolUnavailable as exc:
                return spec.refused(exc, ctx)

        return _with_context(fn, wrapper, takes_context)

    return decorate


class GuardedModel(Model):
    """A model that refuses to be called while the task holds an agentlease lock.

    Every ``get_response`` and ``stream_response`` enters :func:`agentlease.model_call` first:
    with a lock held (a :meth:`~agentlease.SharedState.locks` block around the run, or a lock
    a tool took and left held) it raises :class:`~agentlease.errors.LockHeldAcrossModelCall`,
    or only logs a warning with ``on_lock="warn"``; otherwise it calls the wrapped model.
    Pass it as ``Agent(model=GuardedModel(model))``.

    Args:
        model: the model to guard.
        on_lock: ``"raise"`` (default) or ``"warn"``.
    """

    def __init__(self, model: Model, *, on_lock: Literal["raise", "warn"] = "raise") -> None:
        self.model = model
        self._guard = ModelCall(on_lock)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        **kwargs: Any,
    ) -> ModelResponse:
        async with self._guard:
            return await self.model.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                **kwargs,
            )

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        **kwargs: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        async with self._guard:
            stream = self.model.stream_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                **kwargs,
            )
            async for event in stream:
                yield event

    async def close(self) -> None:
        close = getattr(self.model, "close", None)
        if close is not None:
            await close()

    def __getattr__(self, name: str) -> Any:
        # Whatever else the SDK asks a model (retry advice, cleanup hooks of newer releases)
        # is the wrapped model's to answer.
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)


class GuardedModelProvider(ModelProvider):
    """A model provider whose models are :class:`GuardedModel` s: for agents that name their
    model by a string (``RunConfig(model_provider=GuardedModelProvider(provider))``).

    Args:
        provider: the provider to wrap (the SDK's default is ``agents.OpenAIProvider()``).
        on_lock: ``"raise"`` (default) or ``"warn"``.
    """

    def __init__(
        self, provider: ModelProvider, *, on_lock: Literal["raise", "warn"] = "raise"
    ) -> None:
        ModelCall(on_lock)  # refuse a bad value now
        self.provider = provider
        self._on_lock: Literal["raise", "warn"] = on_lock

    def get_model(self, model_name: str | None) -> Model:
        return GuardedModel(self.provider.get_model(model_name), on_lock=self._on_lock)


def _final_output(result: RunResult) -> JSON:
    output = result.final_output
    dump = getattr(output, "model_dump", None)
    if callable(dump):  # a pydantic output_type
        return dump(mode="json")  # type: ignore[no-any-return]
    if output is None or isinstance(output, str | int | float | bool | list | dict):
        return output
    return str(output)


def _default_result(result: RunResult) -> JSON:
    """The task's result: the final output, or what waits for approval and the saved state."""
    if result.interruptions:
        return {
            "final_output": None,
            "interruptions": [
                {
                    "tool": item.tool_name,
                    "call_id": getattr(item.raw_item, "call_id", None),
                    "arguments": getattr(item.raw_item, "arguments", None),
                }
                for item in result.interruptions
            ],
            "state": result.to_state().to_string(),
        }
    return {"final_output": _final_output(result), "interruptions": [], "state": None}


def agent_handler(
    agent: Agent[Any],
    *,
    input_from: Callable[
        [JSON],
        str | list[TResponseInputItem] | RunState[Any] | Awaitable[RunState[Any]],
    ],
    context_from: Callable[[AsyncJobContext], Any] | None = None,
    run_config: RunConfig | None = None,
    max_turns: int | None = None,
    result_from: Callable[[RunResult], JSON] | None = None,
) -> Callable[[AsyncJobContext], Awaitable[JSON]]:
    """An :class:`~agentlease.AsyncWorker` handler that runs ``agent`` once per task::

        worker = agentlease.AsyncWorker(
            queue, "support", agent_handler(agent, input_from=lambda p: p["question"])
        )

    The worker sets the task as the current agentlease task around the handler, so the task id
    is the run's identity for every :func:`idempotent` tool the agent calls: an attempt that
    fails after a tool acted (the model errors on its next turn, the worker dies) is retried by
    the queue, and the retry's calls with the same ids replay instead of acting again. The
    task's deadline, if any, is in force for the run (tools refuse past it).

    Args:
        agent: the agent to run.
        input_from: the run's input from the task's payload: a str, input items, or a
            :class:`agents.RunState` to resume (or an awaitable of one, such as
            ``RunState.from_string(agent, payload["state"])`` after approving).
        context_from: the run's context object from the job (default: none).
        run_config: passed to ``Runner.run``.
        max_turns: passed to ``Runner.run`` (default: the SDK's).
        result_from: the task's result (JSON) from the run's result. By default
            ``{"final_output": ..., "interruptions": [...], "state": ...}``: the final output
            (a pydantic output as its JSON), and for a run that stopped for approval the calls
            that wait (tool, call id, arguments) and the saved state
            (``RunState.to_string()``) to resume from.

    Returns:
        ``async def handler(ctx: AsyncJobContext) -> JSON``.
    """

    async def handler(ctx: AsyncJobContext) -> JSON:
        given = input_from(ctx.payload)
        start = await given if inspect.isawaitable(given) else given
        options: dict[str, Any] = {"run_config": run_config}
        if max_turns is not None:
            options["max_turns"] = max_turns
        context = context_from(ctx) if context_from is not None else None
        result = await Runner.run(agent, start, context=context, **options)
        return (result_from or _default_result)(result)

    return handler
