"""Deadlock: two transfers lock the same two accounts in opposite orders and wait for ever.

Each task moves money between two accounts (t1: A to B, t2: B to A, t3: A to C) through the
bank's ``post`` tool, holding a lock on both accounts while it does. The broken agent locks the
accounts one at a time, in the order the plan names them, and asks the model to confirm the
transfer while it holds the first: t1 holds A and waits for B, t2 holds B and waits for A, and
neither lock's timeout (an hour) nor its TTL (renewed while held) ends the wait. The agent that
needs A for t3 queues behind them. The run's time limit stops it, and the ``completions``
checker reports the tasks that never ended. Short of a deadlock, a lock held across a model
turn does harm too: a holder frozen in the model turn keeps its lock after its task was
dead-lettered (``locks_released``), and the others queue behind it meanwhile.

The fixed agent asks the model first, then takes both locks as one lock set,
``agent.state.locks([a, b], timeout=..., ttl=...)``: sorted canonically whatever order the plan
names them in, all or nothing, within a timeout well inside the lease, with a TTL renewed while
held. It holds them only for the posting, never across a model turn. A lock set that cannot be
had in time raises ``LockTimeout``, which fails the attempt; the harness retries it. The TTL is
half the task's lease: when the holder is killed, its renewals stop, and its locks must be free
before its task's lease runs out and the task is run again or dead-lettered. (With a TTL as long
as the lease, the harness found a killed holder's lock still taken after its task was
dead-lettered.)

The bank posts each client reference once (the agent sends its step's key, the same in every
attempt), as payment APIs do: an attempt that outlived its lease waiting for a lock and the
retry after it post once, in both variants. A repeated side effect is another example's bug.

Each ``lock`` op is invoked when the agent starts waiting and ends ok when the lock is taken, so
the history shows who waits for what; the owner recorded is the agent process and its attempt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agentlease import AsyncLockSet
from agentlease.harness import Agent, Run, Scenario, ToolCall

TRACE = Path(__file__).parent / "traces" / "deadlock.jsonl"
TASKS = {"t1": ("A", "B", 30), "t2": ("B", "A", 20), "t3": ("A", "C", 10)}
OPENING = {"A": 100, "B": 100, "C": 100}
FOREVER = 3600.0  # the naive lock timeout: an hour


def planner(task: str, step: str, request: Any = None) -> Any:
    """The model's plan, as it was recorded: the transfer, then its confirmation, then stop."""
    source, target, amount = TASKS[task]
    if step == "m1":
        return {"action": "transfer", "from": source, "to": target, "amount": amount}
    if step == "m2":
        return {"step": "s1", "action": "post", "memo": f"{task}: {amount} from {source}"}
    return {"action": "done"}


def _world(run: Run) -> None:
    balances = dict(OPENING)
    posted: set[str] = set()  # client references of the transfers posted

    @run.tool("post")
    def post(call: ToolCall) -> dict[str, int]:
        source, target, amount = call.args["from"], call.args["to"], call.args["amount"]
        if call.args["ref"] not in posted:  # the bank posts each client reference once
            posted.add(call.args["ref"])
            balances[source] -= amount
            balances[target] += amount
            transfer = f"{source}->{target}:{amount}"
            run.history.world(
                "effect", kind="transfer", resource=transfer, task=call.task, step=call.step
            )
        return {source: balances[source], target: balances[target]}


async def _setup(run: Run) -> None:
    _world(run)
    for task in TASKS:
        await run.enqueue("transfers", task)


@asynccontextmanager
async def _locked(
    run: Run, agent: Agent, accounts: Iterable[str], *, timeout: float, ttl: float = 30.0
) -> AsyncIterator[AsyncLockSet]:
    """Hold the accounts' locks as one lock set, recording the wait (``lock`` invoked), each
    lock taken (``lock`` ok) and each released (``unlock``)."""
    locks = [f"account:{a}" for a in sorted(set(accounts))]
    who = {"owner": f"{agent.process}#{agent.attempt}", "task": agent.task}
    waits = [run.history.invoke(agent.process, "lock", lock=lock, ttl=ttl, **who) for lock in locks]
    held = agent.state.locks([run.name(lock) for lock in locks], timeout=timeout, ttl=ttl)
    try:
        async with held:
            for wait in waits:
                wait.ok()
            yield held
    finally:
        for lock, wait in zip(locks, waits, strict=True):
            if held.tokens:  # taken, and released on leaving the block
                run.history.record(agent.process, "ok", "unlock", lock=lock, **who)
            else:
                wait.fail()


async def _post(agent: Agent, plan: Any, confirmed: Any) -> Any:
    args = {"from": plan["from"], "to": plan["to"], "amount": plan["amount"]}
    args |= {"memo": confirmed["memo"], "ref": agent.key(confirmed["step"])}
    return await agent.call("post", args, step=confirmed["step"])


async def broken(run: Run) -> None:
    """Lock the accounts one at a time in the plan's order, with a model turn in between."""
    await _setup(run)

    async def handler(agent: Agent) -> Any:
        plan = await agent.plan()
        async with _locked(run, agent, [plan["from"]], timeout=FOREVER):
            confirmed = await agent.plan()  # the model confirms while the source is locked
            async with _locked(run, agent, [plan["to"]], timeout=FOREVER):
                return await _post(agent, plan, confirmed)

    await run.agents("transfers", handler, n=3)


async def fixed(run: Run) -> None:
    """Plan first; then lock both accounts as one set, with a timeout; post; release."""
    await _setup(run)

    async def handler(agent: Agent) -> Any:
        plan = await agent.plan()
        confirmed = await agent.plan()
        accounts = [plan["from"], plan["to"]]
        timeout, ttl = run.lease_for / 4, run.lease_for / 2
        async with _locked(run, agent, accounts, timeout=timeout, ttl=ttl):
            return await _post(agent, plan, confirmed)

    await run.agents("transfers", handler, n=3)


# Delays and freezes decide who waits for whom, and for how long; a crash kills a holder, whose
# locks its TTL frees.
FAULTS = ("delay", "freeze", "crash", "store_delay")
BROKEN = Scenario("deadlock (broken)", broken, trace=TRACE, faults=FAULTS, time_limit=30)
FIXED = Scenario("deadlock (fixed)", fixed, trace=TRACE, faults=FAULTS, time_limit=30)
