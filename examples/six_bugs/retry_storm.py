"""Retry storm: agents hammer a failing dependency with retries, multiplying its load.

Tasks arrive one every half lease; each runs one search (the world's ``search`` tool) and stops.
The search service is down from the start of the run for a seeded while (half a lease to two and
a half leases) and answers every request with an error. The team has promised the service at most
``BUDGET`` requests in all (two per task); every request that reaches it is a spend of one unit on
scope ``search``. The broken agent retries every error ten times with a short fixed pause, and
the harness runs a failed task again (three attempts), so one search becomes up to thirty
requests while the service is down: a retry storm. The ``spend_within_budget`` checker sees the
requests cross the promise.

The fixed agent retries with ``agentlease.retry``: full-jitter backoff, a retry budget shared by
every agent through the store (:class:`~agentlease.AsyncRetryBudget`, scoped explicitly to the
search service) and a circuit breaker (:class:`~agentlease.AsyncCircuitBreaker`) that stops
sending requests to a service that keeps failing until one trial after its cooldown succeeds. A
refusal of the breaker sends nothing: the agent waits as long as it says (``retry_after_s``) and
asks again. Running a task again is a retry of its search: that attempt takes a retry from the
same budget before it sends anything (as agentlease's worker does with a budgeted retry policy),
and so does asking again after a refusal once a request has gone out. A task that cannot get
through is dead-lettered with the refusal as its reason (``failed: RetryBudgetExhausted``); a task
that runs after the outage succeeds.

Why the fixed system keeps the promise, whatever the interleaving: a request reaches the service
only as the first request of a task's first attempt (one per task: 6) or after a retry the budget
granted, each grant letting at most one request out. The budget grants a retry while ``retries <
max(RETRIES, 0.1 x calls)``, where calls (the first requests of the runs of the retry loop) are
never more than the 12 requests, so ``0.1 x calls <= 1.2`` and the minimum rules: at most
``RETRIES`` = 6 grants, at most 6 + 6 = 12 requests, within ``BUDGET`` = 12. A request whose
response was dropped, or that landed after its caller gave up, is still one request. The
breaker and the backoff only send fewer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentlease import AsyncCircuitBreaker, AsyncRetryBudget, CircuitOpen, retry
from agentlease.harness import Agent, ResponseLost, Run, Scenario, ToolCall

TRACE = Path(__file__).parent / "traces" / "retry_storm.jsonl"
TASKS = {
    "t1": "leases",
    "t2": "fencing tokens",
    "t3": "idempotency keys",
    "t4": "retry budgets",
    "t5": "circuit breakers",
    "t6": "backoff",
}
SCOPE = "search"
BUDGET = 2 * len(TASKS)  # requests promised to the search service, at most
RETRIES = BUDGET - len(TASKS)  # the fixed system's retries in all: the promise less one per task
TRIES = 10  # the broken agent's tries of one search


class SearchUnavailable(Exception):
    """The search service answered 503 Service Unavailable."""


def planner(task: str, step: str, request: Any = None) -> Any:
    """The model's plan, as it was recorded: search for this task's topic, then stop."""
    if step == "m1":
        return {"step": "s1", "action": "search", "query": TASKS[task]}
    return {"action": "done"}


def _world(run: Run) -> None:
    """The search service: down from the start of the run for a seeded while."""
    back_at = run.now() + run.lease_for * run.rng.uniform(0.5, 2.5)

    @run.tool("search")
    def search(call: ToolCall) -> list[str]:
        run.history.world("spend", scope=SCOPE, units=1, task=call.task, step=call.step)
        if run.now() < back_at:
            raise SearchUnavailable("503 Service Unavailable")
        return [f"{call.args['query']}: result {n}" for n in (1, 2, 3)]


async def _setup(run: Run) -> None:
    _world(run)
    run.history.world("budget", scope=SCOPE, limit=BUDGET)
    for n, task in enumerate(TASKS):  # one task arrives every half lease
        await run.enqueue("research", task, delay=n * run.lease_for / 2)


async def broken(run: Run) -> None:
    """Retry every error at once, with a short fixed pause: no backoff, budget or breaker."""
    await _setup(run)

    async def handler(agent: Agent) -> Any:
        plan = await agent.plan()
        for n in range(1, TRIES + 1):
            try:
                hits = await agent.call("search", {"query": plan["query"]}, step=plan["step"])
                break
            except (SearchUnavailable, ResponseLost):
                if n == TRIES:
                    raise
                await run.sleep(run.lease_for / 20)
        await agent.plan()
        return hits

    await run.agents("research", handler, n=3)


async def fixed(run: Run) -> None:
    """Retry with agentlease.retry: jittered backoff, a shared retry budget, a circuit breaker."""
    await _setup(run)
    clients: dict[str, Any] = {}  # each agent process has its own clients, as it would

    def guard(process: str) -> Any:
        if process not in clients:
            budget = AsyncRetryBudget(run.state, scope=run.name(SCOPE), ratio=0.1, minimum=RETRIES)
            breaker = AsyncCircuitBreaker(
                run.state,
                run.name(SCOPE),
                threshold=3,
                cooldown=run.lease_for / 2,
                staleness=run.lease_for / 20,
                tool="search",
            )
            retrying = retry(
                on=(SearchUnavailable, ResponseLost),
                attempts=4,
                base=run.lease_for / 20,
                cap=run.lease_for / 4,
                budget=budget,
                breaker=breaker,
                rand=run.rng,
            )
            clients[process] = budget, retrying
        return clients[process]

    async def handler(agent: Agent) -> Any:
        plan = await agent.plan()
        budget, retrying = guard(agent.process)
        owed = agent.attempt > 1  # running the task again retries its search
        while True:
            if owed:
                await budget.acquire_retry()
                owed = False
            try:
                async for attempt in retrying:
                    async with attempt:
                        owed = True  # a request goes out: asking again after it is a retry
                        hits = await agent.call(
                            "search", {"query": plan["query"]}, step=plan["step"]
                        )
                break
            except CircuitOpen as refused:  # the breaker says when to ask again: wait till then
                await run.sleep(max(refused.retry_after_s or 0.0, run.lease_for / 20))
                await agent.heartbeat()
        await agent.plan()
        return hits

    await run.agents("research", handler, n=3)


FAULTS = ("delay", "drop_response", "ack_lost")
BROKEN = Scenario("retry storm (broken)", broken, trace=TRACE, faults=FAULTS, time_limit=30)
FIXED = Scenario("retry storm (fixed)", fixed, trace=TRACE, faults=FAULTS, time_limit=30)
