"""Lost update: two agents add to one shared cart; one addition vanishes.

Each agent reads the cart, asks the pricing tool for its item's price, and writes the cart back
with its item added. The broken agent writes back over whatever the cart holds by then, based on
what it read before the (slow) price lookup: when the other agent's write lands in between, that
write is lost. The ``monotonic`` checker sees it: the broken write moved the cart from a version
that was no longer current. The fixed agent writes with compare-and-set on the version it read,
and on a conflict re-reads and re-applies its change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentlease import ConflictError
from agentlease.harness import Agent, Run, Scenario, ToolCall

TRACE = Path(__file__).parent / "traces" / "lost_update.jsonl"
TASKS = {"t1": "apple", "t2": "pear", "t3": "fig"}
PRICES = {"apple": 3, "pear": 4, "fig": 7}
CART = "cart"


def planner(task: str, step: str, request: Any = None) -> Any:
    """The model's plan, as it was recorded: add this task's item to the cart, then stop."""
    if step == "m1":
        return {"step": "s1", "action": "add", "item": TASKS[task]}
    return {"action": "done"}


def _world(run: Run) -> None:
    @run.tool("price")
    def price(call: ToolCall) -> int:
        return PRICES[call.args["item"]]


async def _setup(run: Run) -> None:
    _world(run)
    for task in TASKS:
        await run.enqueue("carts", task)


async def broken(run: Run) -> None:
    """Read, look up the price, write back: a blind write over what the cart holds by then."""
    await _setup(run)
    key = run.name(CART)

    async def handler(agent: Agent) -> Any:
        plan = await agent.plan()
        read = await agent.state.get(key)
        price = await agent.call("price", {"item": plan["item"]}, step=plan["step"])
        items = [*read.value.get("items", []), {"item": plan["item"], "price": price}]
        current = await agent.state.get(key)  # the naive write: whatever version is there now
        version = await agent.state.compare_and_set(key, current.version, {"items": items})
        run.history.world("transition", key=CART, **{"from": read.version, "to": version})
        return await agent.plan()

    await run.agents("carts", handler, n=2)


async def fixed(run: Run) -> None:
    """Compare-and-set on the version read; on a conflict, re-read and re-apply."""
    await _setup(run)
    key = run.name(CART)

    async def handler(agent: Agent) -> Any:
        plan = await agent.plan()
        read = await agent.state.get(key)
        price = await agent.call("price", {"item": plan["item"]}, step=plan["step"])
        while True:
            items = [*read.value.get("items", []), {"item": plan["item"], "price": price}]
            try:
                version = await agent.state.compare_and_set(key, read.version, {"items": items})
            except ConflictError:
                read = await agent.state.get(key)
                continue
            run.history.world("transition", key=CART, **{"from": read.version, "to": version})
            return await agent.plan()

    await run.agents("carts", handler, n=2)


FAULTS = ("delay", "reorder", "drop_response")
BROKEN = Scenario("lost update (broken)", broken, trace=TRACE, faults=FAULTS, time_limit=30)
FIXED = Scenario("lost update (fixed)", fixed, trace=TRACE, faults=FAULTS, time_limit=30)
