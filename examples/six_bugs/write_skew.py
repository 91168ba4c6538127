"""Write skew: three parallel branches share one budget; each fits alone, together they overspend.

A team offsite has a budget of 100. Three branch tasks, run by three agents in parallel, each
book one item (hotel 40, flights 50, dinner 30) if it still fits. The broken branch reads what
was spent so far, checks that its cost fits, lets the model draft the booking, then books and
adds its cost: every branch's check is true on its own, and by the time the others add theirs
the sum is 120. The ``spend_within_budget`` checker sees it in what the booking tool spent.

The fixed branch materialises the constraint: it takes its cost from a counter bounded by the
budget, ``agent.state.hold(counter, cost, limit=100)``, before the model turn, and commits the hold
just before it books. Check and spend are one atomic step on one row, so of the branches that fit
alone, the one that would cross the limit is refused (``LimitReached``) and ends done with
"skipped: over budget".

Why a hold committed before the booking: the units must be taken for good before the money can
move. A hold kept across the booking and committed after it (the shape of ``AsyncSpendBudget``,
reserve then settle) gives its units back when its holder dies, and a branch may die just after
its booking landed: the units would come back while the money is spent, and another branch would
spend them again. Committed first, the units stay taken whatever becomes of the booking (a lost
response, a crash), which errs on the safe side. Until then the hold is what a plain
``agent.state.reserve`` is not: a branch that dies or loses its lease during the model turn, having
booked nothing, gives its units back (at once, or when the hold's TTL runs out) instead of
leaking them for good.

The booking service books each client reference once (the agent sends its step's key, the same
in every attempt), as booking APIs do: an attempt that outlived its lease and the retry after it
book once, in both variants. A repeated side effect is another example's bug.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentlease import LimitReached
from agentlease.harness import Agent, Run, Scenario, ToolCall

TRACE = Path(__file__).parent / "traces" / "write_skew.jsonl"
TASKS = {"t1": "hotel", "t2": "flights", "t3": "dinner"}
COSTS = {"hotel": 40, "flights": 50, "dinner": 30}
SCOPE, BUDGET = "offsite", 100
SKIPPED = "skipped: over budget"


def planner(task: str, step: str, request: Any = None) -> Any:
    """The model's plan, as it was recorded: price this branch's item, draft its booking, stop."""
    item = TASKS[task]
    if step == "m1":
        return {"action": "price", "item": item, "cost": COSTS[item]}
    if step == "m2":
        return {"step": "s1", "action": "book", "item": item, "note": f"team offsite: {item}"}
    return {"action": "done"}


def _world(run: Run) -> None:
    booked: dict[str, str] = {}  # client reference -> confirmation

    @run.tool("book")
    def book(call: ToolCall) -> str:
        ref, item = call.args["ref"], call.args["item"]
        if ref not in booked:  # the service books each client reference once
            booked[ref] = f"booked {item}"
            run.history.world(
                "effect", kind="booking", resource=item, task=call.task, step=call.step
            )
            run.history.world("spend", scope=SCOPE, units=COSTS[item], task=call.task)
        return booked[ref]


async def _book(agent: Agent, item: str, draft: Any) -> Any:
    args = {"item": item, "note": draft["note"], "ref": agent.key(draft["step"])}
    return await agent.call("book", args, step=draft["step"])


async def _setup(run: Run) -> None:
    _world(run)
    run.history.world("budget", scope=SCOPE, limit=BUDGET)
    for task in TASKS:
        await run.enqueue("offsite", task)


async def broken(run: Run) -> None:
    """Read what was spent, check the cost fits, think, book, add: a check that goes stale."""
    await _setup(run)
    spent = run.name(f"{SCOPE}:spent")

    async def handler(agent: Agent) -> Any:
        plan = await agent.plan()
        if await agent.state.counter(spent) + plan["cost"] > BUDGET:
            return SKIPPED
        draft = await agent.plan()  # the model drafts the booking; the others book meanwhile
        booked = await _book(agent, plan["item"], draft)
        await agent.state.add(spent, plan["cost"])
        return booked

    await run.agents("offsite", handler, n=3)


async def fixed(run: Run) -> None:
    """Hold the cost on a counter bounded by the budget, think, commit the hold, then book."""
    await _setup(run)
    spent = run.name(f"{SCOPE}:spent")

    async def handler(agent: Agent) -> Any:
        plan = await agent.plan()
        try:
            hold = agent.state.hold(spent, plan["cost"], limit=BUDGET, ttl=run.lease_for)
            async with hold as held:
                draft = await agent.plan()  # a branch that dies here gives its units back
                await held.commit()  # from here they stay spent, whatever becomes of the booking
                return await _book(agent, plan["item"], draft)
        except LimitReached:
            return SKIPPED

    await run.agents("offsite", handler, n=3)


# Delays, reordered responses and freezes decide whose check goes stale; a lost response or
# acknowledgement leaves a booking's outcome unknown; a crash kills a branch holding units.
FAULTS = ("delay", "reorder", "drop_response", "ack_lost", "crash", "freeze", "store_delay")
BROKEN = Scenario("write skew (broken)", broken, trace=TRACE, faults=FAULTS, time_limit=30)
FIXED = Scenario("write skew (fixed)", fixed, trace=TRACE, faults=FAULTS, time_limit=30)
