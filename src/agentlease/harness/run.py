"""One run of a scenario: a seed, a store, agents leasing tasks, faults, a history, a verdict.

A :class:`Scenario` names the system under test: an ``async def system(run)`` that enqueues
tasks, registers the simulated world's tools and starts agents (:meth:`Run.agents`), each of
which asks the replayed model for its plan (:meth:`Agent.plan`) and calls tools
(:meth:`Agent.call`). The harness owns the agent loop: claim with a lease, heartbeat between
steps, complete or fail fenced by the lease, with the process faults (crash, freeze) at the
points a real process would suffer them. After the run the checkers read the history.

On ``memory://`` a run is in virtual time (:mod:`agentlease.harness._virtual`): the same seed
replays the same interleaving and verdict, and leases of seconds cost nothing. On SQLite, Redis
and PostgreSQL a run is in real time, in names of its own (a prefix per run), so runs of many
seeds share one store; the fault schedule is the same, the interleaving is the machine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from agentlease._async.queue import AsyncQueue
from agentlease._async.state import AsyncSharedState
from agentlease._records import Job
from agentlease._settings import QueueSettings
from agentlease.backends import connect_async
from agentlease.errors import BackendUnavailable, InvalidInput, LeaseLost, PlanDiverged
from agentlease.harness._virtual import VirtualClock, run_virtual
from agentlease.harness.checkers import CHECKERS, Checker, Violation, check
from agentlease.harness.faults import (
    KINDS,
    Faults,
    FaultyBackend,
    ProcessGate,
    ToolCall,
    ToolRuntime,
)
from agentlease.harness.faults import current_process as _process
from agentlease.harness.history import History
from agentlease.harness.trace import ReplayModel, Trace

__all__ = ["Agent", "Outcome", "Run", "Scenario", "run_seed"]

System = Callable[["Run"], Awaitable[None]]
Handler = Callable[["Agent"], Awaitable[Any]]
_TERMINAL = ("done", "dead", "cancelled")
_RUN_IDS = itertools.count()
# How the current agent process is restarted after a crash (its supervisor).
_restart: contextvars.ContextVar[Callable[[], None]] = contextvars.ContextVar(
    "agentlease_harness_restart"
)


@dataclass(frozen=True)
class Scenario:
    """A system under test and how to run it.

    Attributes:
        name: how it is named in reports.
        system: ``async def system(run: Run) -> None``.
        trace: the recorded trace whose model responses the agents replay (the plan, pinned).
        faults: the fault kinds the seed may draw from.
        time_limit: run-clock seconds after which the run is stopped (its unfinished tasks are
            then reported by the ``completions`` checker).
        checkers: the checkers to run (default: all).
        spec: ``path/to/file.py:NAME`` or ``module:NAME`` naming this scenario, for replay
            commands and worker processes.
    """

    name: str
    system: System
    trace: Path | None = None
    faults: Collection[str] = KINDS
    time_limit: float = 60.0
    checkers: Mapping[str, Checker] | None = None
    spec: str | None = None


@dataclass
class Outcome:
    """What one run found."""

    scenario: str
    seed: int
    store: str
    violations: list[Violation]
    fired: list[str]
    history: History
    elapsed: float
    virtual: bool
    only: list[str] | None = None
    error: str | None = None

    @property
    def failed(self) -> bool:
        """A violation was found (or the system under test crashed the run)."""
        return bool(self.violations) or self.error is not None


class Agent:
    """One attempt of one task, as the agent running it sees it.

    Attributes:
        task: the task's name in the scenario (``t1``).
        attempt: the lease's fencing number (1 on the first claim, +1 on each).
        payload: the task's payload.
        process: the simulated process running it.
        lease: the lease (pass ``lease.attempt`` as a fence to fenced writes).
        state, queue: this process's own clients of the store. Use them for anything that
            renews in the background (lock sets, counter holds): a killed process's renewals
            stop, a frozen one's wait, as they would in a real process.
    """

    def __init__(self, run: Run, job: Job, task: str, payload: Any, process: str) -> None:
        self.run, self.job, self.task, self.payload, self.process = run, job, task, payload, process
        self.lease = job.lease
        self.attempt = job.lease.attempt
        self.queue, self.state = run._clients(process)
        self._model_calls = 0
        self._beats = 0

    def key(self, step: str) -> str:
        """The idempotency key of one step of this task: the same in every attempt."""
        return f"{self.task}/{step}"

    async def plan(self, request: Any = None) -> Any:
        """The next model response of this attempt, replayed from the trace.

        Each attempt replays the task's plan from its first step (``m1``, ``m2``, ...). A model
        turn takes time (a seeded think time), and the agent heartbeats before it, as an agent
        renews its lease between turns, so a freeze strikes here.

        Raises:
            PlanDiverged: the system asked for a response the trace does not hold.
            LeaseLost: the lease was reaped while the process was frozen.
        """
        self._model_calls += 1
        run = self.run
        if run.model is None:
            raise InvalidInput(f"scenario {run.scenario.name!r} has no trace to replay")
        await self.heartbeat()
        step = f"m{self._model_calls}"
        key = f"{self.task}/{step}/{self.attempt}"
        await run.sleep(run.faults.amount("model", key, run.lease_for / 50, run.lease_for / 10))
        return run.model.at(self.task, step, request)

    def begin(self, step: str) -> None:
        """Record that the plan began ``step`` (done by :meth:`call` for tool calls)."""
        self.run.history.record(
            self.process, "invoke", "step", task=self.task, step=step, attempt=self.attempt
        )

    async def call(self, tool: str, args: dict[str, Any], *, step: str) -> Any:
        """Call a tool of the world as ``step`` of this task, through the seeded faults.

        After the side effect, before the agent records it, the process may crash (it stops
        here for good, keeping its lease until the store reaps it; a new agent process takes
        its place, as a supervisor would start one).

        Raises:
            ResponseLost: the response was dropped or its acknowledgement lost.
        """
        self.begin(step)
        result = await self.run.tools.call(
            tool, args, task=self.task, step=step, attempt=self.attempt
        )
        await self.run._crash_point(self.process, f"{self.task}/{step}/{self.attempt}")
        return result

    async def heartbeat(self) -> None:
        """Extend the lease (the process may freeze past it first).

        Raises:
            LeaseLost: the lease was reaped; stop, anything more this attempt writes is refused.
        """
        run = self.run
        self._beats += 1
        await run._freeze_point(self.process, f"{self.task}/hb{self._beats}/{self.attempt}")
        try:
            (renewed,) = await self.queue.extend([self.lease], lease_for=run.lease_for)
        except BackendUnavailable:
            return  # the next heartbeat tries again; the lease still has time
        if renewed is None:
            raise LeaseLost(self.lease.task_id, self.attempt, None, "unknown")
        self.lease = renewed


def _quiet(event: object) -> None:
    pass


class Run:
    """One run of a scenario on one store.

    Attributes:
        scenario, seed, url: what runs, with which seed, on which store.
        history: the run's history (what the checkers read).
        faults: the run's seeded fault decisions.
        model: the replayed model (``None`` without a trace).
        rng: the seeded random stream for the system's own choices.
        queue, state: agentlease clients over the run's store, through the store faults (for the
            system's setup and its world; agents use their own, :attr:`Agent.state`).
        tools: the simulated world's tools, through the tool faults.
        lease_for: the agents' lease length in seconds (run clock).
    """

    def __init__(
        self,
        scenario: Scenario,
        seed: int,
        url: str,
        backend: Any,
        *,
        only: Iterable[str] | None,
        now: Callable[[], float],
        lease_for: float,
    ) -> None:
        self.scenario, self.seed, self.url = scenario, seed, url
        self.now = now
        self.lease_for = lease_for
        self.history = History(now, meta={"scenario": scenario.name, "seed": seed, "store": url})
        self.faults = Faults(seed, kinds=scenario.faults, only=only, history=self.history)
        self.rng = random.Random(seed)
        self.prefix = "" if url.startswith("memory") else f"h{os.getpid()}x{next(_RUN_IDS)}x{seed}-"
        self.backend = FaultyBackend(backend, self.faults, self.sleep)
        self.queue = AsyncQueue(
            self.backend,
            settings=QueueSettings(lease_for=lease_for, max_reclaims=3),
            on_event=_quiet,  # the history is the record; events would only log
        )
        self.state = AsyncSharedState(self.backend)
        self.state._rand.seed(seed)
        self._backend = backend
        self._gates: dict[str, ProcessGate] = {}
        self._per_process: dict[str, tuple[AsyncQueue, AsyncSharedState]] = {}
        self.tools = ToolRuntime(self.faults, self.history, self.sleep, timeout=lease_for / 4)
        self.model: ReplayModel | None = None
        if scenario.trace is not None:
            self.model = ReplayModel(Trace.load(scenario.trace))
        self._tasks: dict[str, str] = {}  # store id -> task name
        self._processes: list[asyncio.Task[None]] = []
        self._agent_ids = itertools.count(1)

    async def sleep(self, seconds: float) -> None:
        """Sleep on the run's clock."""
        await asyncio.sleep(seconds)

    def name(self, base: str) -> str:
        """A queue or key name of this run (prefixed on shared stores)."""
        return f"{self.prefix}{base}"

    def tool(self, name: str) -> Callable[[Callable[[ToolCall], Any]], Callable[[ToolCall], Any]]:
        """Register a tool of the simulated world: ``@run.tool("charge")``."""

        def register(fn: Callable[[ToolCall], Any]) -> Callable[[ToolCall], Any]:
            self.tools.register(name, fn)
            return fn

        return register

    async def enqueue(self, queue: str, task: str, payload: Any = None, **options: Any) -> bool:
        """Enqueue the scenario's task ``task`` (recorded as ``enqueue`` if it was created).

        Returns:
            Whether it was created (``False``: a task of that name exists already).
        """
        store_id = self.name(task)
        self._tasks[store_id] = task
        uncertain = False
        for tries_left in reversed(range(5)):
            try:
                enqueued = await self.queue.enqueue(
                    self.name(queue), {"task": task, "payload": payload}, id=store_id, **options
                )
            except BackendUnavailable:
                if not tries_left:
                    raise
                uncertain = True  # it may have landed: the retry, with the same id, will say
                await self.sleep(self.lease_for / 10)
                continue
            break
        if enqueued.created or uncertain:
            self.history.world("enqueue", task=task, queue=queue)
        return enqueued.created

    def _clients(self, process: str) -> tuple[AsyncQueue, AsyncSharedState]:
        """The process's own queue and state clients, behind its gate."""
        clients = self._per_process.get(process)
        if clients is None:
            gate = self._gates.setdefault(process, ProcessGate())
            backend = FaultyBackend(
                self._backend, self.faults, self.sleep, gate=gate, process=process
            )
            queue = AsyncQueue(backend, settings=self.queue.settings, on_event=_quiet)
            state = AsyncSharedState(backend)
            state._rand.seed(f"{self.seed}/{process}")
            clients = self._per_process[process] = (queue, state)
        return clients

    async def _crash_point(self, process: str, key: str) -> None:
        if self.faults.decide("process:crash", key, target=process):
            # SIGKILL: nothing of this process runs again, its renewals stop; its supervisor
            # starts another process in its place.
            self._gates.setdefault(process, ProcessGate()).kill()
            _restart.get()()
            await asyncio.Future()

    async def _freeze_point(self, process: str, key: str) -> None:
        seconds = self.lease_for * 2.5
        if self.faults.decide("process:freeze", key, target=process, seconds=seconds):
            # SIGSTOP past the lease, then SIGCONT: the process's renewals wait meanwhile.
            gate = self._gates.setdefault(process, ProcessGate())
            gate.stop()
            await self.sleep(seconds)
            gate.cont()

    async def _finished(self, queue: str) -> bool:
        counts = (await self.queue.stats(queue)).counts
        return all(counts.get(s, 0) == 0 for s in counts if s not in _TERMINAL)

    async def agents(
        self,
        queue: str,
        handler: Handler,
        *,
        n: int = 2,
        max_attempts: int = 3,
        retry_in: float = 0.05,
    ) -> None:
        """Run ``n`` agent processes on ``queue`` until every task of it has ended.

        Each claims one task at a time with a lease of :attr:`lease_for`, runs ``handler(agent)``
        and completes the task with its return value, fenced by the lease. A handler that raises
        fails the attempt: retried after ``retry_in`` seconds, dead-lettered after
        ``max_attempts`` (reason ``failed: <error type>``). A handler that finds its lease lost
        gives the task up (the store requeues it).
        """
        name = self.name(queue)
        mine: list[asyncio.Task[None]] = []

        def spawn() -> None:
            process = f"agent{next(self._agent_ids)}"
            proc = asyncio.ensure_future(
                self._agent(process, name, handler, max_attempts, retry_in, spawn)
            )
            mine.append(proc)
            self._processes.append(proc)

        for _ in range(n):
            spawn()
        while not all(p.done() for p in mine):
            await self.sleep(self.lease_for / 4)
            for p in list(mine):  # a broken harness or a diverged plan ends the run at once
                if p.done() and not p.cancelled() and (error := p.exception()) is not None:
                    raise error
            with contextlib.suppress(BackendUnavailable):
                if await self._finished(name):
                    break

    async def _agent(
        self,
        process: str,
        queue: str,
        handler: Handler,
        max_attempts: int,
        retry_in: float,
        restart: Callable[[], None],
    ) -> None:
        _process.set(process)
        _restart.set(restart)
        poll = self.lease_for / 8
        mine, _ = self._clients(process)
        while True:
            try:
                jobs = await mine.claim(queue, 1, lease_for=self.lease_for)
            except BackendUnavailable:
                jobs = []
            if not jobs:
                with contextlib.suppress(BackendUnavailable):
                    if await self._finished(queue):
                        return
                await self.sleep(poll)
                continue
            await self._attempt(process, jobs[0], handler, max_attempts, retry_in)

    async def _attempt(
        self, process: str, job: Job, handler: Handler, max_attempts: int, retry_in: float
    ) -> None:
        body = orjson.loads(job.payload_json)
        task, attempt = body["task"], job.lease.attempt
        self.history.record(process, "ok", "claim", task=task, attempt=attempt)
        agent = Agent(self, job, task, body.get("payload"), process)
        try:
            result = await handler(agent)
        except PlanDiverged:
            raise  # never blamed on the model: the run stops and says where the plan diverged
        except LeaseLost:
            self.history.record(process, "info", "abandon", task=task, attempt=attempt)
            return
        except Exception as exc:
            await self._fail(process, agent, exc, max_attempts, retry_in)
            return
        await self._crash_point(process, f"{task}/complete/{attempt}")
        await self._complete(process, agent, result)

    async def _complete(self, process: str, agent: Agent, result: Any) -> None:
        op = self.history.invoke(process, "complete", task=agent.task, attempt=agent.attempt)
        for _ in range(5):
            try:
                await agent.queue.complete(agent.lease, result)
            except BackendUnavailable:
                await self.sleep(self.lease_for / 10)
                continue
            except LeaseLost:
                # A lost reply and the retry refused: the store says whether it was ours.
                task = await agent.queue.get(agent.lease.task_id)
                if task.state == "done" and task.attempt == agent.attempt:
                    op.ok()
                else:
                    op.fail(error="LeaseLost")
                return
            op.ok()
            return
        op.info(error="BackendUnavailable")

    async def _fail(
        self, process: str, agent: Agent, exc: Exception, max_attempts: int, retry_in: float
    ) -> None:
        final = agent.attempt >= max_attempts
        op = self.history.invoke(
            process, "fail", task=agent.task, attempt=agent.attempt, error=type(exc).__name__
        )
        try:
            await agent.queue.fail(
                agent.lease,
                exc,
                retry_in=None if final else retry_in,
                reason=f"failed: {type(exc).__name__}" if final else None,
            )
        except (LeaseLost, BackendUnavailable) as refused:
            op.fail(refused=type(refused).__name__)
            return
        op.ok()

    async def _settle(self) -> None:
        """After the system: land late requests, then record how each task ended in the store."""
        await self.tools.settle()
        for store_id, task in self._tasks.items():
            try:
                stored = await self.queue.get(store_id)
            except Exception:
                continue
            if stored.state in ("dead", "cancelled"):
                error = orjson.loads(stored.error_json) if stored.error_json else {}
                reason = error.get("reason") or error.get("type") or ""
                f = "dead" if stored.state == "dead" else "cancel"
                self.history.world(f, task=task, reason=reason)

    async def stop(self) -> None:
        """Stop every agent process (crashed ones included) and close the clients."""
        for gate in self._gates.values():
            gate.release()  # what still waits at a gate ends, so that the processes unwind
        for p in self._processes:
            p.cancel()
        await asyncio.gather(*self._processes, return_exceptions=True)
        for queue, state in self._per_process.values():
            await state.close()
            await queue.close()
        await self.state.close()
        await self.queue.close()


async def _execute(
    scenario: Scenario,
    seed: int,
    url: str,
    backend: Any,
    only: Iterable[str] | None,
    now: Callable[[], float],
    lease_for: float,
) -> Outcome:
    started = time.perf_counter()
    run = Run(scenario, seed, url, backend, only=only, now=now, lease_for=lease_for)
    error: str | None = None
    try:
        try:
            await asyncio.wait_for(scenario.system(run), scenario.time_limit)
        except TimeoutError:
            run.history.record("harness", "info", "stop", reason="time limit")
        except Exception as exc:  # the system under test broke: report it, do not hide it
            error = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run._settle(), lease_for * 4)
        ops = list(run.history.ops)  # sealed: nothing after this counts
    finally:
        await run.stop()
    sealed = History(meta=run.history.meta)
    sealed.ops = ops
    violations = check(ops, scenario.checkers or CHECKERS)
    return Outcome(
        scenario.name,
        seed,
        url,
        violations,
        [f.spec for f in run.faults.fired],
        sealed,
        time.perf_counter() - started,
        url.startswith("memory"),
        only=None if only is None else list(only),
        error=error,
    )


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """The library's own logging is silent during a run: the history is the record, and a run
    that dead-letters on purpose is not an error of the user's program."""
    logger = logging.getLogger("agentlease")
    saved = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(saved)


def run_seed(
    scenario: Scenario,
    seed: int,
    *,
    store: str = "memory://",
    only: Iterable[str] | None = None,
    lease_for: float | None = None,
) -> Outcome:
    """Run ``scenario`` once with ``seed`` on ``store`` and check its history.

    Args:
        scenario: what to run.
        seed: decides the faults (and, on ``memory://``, the whole interleaving).
        store: ``memory://`` (virtual time) or a store URL (real time, names of its own).
        only: replay exactly these faults (``site@key``) instead of drawing them.
        lease_for: the agents' lease (default 2 s virtual on memory, 0.4 s real elsewhere).
    """
    only = None if only is None else list(only)
    with _quiet_logs():
        return _run_seed(scenario, seed, store, only, lease_for)


def _run_seed(
    scenario: Scenario, seed: int, store: str, only: list[str] | None, lease_for: float | None
) -> Outcome:
    if store.startswith("memory"):
        from agentlease.backends._threaded import ThreadedAsyncBackend
        from agentlease.backends.memory import MemoryBackend

        async def virtual(clock: VirtualClock) -> Outcome:
            backend = ThreadedAsyncBackend(MemoryBackend(clock=clock.wall), inline=True)
            return await _execute(
                scenario, seed, store, backend, only, clock.monotonic, lease_for or 2.0
            )

        return run_virtual(virtual)

    async def real() -> Outcome:
        backend = connect_async(store)
        try:
            return await _execute(
                scenario, seed, store, backend, only, time.monotonic, lease_for or 0.4
            )
        finally:
            await backend.close()

    return asyncio.run(real())
