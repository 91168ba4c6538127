"""Context divergence: two research branches find different addresses; the shipper picks one.

An order fans out into two research branches, run in parallel by different agents: one looks
the customer's shipping address up in the CRM, the other in billing. Meanwhile the customer
moves: another task changes the address in the world, whose record carries a version that each
change bumps. Both tools read the record as it is when the call runs, so a lookup that was
delayed, or retried after its response was lost, sees the new address while the other branch
saw the old one. The broken branches each write their finding straight into the order's shared
context: the last writer wins, and the shipper ships to whichever response came back last. The
``facts_agree`` checker sees it: two branches asserted different addresses into one context.
The fixed branches return typed facts (:class:`agentlease.Fact`, with the version they read) to
the order's :class:`agentlease.AsyncFactBoard`, and the shipping step, started by whichever
branch reports last, reconciles them in code (:class:`agentlease.LatestByVersion`): only the
merged address enters the context, and only once (a branch whose agent froze and whose task ran
again later may find a newer address; it changes the board, not what the order shipped to).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentlease import AsyncFactBoard, ConflictError, Fact, LatestByVersion, reconcile
from agentlease.harness import Agent, Run, Scenario, ToolCall

TRACE = Path(__file__).parent / "traces" / "context_divergence.jsonl"
TASKS = {"crm": "crm", "billing": "billing", "move": "9 Elm Street", "ship": "order-7"}
BRANCHES = ("crm", "billing")
ORDER = TASKS["ship"]
QUEUE = "orders"


def planner(task: str, step: str, request: Any = None) -> Any:
    """The model's plan, as it was recorded: one step for each task, then stop."""
    if step != "m1":
        return {"action": "done"}
    if task in BRANCHES:
        return {"step": "s1", "action": "lookup", "tool": TASKS[task]}
    if task == "move":
        return {"step": "s1", "action": "move", "address": TASKS[task]}
    return {"step": "s1", "action": "ship", "order": TASKS[task]}


def _world(run: Run) -> None:
    customer: dict[str, Any] = {"address": "1 Oak Lane", "version": 1}
    shipped: dict[str, str] = {}

    def lookup(call: ToolCall) -> dict[str, Any]:  # what the record holds when the call runs
        return dict(customer)

    run.tool("crm")(lookup)
    run.tool("billing")(lookup)

    @run.tool("move")
    def move(call: ToolCall) -> int:
        if customer["address"] != call.args["address"]:
            customer.update(address=call.args["address"], version=customer["version"] + 1)
        return int(customer["version"])

    @run.tool("ship")
    def ship(call: ToolCall) -> str:
        order = call.args["order"]
        if order not in shipped:  # the carrier dedupes on the order, its idempotency key
            shipped[order] = call.args["address"]
            run.history.world(
                "effect",
                kind="shipment",
                resource=order,
                task=call.task,
                step=call.step,
                address=call.args["address"],
            )
        return shipped[order]


async def _setup(run: Run) -> None:
    _world(run)
    # Two agents: the move is claimed once a branch is done, so without a fault (a slow or lost
    # lookup, a frozen agent) both branches read the same address.
    for task in ("crm", "billing", "move"):
        await run.enqueue(QUEUE, task)


async def _reported(run: Run, branch: str) -> None:
    """Mark ``branch`` as reported; whichever branch reports last starts the shipping task."""
    key = run.name(f"{ORDER}:reported")
    await run.state.set_field(key, branch, True)
    if set(BRANCHES) <= set((await run.state.get(key)).value):
        await run.enqueue(QUEUE, "ship")  # the task's id is its name: a second enqueue is a no-op


def _fact(run: Run, value: Any, branch: str, step: str, evidence: Any) -> None:
    """Record a value entering the order's shared context."""
    fact = Fact(field="address", value=value, source=branch, step=step, evidence=evidence)
    run.history.fact(fact, scope=ORDER)


async def broken(run: Run) -> None:
    """Each branch writes its finding straight into the shared context: last writer wins."""
    await _setup(run)
    context = run.name(f"{ORDER}:context")

    async def handler(agent: Agent) -> Any:
        plan = await agent.plan()
        step = plan["step"]
        if plan["action"] == "move":
            await agent.call("move", {"address": plan["address"]}, step=step)
        elif plan["action"] == "lookup":
            found = await agent.call(plan["tool"], {"order": ORDER}, step=step)
            await run.state.set_field(context, "address", found["address"])
            evidence = {"tool": plan["tool"], "version": found["version"]}
            _fact(run, found["address"], agent.task, step, evidence)
            await _reported(run, agent.task)
        else:
            address = (await run.state.get(context)).value["address"]
            await agent.call("ship", {"order": plan["order"], "address": address}, step=step)
        return await agent.plan()

    await run.agents(QUEUE, handler, n=2)


async def fixed(run: Run) -> None:
    """Branches contribute typed facts; the shipping step reconciles them by version and enters
    the result into the context once."""
    await _setup(run)
    context = run.name(f"{ORDER}:context")
    board = AsyncFactBoard(run.state, scope=run.name(ORDER))

    async def handler(agent: Agent) -> Any:
        plan = await agent.plan()
        step = plan["step"]
        if plan["action"] == "move":
            await agent.call("move", {"address": plan["address"]}, step=step)
        elif plan["action"] == "lookup":
            found = await agent.call(plan["tool"], {"order": ORDER}, step=step)
            await board.add(
                Fact(
                    field="address",
                    value=found["address"],
                    source=agent.task,
                    step=step,
                    evidence={"tool": plan["tool"], "version": found["version"]},
                    version=found["version"],
                )
            )
            await _reported(run, agent.task)
        else:
            facts = await board.facts()
            address = reconcile(facts, {"address": LatestByVersion()})["address"]
            try:  # the merged value enters the context once; a retry ships what is there
                await run.state.compare_and_set(context, 0, {"address": address})
            except ConflictError:
                address = (await run.state.get(context)).value["address"]
            else:
                merged = {f.source: f.version for f in facts}
                _fact(run, address, "reconciled", step, {"policy": "latest by version", **merged})
            await agent.call("ship", {"order": plan["order"], "address": address}, step=step)
        return await agent.plan()

    await run.agents(QUEUE, handler, n=2)


FAULTS = ("delay", "reorder", "drop_response", "freeze")
BROKEN = Scenario("context divergence (broken)", broken, trace=TRACE, faults=FAULTS, time_limit=60)
FIXED = Scenario("context divergence (fixed)", fixed, trace=TRACE, faults=FAULTS, time_limit=60)
