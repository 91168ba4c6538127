"""agentlease.pydantic_ai: tool calls of a real Pydantic AI agent loop run at most once.

The agents are driven by ``FunctionModel`` (scripted responses with chosen ``tool_call_id``s),
no network. Side effects are counted in a ledger the library never sees, and every test checks
the ledger, not only what the agent returned. The stores are real: SQLite for all, and the main
replay test on Redis and PostgreSQL too.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import agentlease as al
from agentlease import _clock
from tests.conftest import require

require("pydantic_ai", "pydantic-ai")

from pydantic_ai import Agent, capture_run_messages  # noqa: E402
from pydantic_ai.exceptions import ToolFailed  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

from agentlease.pydantic_ai import IdempotentTools  # noqa: E402

ADA = {"to": "ada@example.com"}
Script = Callable[[list[ModelMessage], AgentInfo], ModelResponse]


class ProviderDown(Exception):
    """The model provider failed after the tools ran (the run dies there)."""


@pytest.fixture
async def keys(sqlite_url: str) -> AsyncIterator[al.AsyncIdempotency]:
    async with al.AsyncIdempotency.connect(sqlite_url) as store:
        yield store


@pytest.fixture(params=["sqlite", "redis", "postgres"])
async def any_keys(request: pytest.FixtureRequest) -> AsyncIterator[al.AsyncIdempotency]:
    url = request.getfixturevalue(
        {"sqlite": "sqlite_url", "redis": "served_url_redis", "postgres": "served_url_postgres"}[
            request.param
        ]
    )
    async with al.AsyncIdempotency.connect(url) as store:
        yield store


def mailer(sent: list[str], **options: Any) -> Agent[None, str]:
    """An agent whose one tool sends an email (appends to ``sent``) and names the message."""
    keys = options.pop("keys")
    agent: Agent[None, str] = Agent(capabilities=[IdempotentTools(keys, **options)])

    @agent.tool_plain
    def send_email(to: str) -> dict[str, str]:
        sent.append(to)
        return {"message_id": f"m-{len(sent)}"}

    @agent.tool_plain
    def lookup(to: str) -> str:
        sent.append(f"lookup {to}")
        return "known"

    return agent


def calls(*ids: str, tool: str = "send_email", args: dict[str, str] = ADA) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool, dict(args), tool_call_id=i) for i in ids])


def returns(messages: Sequence[ModelMessage]) -> dict[str, Any]:
    """The tool results in ``messages``, by tool_call_id."""
    return {
        part.tool_call_id: part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }


def then_fail(first: ModelResponse) -> FunctionModel:
    """A model that answers with ``first``, then fails on the next request."""

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return first
        raise ProviderDown("the provider failed after the tools ran")

    return FunctionModel(script)


def then_done(first: ModelResponse) -> FunctionModel:
    """A model that answers with ``first``, then with text."""

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return first if not any(isinstance(m, ModelResponse) for m in messages) else done()

    return FunctionModel(script)


def done() -> ModelResponse:
    return ModelResponse(parts=[TextPart("done")])


def answer(seen: list[dict[str, Any]]) -> FunctionModel:
    """A model that records the tool results it was given and answers with text."""

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(returns(messages))
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(script)


async def crash_after_tools(agent: Agent[None, str], first: ModelResponse) -> list[ModelMessage]:
    """Run until the tools of ``first`` ran and the next model request failed; the history
    as an application that saves each model response would have it: up to ``first``, the
    tools' results lost with the crash (kept in ``ran`` for the tests to compare)."""
    with capture_run_messages() as messages, pytest.raises(ProviderDown):
        await agent.run("welcome ada", model=then_fail(first))
    cut = next(i for i, m in enumerate(messages) if isinstance(m, ModelResponse))
    ran.clear()
    ran.update(returns(messages[cut + 1 :]))
    return messages[: cut + 1]


ran: dict[str, Any] = {}  # the tool results of the last crash_after_tools, by tool_call_id


# -- (1) a resumed run executes the same tool call again: replayed ---------------------------


async def test_a_resumed_run_replays_a_tool_call_that_already_ran(
    any_keys: al.AsyncIdempotency,
) -> None:
    sent: list[str] = []
    agent = mailer(sent, keys=any_keys)
    with al.idempotency_scope(task_id="signup-ada"):
        history = await crash_after_tools(agent, calls("call-1"))
        assert sent == ["ada@example.com"]
        assert ran == {"call-1": {"message_id": "m-1"}}
        seen: list[dict[str, Any]] = []
        # No prompt: the run executes the history's pending call-1 again, then asks the model.
        result = await agent.run(message_history=history, model=answer(seen))
    assert sent == ["ada@example.com"]  # the email went once
    assert seen == [{"call-1": {"message_id": "m-1"}}]  # the first outcome, replayed
    assert returns(result.all_messages()) == {"call-1": {"message_id": "m-1"}}
    assert result.output == "done"


async def test_the_conversation_id_identifies_a_resumed_run_outside_a_scope(
    keys: al.AsyncIdempotency,
) -> None:
    sent: list[str] = []
    agent = mailer(sent, keys=keys, identity="conversation")
    history = await crash_after_tools(agent, calls("call-1"))
    seen: list[dict[str, Any]] = []
    await agent.run(message_history=history, model=answer(seen))  # inherits the conversation
    assert sent == ["ada@example.com"]
    assert seen == [{"call-1": {"message_id": "m-1"}}]
    # Another conversation with the same tool_call_id is another action.
    await agent.run("welcome ada again", model=then_done(calls("call-1")))
    assert sent == ["ada@example.com", "ada@example.com"]


# -- (2) parallel calls and concurrent executions of one call --------------------------------


async def test_parallel_calls_with_the_same_arguments_are_two_actions(
    keys: al.AsyncIdempotency,
) -> None:
    sent: list[str] = []
    agent = mailer(sent, keys=keys)
    with al.idempotency_scope(task_id="signup-ada"):
        history = await crash_after_tools(agent, calls("call-a", "call-b"))
        assert sent == ["ada@example.com", "ada@example.com"]
        first = dict(ran)
        seen: list[dict[str, Any]] = []
        await agent.run(message_history=history, model=answer(seen))
    assert sent == ["ada@example.com", "ada@example.com"]  # the resume replayed both
    assert sorted(first.values(), key=str) == [{"message_id": "m-1"}, {"message_id": "m-2"}]
    assert seen == [first]  # each call's own outcome


async def test_a_call_executed_twice_at_once_acts_once(keys: al.AsyncIdempotency) -> None:
    """Two processes resume the same history at once: one executes call-1, the other is
    refused (typed) while it runs, and a later resume replays it."""
    sent: list[str] = []
    entered, go = asyncio.Event(), asyncio.Event()
    agent: Agent[None, str] = Agent(capabilities=[IdempotentTools(keys)])

    @agent.tool_plain
    async def send_email(to: str) -> str:
        sent.append(to)
        entered.set()
        await go.wait()
        return f"m-{len(sent)}"

    history: list[ModelMessage] = [
        ModelRequest.user_text_prompt("welcome ada"),
        calls("call-1"),
    ]
    with al.idempotency_scope(task_id="signup-ada"):
        first = asyncio.create_task(agent.run(message_history=history, model=answer([])))
        try:
            await asyncio.wait_for(entered.wait(), 10)
            with pytest.raises(al.DuplicateInFlight):
                await asyncio.wait_for(agent.run(message_history=history, model=answer([])), 10)
        finally:
            go.set()
        await asyncio.wait_for(first, 10)
        seen: list[dict[str, Any]] = []
        await agent.run(message_history=history, model=answer(seen))
    assert sent == ["ada@example.com"]
    assert seen == [{"call-1": "m-1"}]


# -- (3) a new call with the same arguments acts ---------------------------------------------


async def test_a_new_call_with_the_same_arguments_acts_again(keys: al.AsyncIdempotency) -> None:
    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = sum(isinstance(m, ModelResponse) for m in messages)
        return [calls("call-1"), calls("call-2"), done()][step]

    sent: list[str] = []
    agent = mailer(sent, keys=keys)
    with al.idempotency_scope(task_id="signup-ada"):
        result = await agent.run("welcome ada twice", model=FunctionModel(script))
    assert sent == ["ada@example.com", "ada@example.com"]
    assert returns(result.all_messages()) == {
        "call-1": {"message_id": "m-1"},
        "call-2": {"message_id": "m-2"},
    }


async def test_read_only_tools_are_not_keyed(keys: al.AsyncIdempotency) -> None:
    sent: list[str] = []
    agent = mailer(sent, keys=keys, read_only=["lookup"])
    with al.idempotency_scope(task_id="signup-ada"):
        history = await crash_after_tools(agent, calls("call-1", tool="lookup"))
        await agent.run(message_history=history, model=answer([]))
    assert sent == ["lookup ada@example.com", "lookup ada@example.com"]


# -- outcomes other than a result --------------------------------------------------------------


async def test_a_terminal_tool_failure_is_stored_and_replayed(keys: al.AsyncIdempotency) -> None:
    tried: list[str] = []
    agent: Agent[None, str] = Agent(capabilities=[IdempotentTools(keys)])

    @agent.tool_plain
    def charge(card: str) -> str:
        tried.append(card)
        raise ToolFailed(f"card {card} declined")

    with al.idempotency_scope(task_id="order-7"):
        history = await crash_after_tools(agent, calls("call-1", tool="charge", args={"card": "x"}))
        assert ran == {"call-1": "card x declined"}
        seen: list[dict[str, Any]] = []
        await agent.run(message_history=history, model=answer(seen))
    assert tried == ["x"]  # never charged again
    assert seen == [{"call-1": "card x declined"}]


async def test_a_refusal_raised_by_the_tool_releases_the_call(keys: al.AsyncIdempotency) -> None:
    """A tool that refuses (its breaker is open) did not act: the model reads the refusal, and
    a later execution of the same call runs the tool."""
    tried: list[str] = []
    agent: Agent[None, str] = Agent(capabilities=[IdempotentTools(keys)])

    @agent.tool_plain
    def search(query: str) -> str:
        tried.append(query)
        if len(tried) == 1:
            raise al.CircuitOpen("search-api", "open", 5, 12.0)
        return "3 results"

    with al.idempotency_scope(task_id="research-1"):
        search_q = calls("call-1", tool="search", args={"query": "q"})
        history = await crash_after_tools(agent, search_q)
        assert ran["call-1"].startswith("The tool 'search' is unavailable (circuit_open)")
        seen: list[dict[str, Any]] = []
        await agent.run(message_history=history, model=answer(seen))
    assert tried == ["q", "q"]
    assert seen == [{"call-1": "3 results"}]


# -- (4) a passed deadline reaches the model as the tool's result ----------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def late(clock: Clock, seen: list[dict[str, Any]]) -> FunctionModel:
    """A model that takes 10 s to plan the tool call (the clock moves), then answers."""

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            clock.now += 10.0
            return calls("call-1")
        seen.append(returns(messages))
        return done()

    return FunctionModel(script)


async def test_a_passed_deadline_is_the_tool_result_the_model_reads(
    keys: al.AsyncIdempotency,
) -> None:
    sent: list[str] = []
    agent = mailer(sent, keys=keys)
    clock, seen = Clock(), []
    with _clock.using(clock), al.idempotency_scope(task_id="signup-ada"), al.deadline(5):
        result = await agent.run("welcome ada", model=late(clock, seen))
    assert sent == []  # refused before acting
    text = seen[0]["call-1"]
    sentence, payload = text.split("\n", 1)
    assert sentence.startswith("The tool 'send_email' is unavailable (deadline)")
    assert json.loads(payload)["error"] == "DeadlineExceeded"
    assert json.loads(payload)["do_not_retry"] is True
    assert result.output == "done"


async def test_a_passed_deadline_is_raised_when_asked(keys: al.AsyncIdempotency) -> None:
    sent: list[str] = []
    agent = mailer(sent, keys=keys, raise_refusals=True)
    clock = Clock()
    with (
        _clock.using(clock),
        al.idempotency_scope(task_id="signup-ada"),
        al.deadline(5),
        pytest.raises(al.DeadlineExceeded),
    ):
        await agent.run("welcome ada", model=late(clock, []))
    assert sent == []


# -- (5) no identity, no action ---------------------------------------------------------------


@pytest.mark.parametrize("identity", ["scope", lambda ctx: None])
async def test_a_run_without_identity_is_refused(keys: al.AsyncIdempotency, identity: Any) -> None:
    sent: list[str] = []
    agent = mailer(sent, keys=keys, identity=identity)
    with pytest.raises(al.MissingIdentity, match="idempotency_scope"):
        await agent.run("welcome ada", model=then_done(calls("call-1")))
    assert sent == []


def test_options_are_checked(keys: al.AsyncIdempotency) -> None:
    with pytest.raises(ValueError, match="identity"):
        IdempotentTools(keys, identity="run")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="AsyncIdempotency"):
        IdempotentTools("sqlite:///x.db")  # type: ignore[arg-type]
    with pytest.raises(al.InvalidInput):
        IdempotentTools(keys, fail_on="ValueError")  # type: ignore[arg-type]


# -- the extra ----------------------------------------------------------------------------------


def test_without_the_extra_the_module_names_it(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['pydantic_ai'] = None  # as if not installed\n"
        "import agentlease as al\n"
        "try:\n"
        "    import agentlease.pydantic_ai\n"
        "except al.MissingDriver as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'agentlease[pydantic-ai]'" in out.stdout


def test_import_agentlease_does_not_load_pydantic_ai() -> None:
    code = "import sys, agentlease\nprint('pydantic_ai' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["False"]
