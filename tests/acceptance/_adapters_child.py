"""The worker processes of tests/acceptance/test_adapters_processes.py.

    python -m tests.acceptance._adapters_child FRAMEWORK URL LEDGER QUEUE FLAGS HOLD_FOR FAULT

An :class:`agentlease.AsyncWorker` whose handler runs one agent run per task, on the OpenAI
Agents SDK (``openai``: :func:`agentlease.openai_agents.agent_handler` and an
``@function_tool @openai_agents.idempotent`` tool) or on Pydantic AI (``pydantic``: an ``Agent``
with :class:`agentlease.pydantic_ai.IdempotentTools`). The model is scripted as a recorded one
replays: for the task ``T`` it asks for ``charge(order=T, amount=42)`` with the call id
``call-T`` on its first turn, and on its second turn answers with the tool's output, verbatim.

The tool's side effect is a line in the shared ledger (see
:class:`tests.acceptance._idempotency_child.Ledger`: one ``os.write`` on an ``O_APPEND``
descriptor, whole even if its process is SIGKILLed right after), carrying the action's key and
fencing number as a downstream would receive them.

Tasks enqueued with ``{"fault": true}`` misbehave once (the first process to get there creates
``FLAGS/<task>`` with ``O_EXCL``, so exactly one run does), as ``FAULT`` says:

- ``kill``: the model blocks on its second turn, after the tool's outcome is recorded and before
  the run completes, for the test to SIGKILL the worker there;
- ``stop``: the tool stops its own process (SIGSTOP) after reserving its key and before acting;
  resumed by the test (SIGCONT) long after, it acts late, with its old fencing number.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import agentlease as al
from agentlease._scope import current_scope
from tests.acceptance._idempotency_child import Ledger

# The task lease: short, so a killed or frozen worker's task is reaped within a second.
LEASE = 1.0
ORDER_AMOUNT = 42
# How long the ``kill`` fault blocks (the test kills the process long before).
BLOCK = 60.0


class Faults:
    """The one misbehaviour of each faulty task, shared by the processes through flag files."""

    def __init__(self, ledger: Ledger, flags: Path, fault: str) -> None:
        self.ledger = ledger
        self.flags = flags
        self.fault = fault

    def _first(self, task: str) -> bool:
        try:
            fd = os.open(self.flags / task, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    async def second_turn(self, task: str, faulty: bool) -> None:
        """Block here (``kill``) once per faulty task: the tool has acted and its outcome is
        recorded, the run has not completed."""
        if self.fault == "kill" and faulty and self._first(task):
            self.ledger.write("blocked", task=task, attempt=current_scope().attempt)
            await asyncio.sleep(BLOCK)
            raise RuntimeError("the test should have killed this worker by now")

    def in_tool(self, task: str, faulty: bool) -> None:
        """Freeze here (``stop``) once per faulty task: the key is reserved, nothing done."""
        if self.fault == "stop" and faulty and self._first(task):
            self.ledger.write("frozen", task=task, key=al.current_key(), fence=al.current_fence())
            os.kill(os.getpid(), signal.SIGSTOP)
            self.ledger.write("resumed", task=task)


def charge(ledger: Ledger, faults: Faults, order: str, amount: int, faulty: bool) -> str:
    """The side effect: a ledger line with the key and fencing number a downstream would be
    given; the result names the process that acted."""
    scope = current_scope()
    assert scope.task_id is not None, "the worker sets the task as the scope"
    faults.in_tool(scope.task_id, faulty)
    value = {
        "order": order,
        "amount": amount,
        "pid": os.getpid(),
        "attempt": scope.attempt,
        "key": al.current_key(),
        "fence": al.current_fence(),
    }
    ledger.write("effect", task=scope.task_id, **value)
    return json.dumps(value, sort_keys=True)


# -- OpenAI Agents SDK ----------------------------------------------------------------------------


def openai_handler(
    keys: al.AsyncIdempotency, ledger: Ledger, faults: Faults
) -> Callable[[al.AsyncJobContext], Awaitable[al.JSON]]:
    from agents import Agent, RunConfig, function_tool
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    from agentlease import openai_agents

    faulty: set[str] = set()

    @function_tool
    @openai_agents.idempotent(store=keys)
    async def charge_order(order: str, amount: int) -> str:
        """Charge an order.

        Args:
            order: the order.
            amount: the amount.
        """
        return charge(ledger, faults, order, amount, current_scope().task_id in faulty)

    class Replaying(Model):
        """Asks for the same call (same id) for a task every time, as a recorded model does."""

        async def get_response(  # type: ignore[override]
            self, system_instructions: str | None, input: Any, *args: Any, **kwargs: Any
        ) -> ModelResponse:
            task = current_scope().task_id
            assert task is not None
            outputs = [
                item["output"]
                for item in (input if isinstance(input, list) else [])
                if isinstance(item, dict) and item.get("type") == "function_call_output"
            ]
            if not outputs:
                ask = ResponseFunctionToolCall(
                    type="function_call",
                    name="charge_order",
                    arguments=json.dumps({"order": task, "amount": ORDER_AMOUNT}),
                    call_id=f"call-{task}",
                    id=f"fc-{task}",
                    status="completed",
                )
                return ModelResponse(output=[ask], usage=Usage(), response_id=None)
            await faults.second_turn(task, task in faulty)
            text = ResponseOutputText(type="output_text", text=outputs[0], annotations=[])
            answer = ResponseOutputMessage(
                id=f"msg-{task}",
                type="message",
                role="assistant",
                status="completed",
                content=[text],
            )
            return ModelResponse(output=[answer], usage=Usage(), response_id=None)

        async def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    agent = Agent(name="billing", model=Replaying(), tools=[charge_order])
    run = openai_agents.agent_handler(
        agent,
        input_from=lambda payload: f"charge the order of {payload}",
        run_config=RunConfig(tracing_disabled=True),
    )

    async def handler(ctx: al.AsyncJobContext) -> al.JSON:
        payload = ctx.payload
        assert isinstance(payload, dict)
        if payload.get("fault"):
            faulty.add(ctx.task_id)
        return await run(ctx)

    return handler


# -- Pydantic AI ----------------------------------------------------------------------------------


def pydantic_handler(
    keys: al.AsyncIdempotency, ledger: Ledger, faults: Faults
) -> Callable[[al.AsyncJobContext], Awaitable[al.JSON]]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from agentlease.pydantic_ai import IdempotentTools

    faulty: set[str] = set()

    async def replaying(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        task = current_scope().task_id
        assert task is not None
        returns = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returns:
            ask = ToolCallPart(
                "charge_order",
                {"order": task, "amount": ORDER_AMOUNT},
                tool_call_id=f"call-{task}",
            )
            return ModelResponse(parts=[ask])
        await faults.second_turn(task, task in faulty)
        return ModelResponse(parts=[TextPart(str(returns[0]))])

    agent: Agent[None, str] = Agent(FunctionModel(replaying), capabilities=[IdempotentTools(keys)])

    @agent.tool_plain
    async def charge_order(order: str, amount: int) -> str:
        return charge(ledger, faults, order, amount, current_scope().task_id in faulty)

    async def handler(ctx: al.AsyncJobContext) -> al.JSON:
        payload = ctx.payload
        assert isinstance(payload, dict)
        if payload.get("fault"):
            faulty.add(ctx.task_id)
        result = await agent.run(f"charge the order of {payload}")
        return {"final_output": result.output}

    return handler


# -- the worker -----------------------------------------------------------------------------------


async def serve(
    framework: str,
    url: str,
    ledger_path: str,
    queue_name: str,
    flags: str,
    hold_for: str,
    fault: str,
) -> int:
    ledger = Ledger(ledger_path)
    faults = Faults(ledger, Path(flags), fault)

    def on_event(event: al.Event) -> None:
        if event.name in ("lease_lost", "zombie_rejected", "reaped"):
            ledger.write(event.name, task=event.task_id, attempt=event.attempt)

    settings = al.IdempotencySettings(hold_for=float(hold_for))
    async with (
        al.AsyncIdempotency.connect(url, settings=settings) as keys,
        al.AsyncQueue.connect(
            url, settings=al.QueueSettings(lease_for=LEASE), on_event=on_event
        ) as queue,
    ):
        build = {"openai": openai_handler, "pydantic": pydantic_handler}[framework]
        inner = build(keys, ledger, faults)

        async def handler(ctx: al.AsyncJobContext) -> al.JSON:
            ledger.write("start", task=ctx.task_id, attempt=ctx.attempt)
            try:
                result = await inner(ctx)
            except BaseException as exc:
                ledger.write("raised", task=ctx.task_id, attempt=ctx.attempt, error=repr(exc))
                raise
            ledger.write("returned", task=ctx.task_id, attempt=ctx.attempt, result=result)
            return result

        worker = al.AsyncWorker(
            queue,
            queue_name,
            handler,
            settings=al.WorkerSettings(
                poll_interval=0.1, shutdown_grace=5.0, retry=al.RetryPolicy(base=0.05)
            ),
        )
        ledger.write("ready")
        await worker.run()
    ledger.write("exit")
    ledger.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(serve(*sys.argv[1:])))
