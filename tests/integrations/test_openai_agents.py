"""The OpenAI Agents SDK adapter, driven through the SDK's real ``Runner`` loop.

The model is scripted (a subclass of the SDK's ``Model`` returning ``ModelResponse`` objects
with function calls of chosen ids): no network, no API key, tracing off. Side effects are
counted in lists; the stores are real (SQLite for all, Redis and PostgreSQL for the main
replay).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, RunState, function_tool
from agents.exceptions import AgentsException
from agents.items import ModelResponse
from agents.models.interface import Model, ModelProvider
from agents.run_context import RunContextWrapper
from agents.tool import FunctionTool
from agents.tool_context import ToolContext
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import agentlease as al
from agentlease import _clock
from agentlease import openai_agents as al_agents

NO_TRACING = RunConfig(tracing_disabled=True)


def call(name: str, args: dict[str, Any], call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call",
        name=name,
        arguments=json.dumps(args),
        call_id=call_id,
        id=f"fc_{call_id}",
        status="completed",
    )


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_1",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


class Scripted(Model):
    """Answers each model call with the next step of its script: output items, or an
    exception to raise. Records what each call was given."""

    def __init__(self, *steps: list[Any] | BaseException) -> None:
        self.steps = list(steps)
        self.inputs: list[Any] = []
        self.finished = asyncio.Event()

    async def get_response(  # type: ignore[override]
        self, system_instructions: str | None, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        self.inputs.append(input)
        step = self.steps.pop(0)
        if not self.steps:
            self.finished.set()
        if isinstance(step, BaseException):
            raise step
        return ModelResponse(output=step, usage=Usage(), response_id=None)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError  # pragma: no cover - not streamed unless guarded off
        yield


def outputs(model_input: Any) -> dict[str, str]:
    """The tool outputs a model was given, by call id."""
    return {
        item["call_id"]: item["output"]
        for item in model_input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


@pytest.fixture
def akeys(sqlite_url: str) -> Iterator[al.AsyncIdempotency]:
    keys = al.AsyncIdempotency.connect(sqlite_url)
    yield keys
    asyncio.run(keys.close())


def tools(
    keys: al.AsyncIdempotency, effects: list[tuple[str, Any]], **options: Any
) -> tuple[FunctionTool, FunctionTool]:
    """``send`` (acts at once) and ``charge`` (waits for approval), both idempotent."""

    @function_tool
    @al_agents.idempotent(store=keys, **options)
    async def send(to: str) -> str:
        """Send a welcome email.

        Args:
            to: the recipient.
        """
        effects.append(("send", to))
        return f"sent to {to} (#{len(effects)})"

    @function_tool(needs_approval=True)
    @al_agents.idempotent(store=keys)
    async def charge(ctx: RunContextWrapper[Any], amount: int) -> str:
        assert isinstance(ctx, ToolContext)
        effects.append(("charge", amount))
        return f"charged {amount} (#{len(effects)})"

    return send, charge


# -- replay across resumes and retries ---------------------------------------------------------


async def test_the_sdk_runs_a_call_again_when_a_saved_state_is_resumed_twice() -> None:
    """The case the adapter exists for, without it: the approved call runs twice."""
    effects: list[int] = []

    @function_tool(needs_approval=True)
    def charge(amount: int) -> str:
        effects.append(amount)
        return "ok"

    model = Scripted([call("charge", {"amount": 5}, "c2")], RuntimeError("model down"), [say("ok")])
    agent = Agent(name="billing", model=model, tools=[charge])
    saved = (await Runner.run(agent, "go", run_config=NO_TRACING)).to_state().to_string()
    for _ in range(2):
        state = await RunState.from_string(agent, saved)
        for item in state.get_interruptions():
            state.approve(item)
        with contextlib.suppress(RuntimeError):  # the first resume: the model is down
            await Runner.run(agent, state, run_config=NO_TRACING)
    assert effects == [5, 5]


async def resume_twice(url: str) -> None:
    effects: list[tuple[str, Any]] = []
    async with al.AsyncIdempotency.connect(url) as keys:
        send, charge = tools(keys, effects)
        model = Scripted(
            [call("send", {"to": "ada"}, "c1"), call("charge", {"amount": 5}, "c2")],
            RuntimeError("model down"),  # the first resume fails after the charge
            [say("done")],
        )
        agent = Agent(name="billing", model=model, tools=[send, charge])
        with al.idempotency_scope(task_id="order-7"):
            first = await Runner.run(agent, "charge ada 5", run_config=NO_TRACING)
            assert [i.tool_name for i in first.interruptions] == ["charge"]
            assert effects == [("send", "ada")]
            saved = json.dumps(first.to_state().to_json())  # what a real resume would keep

            async def resume() -> Any:
                state = await RunState.from_json(agent, json.loads(saved))
                for item in state.get_interruptions():
                    state.approve(item)
                return await Runner.run(agent, state, run_config=NO_TRACING)

            with pytest.raises(RuntimeError, match="model down"):
                await resume()
            assert effects == [("send", "ada"), ("charge", 5)]
            result = await resume()  # from the same saved state: c2 runs again, and replays
        assert result.final_output == "done"
        assert effects == [("send", "ada"), ("charge", 5)]
        given = outputs(model.inputs[-1])
        assert given == {"c1": "sent to ada (#1)", "c2": "charged 5 (#2)"}  # the first outcome


async def test_a_resumed_approval_does_not_act_twice_sqlite(sqlite_url: str) -> None:
    await resume_twice(sqlite_url)


async def test_a_resumed_approval_does_not_act_twice_redis(served_url_redis: str) -> None:
    await resume_twice(served_url_redis)


async def test_a_resumed_approval_does_not_act_twice_postgres(served_url_postgres: str) -> None:
    await resume_twice(served_url_postgres)


def test_a_retried_run_replays_a_sync_tool_that_takes_the_context(sqlite_url: str) -> None:
    """A run that fails after a tool acted (the model errors on the next turn), retried whole
    with the same identity: the call with the same id replays; sync tool, sync store."""
    effects: list[str] = []
    keys = al.Idempotency.connect(sqlite_url)

    @function_tool
    @al_agents.idempotent(store=keys, run_id=lambda ctx: ctx.context["conversation"])
    def open_ticket(ctx: ToolContext[Any], title: str) -> dict[str, Any]:
        effects.append(title)
        return {"ticket": len(effects), "call": ctx.tool_call_id}

    def run() -> Any:
        model = Scripted(
            [call("open_ticket", {"title": "login broken"}, "c1")],
            *([RuntimeError("model down")] if not effects else [[say("opened")]]),
        )
        agent = Agent(name="support", model=model, tools=[open_ticket])
        ran = Runner.run(agent, "help", context={"conversation": "conv-42"}, run_config=NO_TRACING)
        return asyncio.run(ran), model  # not run_sync: it leaves its event loop open

    with pytest.raises(RuntimeError, match="model down"):
        run()
    assert effects == ["login broken"]
    result, model = run()
    assert result.final_output == "opened"
    assert effects == ["login broken"]
    assert outputs(model.inputs[-1])["c1"] == str({"ticket": 1, "call": "c1"})  # the first
    keys.close()


async def test_a_new_call_with_the_same_arguments_acts_again(
    akeys: al.AsyncIdempotency,
) -> None:
    effects: list[tuple[str, Any]] = []
    send, _ = tools(akeys, effects)
    model = Scripted(
        [call("send", {"to": "ada"}, "c1")],
        [call("send", {"to": "ada"}, "c2")],  # a later step asks again: a new call
        [say("sent twice")],
    )
    agent = Agent(name="mailer", model=model, tools=[send])
    with al.idempotency_scope(task_id="run-1"):
        result = await Runner.run(agent, "send ada two emails", run_config=NO_TRACING)
    assert result.final_output == "sent twice"
    assert effects == [("send", "ada"), ("send", "ada")]
    assert outputs(model.inputs[-1]) == {"c1": "sent to ada (#1)", "c2": "sent to ada (#2)"}


async def test_a_step_name_keys_on_the_arguments_across_new_call_ids(
    akeys: al.AsyncIdempotency,
) -> None:
    """step="welcome": a run retried from its input, where the model gives the call a new
    id, still replays (the key is the run, the tool and the arguments)."""
    effects: list[tuple[str, Any]] = []
    send, _ = tools(akeys, effects, step="welcome")
    for call_id in ("c1", "c9"):
        model = Scripted([call("send", {"to": "ada"}, call_id)], [say("ok")])
        agent = Agent(name="mailer", model=model, tools=[send])
        with al.idempotency_scope(task_id="signup-ada"):
            await Runner.run(agent, "welcome ada", run_config=NO_TRACING)
        assert outputs(model.inputs[-1]) == {call_id: "sent to ada (#1)"}
    assert effects == [("send", "ada")]


async def test_a_duplicate_call_in_one_response_acts_once(akeys: al.AsyncIdempotency) -> None:
    effects: list[tuple[str, Any]] = []
    send, _ = tools(akeys, effects)
    model = Scripted(
        [call("send", {"to": "ada"}, "c1"), call("send", {"to": "ada"}, "c1")], [say("ok")]
    )
    agent = Agent(name="mailer", model=model, tools=[send])
    with al.idempotency_scope(task_id="run-dup"):
        await Runner.run(agent, "go", run_config=NO_TRACING)
    assert effects == [("send", "ada")]
    assert outputs(model.inputs[-1]) == {"c1": "sent to ada (#1)"}


async def test_two_concurrent_invocations_of_one_call_act_once(
    akeys: al.AsyncIdempotency,
) -> None:
    """The second waits for the first's outcome and replays it (not DuplicateInFlight)."""
    effects: list[str] = []
    started, release, second_waits = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @function_tool
    @al_agents.idempotent(store=akeys)
    async def send(to: str) -> str:
        effects.append(to)
        started.set()
        await release.wait()
        return f"sent {len(effects)}"

    reserve = akeys.backend.reserve_key

    async def spy(*args: Any, **kwargs: Any) -> Any:
        got = await reserve(*args, **kwargs)
        if getattr(got, "state", None) == "in_flight":
            second_waits.set()
        return got

    akeys.backend.reserve_key = spy  # type: ignore[method-assign]
    ctx = ToolContext(
        context=None, tool_name="send", tool_call_id="c1", tool_arguments='{"to": "ada"}'
    )
    with al.idempotency_scope(task_id="run-par"):
        first = asyncio.create_task(send.on_invoke_tool(ctx, '{"to": "ada"}'))
        await started.wait()
        second = asyncio.create_task(send.on_invoke_tool(ctx, '{"to": "ada"}'))
        await second_waits.wait()
        release.set()
        results = await asyncio.gather(first, second)
    assert results == ["sent 1", "sent 1"]
    assert effects == ["ada"]


async def test_no_run_identity_is_refused(akeys: al.AsyncIdempotency) -> None:
    effects: list[tuple[str, Any]] = []
    send, _ = tools(akeys, effects)
    ctx = ToolContext(
        context=None, tool_name="send", tool_call_id="c1", tool_arguments='{"to": "ada"}'
    )
    wrapped = send.on_invoke_tool
    result = await wrapped(ctx, '{"to": "ada"}')  # the SDK's default: an error for the model
    assert "error" in str(result).lower()
    assert effects == []
    raw = al_agents.idempotent(store=akeys)(_plain_send)
    with pytest.raises(al.MissingIdentity, match="no run identity"):
        await raw(ctx, to="ada")
    with pytest.raises(al.MissingIdentity, match="Agents SDK must call it"):
        await raw("ada")


async def _plain_send(to: str) -> str:
    return to


def test_the_wrapper_keeps_the_tool_schema(akeys: al.AsyncIdempotency) -> None:
    send, charge = tools(akeys, [])
    assert send.name == "send"
    assert send.description == "Send a welcome email."
    assert send.params_json_schema["properties"]["to"]["description"] == "the recipient."
    assert list(charge.params_json_schema["properties"]) == ["amount"]


def test_a_store_of_the_wrong_face_is_refused(sqlite_url: str) -> None:
    keys = al.Idempotency.connect(sqlite_url)
    with pytest.raises(al.InvalidInput, match="AsyncIdempotency"):
        al_agents.idempotent(store=keys)(_plain_send)
    with pytest.raises(al.InvalidInput, match="on_unavailable"):
        al_agents.idempotent(store=keys, on_unavailable="ignore")  # type: ignore[arg-type]
    keys.close()


# -- deadlines and refusals ----------------------------------------------------------------------


async def test_a_passed_deadline_gives_the_refusal_to_the_model(
    akeys: al.AsyncIdempotency,
) -> None:
    effects: list[tuple[str, Any]] = []
    send, _ = tools(akeys, effects)
    now = [1000.0]

    class LateModel(Scripted):
        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            now[0] += 60.0  # the model took a minute: the deadline has passed
            return await super().get_response(*args, **kwargs)

    model = LateModel([call("send", {"to": "ada"}, "c1")], [say("gave up")])
    agent = Agent(name="mailer", model=model, tools=[send])
    with _clock.using(lambda: now[0]), al.deadline(30), al.idempotency_scope(task_id="late"):
        result = await Runner.run(agent, "go", run_config=NO_TRACING)
    assert result.final_output == "gave up"
    assert effects == []
    text = outputs(model.inputs[-1])["c1"]
    assert text.startswith("The tool 'send' is unavailable (deadline)")
    body = json.loads(text.splitlines()[-1])
    assert body["error"] == "DeadlineExceeded"
    assert body["do_not_retry"] is True


async def test_a_refusal_can_be_raised_instead(akeys: al.AsyncIdempotency) -> None:
    effects: list[str] = []
    now = [1000.0]

    @function_tool(failure_error_function=None)
    @al_agents.idempotent(store=akeys, on_unavailable="raise")
    async def send(to: str) -> str:
        effects.append(to)
        return "sent"

    class LateModel(Scripted):
        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            now[0] += 60.0
            return await super().get_response(*args, **kwargs)

    agent = Agent(name="m", model=LateModel([call("send", {"to": "ada"}, "c1")]), tools=[send])
    with (
        _clock.using(lambda: now[0]),
        al.deadline(30),
        al.idempotency_scope(task_id="late"),
        pytest.raises((al.DeadlineExceeded, AgentsException)) as raised,
    ):
        await Runner.run(agent, "go", run_config=NO_TRACING)
    error: BaseException | None = raised.value
    while error is not None and not isinstance(error, al.DeadlineExceeded):
        error = error.__cause__
    assert isinstance(error, al.DeadlineExceeded)
    assert effects == []


async def test_an_open_breaker_is_a_refusal_and_releases_the_key(
    akeys: al.AsyncIdempotency,
) -> None:
    """A breaker refusal from inside the tool reaches the model as data; nothing happened, so
    the key is released and the same call acts once the breaker lets it through."""
    effects: list[str] = []
    open_now = [True]

    @function_tool
    @al_agents.idempotent(store=akeys)
    async def send(to: str) -> str:
        if open_now[0]:
            raise al.CircuitOpen("mailer", "open", 5, 30.0)
        effects.append(to)
        return "sent"

    ctx = ToolContext(
        context=None, tool_name="send", tool_call_id="c1", tool_arguments='{"to": "ada"}'
    )
    with al.idempotency_scope(task_id="breaker"):
        refused = await send.on_invoke_tool(ctx, '{"to": "ada"}')
        assert refused.startswith("The tool 'send' is unavailable (circuit_open)")
        assert "at least 30 s" in refused
        open_now[0] = False
        assert await send.on_invoke_tool(ctx, '{"to": "ada"}') == "sent"
        assert await send.on_invoke_tool(ctx, '{"to": "ada"}') == "sent"
    assert effects == ["ada"]


# -- the model guard -----------------------------------------------------------------------------


async def test_a_model_call_under_a_lock_is_refused(sqlite_url: str) -> None:
    model = Scripted([say("hello")], [say("hello")])
    agent = Agent(name="a", model=al_agents.GuardedModel(model))
    async with al.AsyncSharedState.connect(sqlite_url) as state:
        async with state.locks(["account:3"], timeout=5, ttl=30):
            with pytest.raises(al.LockHeldAcrossModelCall):
                await Runner.run(agent, "hi", run_config=NO_TRACING)
            streamed = Runner.run_streamed(agent, "hi", run_config=NO_TRACING)
            with pytest.raises(al.LockHeldAcrossModelCall):
                async for _ in streamed.stream_events():
                    pass
        assert model.inputs == []  # the wrapped model was never called
        result = await Runner.run(agent, "hi", run_config=NO_TRACING)  # no lock: it runs
    assert result.final_output == "hello"


async def test_a_model_call_under_a_lock_can_warn(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    class Provider(ModelProvider):
        def get_model(self, model_name: str | None) -> Model:
            return Scripted([say("hello")])

    config = RunConfig(
        tracing_disabled=True,
        model_provider=al_agents.GuardedModelProvider(Provider(), on_lock="warn"),
    )
    agent = Agent(name="a", model="scripted")
    async with (
        al.AsyncSharedState.connect(sqlite_url) as state,
        state.locks(["account:3"], timeout=5, ttl=30),
    ):
        with caplog.at_level(logging.WARNING, logger="agentlease.guards"):
            result = await Runner.run(agent, "hi", run_config=config)
    assert result.final_output == "hello"
    assert "model call entered while holding locks ['account:3']" in caplog.text


# -- the worker recipe ---------------------------------------------------------------------------


async def test_a_retried_task_replays_its_tool_calls(sqlite_url: str) -> None:
    effects: list[tuple[str, Any]] = []
    queue = al.AsyncQueue.connect(sqlite_url)
    keys = al.AsyncIdempotency.connect(sqlite_url)
    send, _ = tools(keys, effects)
    model = Scripted(
        [call("send", {"to": "ada"}, "c1")],
        RuntimeError("model down"),  # attempt 1 fails after the email went out
        [call("send", {"to": "ada"}, "c1")],  # attempt 2: the same call again
        [say("welcomed")],
    )
    agent = Agent(name="welcomer", model=model, tools=[send])
    handler = al_agents.agent_handler(
        agent,
        input_from=lambda payload: f"welcome {payload['to']}",  # type: ignore[index]
        run_config=NO_TRACING,
    )
    await queue.enqueue("signups", {"to": "ada"}, id="signup-ada")
    settings = al.WorkerSettings(retry=al.RetryPolicy(max_failures=3, base=0.01, cap=0.01))
    worker = al.AsyncWorker(queue, "signups", handler, settings=settings)
    running = asyncio.create_task(worker.run(handle_signals=False))
    await asyncio.wait_for(model.finished.wait(), 30)
    worker.stop()
    await asyncio.wait_for(running, 30)
    task = await queue.get("signup-ada")
    assert task.state == "done"
    assert task.attempt == 2
    assert task.result == {"final_output": "welcomed", "interruptions": [], "state": None}
    assert effects == [("send", "ada")]
    assert outputs(model.inputs[-1]) == {"c1": "sent to ada (#1)"}
    await keys.close()
    await queue.close()


async def test_a_task_that_stops_for_approval_returns_its_state(sqlite_url: str) -> None:
    effects: list[tuple[str, Any]] = []
    queue = al.AsyncQueue.connect(sqlite_url)
    keys = al.AsyncIdempotency.connect(sqlite_url)
    _, charge = tools(keys, effects)
    model = Scripted([call("charge", {"amount": 5}, "c2")])
    agent = Agent(name="billing", model=model, tools=[charge])
    await queue.enqueue("billing", "charge 5", id="bill-1")
    handler = al_agents.agent_handler(agent, input_from=str, run_config=NO_TRACING)
    await al.AsyncWorker(queue, "billing", handler).run(burst=True, handle_signals=False)
    task = await queue.get("bill-1")
    assert task.state == "done"
    assert isinstance(task.result, dict)
    assert task.result["interruptions"] == [
        {"tool": "charge", "call_id": "c2", "arguments": '{"amount": 5}'}
    ]
    state = await RunState.from_string(agent, task.result["state"])
    assert [i.tool_name for i in state.get_interruptions()] == ["charge"]
    assert effects == []
    await keys.close()
    await queue.close()


# -- the extra -----------------------------------------------------------------------------------


def test_without_the_sdk_the_extra_is_named(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['agents'] = None\n"
        "import agentlease\n"
        "try:\n"
        "    import agentlease.openai_agents\n"
        "except agentlease.MissingDriver as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    src = str(Path(al.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == (
        "MissingDriver the OpenAI Agents SDK adapter needs its extra:"
        " pip install 'agentlease[openai-agents]'"
    )
