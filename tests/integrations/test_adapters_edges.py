"""The framework adapters with their store unreachable: a tool call surfaces agentlease's typed
:class:`~agentlease.errors.BackendUnavailable` (itself, or as the cause of the framework's own
error), the side effect is not performed, and no redis-py exception escapes untranslated."""

from __future__ import annotations

from typing import Any

import pytest
import redis

import agentlease as al
from agentlease.errors import BackendUnavailable
from tests.conftest import require

pytestmark = pytest.mark.timeout(60)

# Nothing listens on port 1: every connection is refused at once.
DOWN = "redis://127.0.0.1:1/0?connect_timeout=0.5&socket_timeout=0.5"


def translated(exc: BaseException) -> BackendUnavailable:
    """The BackendUnavailable in ``exc``'s chain of causes, with no driver error above it."""
    seen: BaseException | None = exc
    for _ in range(10):
        assert not isinstance(seen, redis.RedisError), f"untranslated: {seen!r}"
        if isinstance(seen, BackendUnavailable):
            return seen
        assert seen is not None, f"no BackendUnavailable behind {exc!r}"
        seen = seen.__cause__ or seen.__context__
    raise AssertionError(f"no BackendUnavailable behind {exc!r}")


async def test_openai_agents_tool_with_the_store_down() -> None:
    require("agents", "openai-agents")
    from agents import Agent, RunConfig, Runner, function_tool

    from agentlease import openai_agents as al_agents
    from tests.integrations.test_openai_agents import Scripted, call, say

    sent: list[str] = []
    async with al.AsyncIdempotency.connect(DOWN) as keys:

        @function_tool(failure_error_function=None)
        @al_agents.idempotent(store=keys)
        async def send(to: str) -> str:
            sent.append(to)
            return "sent"

        model = Scripted([call("send", {"to": "ada"}, "c1")], [say("done")])
        agent = Agent(name="mailer", model=model, tools=[send])
        with (
            al.idempotency_scope(task_id="run-1"),
            pytest.raises(Exception, match="unavailable") as raised,
        ):
            await Runner.run(agent, "mail ada", run_config=RunConfig(tracing_disabled=True))
    translated(raised.value)
    assert sent == []


async def test_langgraph_tool_with_the_store_down() -> None:
    require("langgraph", "langgraph")
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, StateGraph
    from typing_extensions import TypedDict

    from agentlease import langgraph as alg

    class State(TypedDict, total=False):
        to: str
        receipt: str

    sent: list[str] = []
    async with al.AsyncIdempotency.connect(DOWN) as keys:

        @alg.idempotent(tool="send_email", store=keys)
        async def send_email(to: str) -> str:
            sent.append(to)
            return "receipt"

        async def notify(state: State) -> dict[str, Any]:
            return {"receipt": await send_email(state["to"])}

        graph = StateGraph(State)
        graph.add_node("notify", notify)
        graph.add_edge(START, "notify")
        app = graph.compile(checkpointer=InMemorySaver())
        with pytest.raises(Exception, match="unavailable") as raised:
            await app.ainvoke({"to": "ada"}, {"configurable": {"thread_id": "t-1"}})
    translated(raised.value)
    assert sent == []


def test_langgraph_sync_tool_with_the_store_down() -> None:
    require("langgraph", "langgraph")
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, StateGraph
    from typing_extensions import TypedDict

    from agentlease import langgraph as alg

    class State(TypedDict, total=False):
        to: str
        receipt: str

    sent: list[str] = []
    with al.Idempotency.connect(DOWN) as keys:

        @alg.idempotent(tool="send_email", store=keys)
        def send_email(to: str) -> str:
            sent.append(to)
            return "receipt"

        def notify(state: State) -> dict[str, Any]:
            return {"receipt": send_email(state["to"])}

        graph = StateGraph(State)
        graph.add_node("notify", notify)
        graph.add_edge(START, "notify")
        app = graph.compile(checkpointer=InMemorySaver())
        with pytest.raises(Exception, match="unavailable") as raised:
            app.invoke({"to": "ada"}, {"configurable": {"thread_id": "t-1"}})
    translated(raised.value)
    assert sent == []


async def test_pydantic_ai_tool_with_the_store_down() -> None:
    require("pydantic_ai", "pydantic-ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from agentlease.pydantic_ai import IdempotentTools

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("send_email", {"to": "ada"}, tool_call_id="c1")])

    sent: list[str] = []
    async with al.AsyncIdempotency.connect(DOWN) as keys:
        agent: Agent[None, str] = Agent(FunctionModel(script), capabilities=[IdempotentTools(keys)])

        @agent.tool_plain
        def send_email(to: str) -> str:
            sent.append(to)
            return "sent"

        with (
            al.idempotency_scope(task_id="run-1"),
            pytest.raises(Exception, match="unavailable") as raised,
        ):
            await agent.run("mail ada")
    translated(raised.value)
    assert sent == []
