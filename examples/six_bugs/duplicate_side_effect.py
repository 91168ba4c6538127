"""Duplicate side effect: a retried or resumed charge bills the customer twice.

Each agent charges one order through the payments service (the world's ``charge`` tool), then
stops. The broken agent retries the call when its response times out, as most code does: but a
timeout does not say the charge failed, only that its answer was lost, so the retry charges again.
A duplicated delivery, a request that lands after its caller gave up (and retried), or a process
killed after the charge (its task is reclaimed and run again) does the same. The ``created_once``
checker sees the step's second charge.

The fixed system names each charge with an idempotency key, the step's key (``agent.key(step)``,
the same in every attempt of the task), and the charge endpoint honours it with agentlease's
:class:`~agentlease.AsyncIdempotency`, as Stripe honours an ``Idempotency-Key``: the first request
with a key charges and records the receipt; any later one with that key gets the recorded receipt
back, and one that arrives while the first is still in flight is refused with
:class:`~agentlease.DuplicateInFlight`, which the agent waits out and asks again. The guard has to
live at the endpoint: a duplicated delivery or a late request never passes through the agent
again, so a guard in the agent alone would miss them. The agent may then retry freely.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from agentlease import AsyncIdempotency, DuplicateInFlight, IdempotencySettings
from agentlease.harness import Agent, ResponseLost, Run, Scenario, ToolCall

TRACE = Path(__file__).parent / "traces" / "duplicate_side_effect.jsonl"
TASKS = {
    "t1": {"order": "o1", "amount": 1200},
    "t2": {"order": "o2", "amount": 450},
    "t3": {"order": "o3", "amount": 3000},
}
TRIES = 3  # calls of one charge per attempt of the task, before the attempt gives up
AGENTS = 3  # a killed agent process is replaced, as its supervisor would


def planner(task: str, step: str, request: Any = None) -> Any:
    """The model's plan, as it was recorded: charge this task's order, then stop."""
    if step == "m1":
        return {"step": "s1", "action": "charge", **TASKS[task]}
    return {"action": "done"}


def _world(run: Run, keys: AsyncIdempotency | None) -> None:
    """The payments service; with ``keys``, its charge endpoint honours idempotency keys."""
    ids = itertools.count(1)

    def charge_now(call: ToolCall) -> dict[str, Any]:
        charge = f"ch_{next(ids)}"
        run.history.world("effect", kind="charge", resource=charge, step=call.step, task=call.task)
        return {"charge": charge, "order": call.args["order"], "amount": call.args["amount"]}

    @run.tool("charge")
    async def charge(call: ToolCall) -> dict[str, Any]:
        key = call.args.get("idempotency_key")
        if keys is None or key is None:
            return charge_now(call)

        async def once() -> dict[str, Any]:
            return charge_now(call)

        order = {"order": call.args["order"], "amount": call.args["amount"]}
        # Raises DuplicateInFlight while an earlier request with this key is being charged.
        done = await keys.call(once, tool="charge", args=order, key=run.name(f"charge/{key}"))
        return done.value


async def _setup(run: Run, keys: AsyncIdempotency | None) -> None:
    _world(run, keys)
    for task in TASKS:
        await run.enqueue("orders", task)


async def broken(run: Run) -> None:
    """Charge; when the response times out, charge again (the naive retry)."""
    await _setup(run, None)

    async def handler(agent: Agent) -> Any:
        plan = await agent.plan()
        args = {"order": plan["order"], "amount": plan["amount"]}
        lost = 0
        while True:
            try:
                receipt = await agent.call("charge", args, step=plan["step"])
                break
            except ResponseLost:  # it may have charged: the retry charges again
                lost += 1
                if lost == TRIES:
                    raise
        await agent.plan()
        return receipt

    await run.agents("orders", handler, n=AGENTS)


class _Borrowed:
    """The run's store, lent to the payments service: its ``close`` leaves the store open."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def close(self) -> None:
        pass


async def fixed(run: Run) -> None:
    """Charge with the step's idempotency key, which the charge endpoint honours; then retry."""
    # The reservation of a key outlives any request, so only a holder that died waits it out.
    settings = IdempotencySettings(hold_for=run.lease_for * 5)
    keys = AsyncIdempotency(_Borrowed(run.backend), settings=settings)
    await _setup(run, keys)

    async def handler(agent: Agent) -> Any:
        plan = await agent.plan()
        key = agent.key(plan["step"])  # the same in every attempt of this task
        args = {"order": plan["order"], "amount": plan["amount"], "idempotency_key": key}
        lost = 0
        while True:
            try:
                receipt = await agent.call("charge", args, step=plan["step"])
                break
            except ResponseLost:  # safe now: a repeat with the key gets the first receipt
                lost += 1
                if lost == TRIES:
                    raise  # a later attempt of the task asks again, with the same key
            except DuplicateInFlight as busy:
                # An earlier request with this key is being charged: ask again once it is not.
                await run.sleep(min(busy.retry_after, run.lease_for / 20))
        await agent.plan()
        return receipt

    try:
        await run.agents("orders", handler, n=AGENTS)
    finally:
        await keys.close()  # the service shuts down; the run's store stays open


FAULTS = ("delay", "duplicate", "drop_response", "ack_lost", "crash", "freeze")
BROKEN = Scenario(
    "duplicate side effect (broken)", broken, trace=TRACE, faults=FAULTS, time_limit=30
)
FIXED = Scenario("duplicate side effect (fixed)", fixed, trace=TRACE, faults=FAULTS, time_limit=30)
