"""Seeded faults: where they may strike, whether they do, and the wrappers that inject them.

A fault *site* names a place and a kind: ``tool:charge:duplicate``, ``process:freeze``,
``store:complete:ack_lost``. Each visit of a site carries a *key* that names the visit
logically (``t3/s2/1``: task, step, attempt), never by timing, so the decision is the same on
every store and in every interleaving. As FoundationDB's BUGGIFY does, the seed first decides
which sites are active in this run at all, and how often an active site fires; then each visit
fires or not by a hash of (seed, site, key). Every fault that fires is an ``info`` op of the
``nemesis`` in the history, and the list of fired faults (``Faults.fired``) is the run's
schedule: pass a subset of it as ``only`` to replay exactly those faults, which is how a failing
schedule is shrunk.

Tool faults, injected by :class:`ToolRuntime` around the simulated world's tools:

``delay``          the call waits before it runs, so another branch overtakes it
``duplicate``      the request is delivered twice: the side effect happens twice
``drop_response``  the tool ran; its response is lost and the caller times out
``reorder``        the response is held back until a later call's response has been delivered
``ack_lost``       the caller times out at once; the request lands late, after the caller gave up

Process faults (:meth:`Faults.decide` at the points the agent loop offers): ``crash`` stops the
agent process for good between a tool's side effect and the record of it (as SIGKILL would: no
cleanup, no release, no more heartbeats; a new agent process starts in its place), ``freeze``
stops it past its lease and resumes it (as SIGSTOP and SIGCONT would). The harness simulates
both inside the run's process, so that they are seeded and replayable; the store sees what it
would see of a killed or stopped process: a lease that is no longer renewed, then (after a
freeze) late writes that fencing refuses. Store faults (:class:`FaultyBackend`):
``store_delay`` before a primitive, ``store_fail`` (refused before it reaches the store: nothing
applied) and ``store_ack_lost`` (applied, the reply lost); the caller sees
:class:`~agentlease.errors.BackendUnavailable` as from a real outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import inspect
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from agentlease.errors import BackendUnavailable, InvalidInput
from agentlease.harness.history import History

__all__ = [
    "KINDS",
    "PROCESS_KINDS",
    "STORE_KINDS",
    "TOOL_KINDS",
    "Faults",
    "FaultyBackend",
    "Fired",
    "ProcessGate",
    "ResponseLost",
    "ToolRuntime",
    "current_process",
]

TOOL_KINDS = ("delay", "duplicate", "drop_response", "reorder", "ack_lost")
PROCESS_KINDS = ("crash", "freeze")
STORE_KINDS = ("store_delay", "store_fail", "store_ack_lost")
KINDS = TOOL_KINDS + PROCESS_KINDS + STORE_KINDS

# How often an active site fires, drawn per site from the seed.
_RATES = (0.1, 0.25, 0.5)
_ACTIVE = 0.6  # the chance a site is active in a run
_STORE_SHARE = 0.2  # store sites fire this much less often than the rate drawn

#: The simulated process doing the current work (set by the agent loop).
current_process: contextvars.ContextVar[str] = contextvars.ContextVar(
    "agentlease_harness_process", default="main"
)


def _unit(*parts: object) -> float:
    """A number in [0, 1) from a hash of ``parts``: the same in every process and on every run."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True, slots=True)
class Fired:
    """One fault that fired: its site and the visit's key (``site@key`` on a command line)."""

    site: str
    key: str

    @property
    def spec(self) -> str:
        """``site@key``."""
        return f"{self.site}@{self.key}"

    @property
    def kind(self) -> str:
        """The fault's kind (the last part of the site)."""
        return self.site.rsplit(":", 1)[-1]

    @classmethod
    def parse(cls, spec: str) -> Fired:
        """A fault from ``site@key``.

        Raises:
            InvalidInput: not of that shape, or of an unknown kind.
        """
        site, sep, key = spec.partition("@")
        fired = cls(site, key)
        if not sep or not site or not key or fired.kind not in KINDS:
            raise InvalidInput(
                f"a fault is SITE@KEY with a site ending in one of {', '.join(KINDS)}: {spec!r}"
            )
        return fired


class Faults:
    """The seeded decisions of one run.

    Args:
        seed: the run's seed.
        kinds: the fault kinds this scenario allows (default: all).
        only: replay exactly these faults (``site@key``) and no other; ``None``: draw from the seed.
        history: where every fired fault is recorded.
    """

    def __init__(
        self,
        seed: int,
        *,
        kinds: Collection[str] = KINDS,
        only: Iterable[str] | None = None,
        history: History | None = None,
    ) -> None:
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            raise InvalidInput(f"unknown fault kinds {unknown}: the kinds are {', '.join(KINDS)}")
        self.seed = seed
        self.kinds = frozenset(kinds)
        self.only = None if only is None else frozenset(Fired.parse(s).spec for s in only)
        self.history = history
        self.fired: list[Fired] = []

    def active(self, site: str) -> bool:
        """Whether the seed switched this site on for the run."""
        return _unit(self.seed, "active", site) < _ACTIVE

    def decide(self, site: str, key: str, **detail: Any) -> bool:
        """Whether the fault at ``site`` strikes this visit (recorded in the history if so)."""
        fired = Fired(site, key)
        if fired.kind not in self.kinds:
            return False
        if self.only is not None:
            strike = fired.spec in self.only
        else:
            rate = _RATES[int(_unit(self.seed, "rate", site) * len(_RATES))]
            if fired.kind in STORE_KINDS:
                rate *= _STORE_SHARE  # visited on every round trip, idle polls included
            strike = self.active(site) and _unit(self.seed, site, key) < rate
        if strike:
            self.fired.append(fired)
            if self.history is not None:
                self.history.fault(fired.kind, site, key, **detail)
        return strike

    def amount(self, site: str, key: str, low: float, high: float) -> float:
        """A seeded number in [low, high) for this visit (how long a delay lasts)."""
        return low + (high - low) * _unit(self.seed, "amount", site, key)


class ResponseLost(TimeoutError):
    """The tool's response never reached the caller (it may or may not have run)."""


Effect = Callable[..., Awaitable[Any] | Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call of a tool, as the world sees it."""

    tool: str
    args: dict[str, Any]
    task: str
    step: str
    attempt: int
    process: str


class ToolRuntime:
    """The simulated world's tools, called through the five tool faults.

    Register each tool's side effect with :meth:`register` (``fn(call: ToolCall) -> JSON``,
    plain or ``async``); the side effect records what it did in the history itself (as the
    ``world``). Callers use :meth:`call`, which records the call (``invoke``, then ``ok``,
    ``fail`` or ``info``) and injects the faults the seed draws.

    Args:
        faults: the run's decisions.
        history: the run's history.
        sleep: the run's sleep (virtual or real).
        timeout: how long a caller waits for a response before it gives up (``ResponseLost``).
    """

    def __init__(
        self,
        faults: Faults,
        history: History,
        sleep: Callable[[float], Awaitable[None]],
        *,
        timeout: float = 0.2,
    ) -> None:
        self._faults, self._history, self._sleep, self.timeout = faults, history, sleep, timeout
        self._tools: dict[str, Effect] = {}
        self._late: set[asyncio.Task[None]] = set()
        self._delivered: dict[str, asyncio.Event] = {}
        self._visits: dict[tuple[str, str, str, int], int] = {}

    def register(self, name: str, fn: Effect) -> None:
        """Add a tool."""
        self._tools[name] = fn

    async def _run(self, call: ToolCall) -> Any:
        result = self._tools[call.tool](call)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _land_late(self, call: ToolCall, after: float) -> None:
        await self._sleep(after)
        try:
            await self._run(call)
        except Exception:
            return  # the caller gave up long ago; the world recorded what happened

    def _signal(self, tool: str) -> None:
        event = self._delivered.pop(tool, None)
        if event is not None:
            event.set()

    async def call(
        self, tool: str, args: dict[str, Any], *, task: str, step: str, attempt: int
    ) -> Any:
        """Call ``tool`` as step ``step`` of ``task`` (attempt ``attempt``), with faults.

        Raises:
            ResponseLost: the response was dropped, or its acknowledgement lost.
            InvalidInput: an unknown tool.
            Exception: whatever the tool raised.
        """
        if tool not in self._tools:
            raise InvalidInput(f"unknown tool {tool!r}: the world has {sorted(self._tools)}")
        process = current_process.get()
        call = ToolCall(tool, args, task, step, attempt, process)
        # The n-th call of one step in one attempt (a retry within the attempt) is its own
        # visit: ``t1/s2/1``, then ``t1/s2/1#2``, so a retry draws its own faults.
        visit = (tool, task, step, attempt)
        n = self._visits[visit] = self._visits.get(visit, 0) + 1
        key, site = f"{task}/{step}/{attempt}" + (f"#{n}" if n > 1 else ""), f"tool:{tool}"
        decide, faults = self._faults.decide, self._faults
        op = self._history.invoke(process, "call", tool=tool, task=task, step=step, args=args)
        await self._sleep(faults.amount(f"{site}:latency", key, 0.0, self.timeout / 10))
        if decide(f"{site}:delay", key):
            await self._sleep(faults.amount(f"{site}:delay", key, self.timeout / 4, self.timeout))
        if decide(f"{site}:ack_lost", key):
            late = asyncio.ensure_future(self._land_late(call, self.timeout * 1.5))
            self._late.add(late)
            late.add_done_callback(self._late.discard)
            await self._sleep(self.timeout)
            op.info(error="ResponseLost")
            raise ResponseLost(f"no acknowledgement from {tool} within {self.timeout}s")
        try:
            result = await self._run(call)
            if decide(f"{site}:duplicate", key):
                result = await self._run(call)
        except Exception as exc:
            op.fail(error=type(exc).__name__)
            raise
        if decide(f"{site}:drop_response", key):
            await self._sleep(self.timeout)
            op.info(error="ResponseLost")
            raise ResponseLost(f"no response from {tool} within {self.timeout}s")
        if decide(f"{site}:reorder", key):
            event = self._delivered.setdefault(tool, asyncio.Event())
            with contextlib.suppress(TimeoutError):  # nobody overtook: delivered late instead
                await asyncio.wait_for(event.wait(), self.timeout * 2)
        self._signal(tool)
        op.ok(result=result)
        return result

    async def settle(self) -> None:
        """Wait for every late request still in flight to land."""
        while self._late:
            await asyncio.gather(*list(self._late), return_exceptions=True)


# Store primitives that change something (faults on reads would only slow the run).
_WRITES = frozenset(
    {
        *("enqueue", "claim", "extend", "complete", "complete_many", "complete_and_claim"),
        *("fail", "release", "progress", "write_record", "add_counter", "hold_counter"),
        *("reserve_key", "extend_key", "complete_key", "fail_key", "release_key"),
        *("extend_hold", "release_hold", "commit_hold", "retry_budget", "breaker_admit"),
        *("breaker_record", "acquire_locks", "extend_locks", "release_locks"),
    }
)


class ProcessGate:
    """What the signals sent to a simulated process do to its round trips to the store.

    Killed (SIGKILL): nothing more reaches the store, and no reply is handled: its lock and
    reservation renewals stop, so their TTLs free them. Stopped (SIGSTOP): nothing is sent and
    no reply is handled until it is continued (SIGCONT).
    """

    def __init__(self) -> None:
        self.dead = False
        self._running = asyncio.Event()
        self._running.set()
        self._never: asyncio.Future[None] | None = None
        self._released = False

    def kill(self) -> None:
        """SIGKILL."""
        self.dead = True

    def stop(self) -> None:
        """SIGSTOP."""
        self._running.clear()

    def cont(self) -> None:
        """SIGCONT."""
        self._running.set()

    def release(self) -> None:
        """The run is over: a stopped process goes on, a dead one's calls are cancelled."""
        self._released = True
        self._running.set()
        if self._never is not None:
            self._never.cancel()

    async def passage(self) -> None:
        """Wait until the process may act (for ever, once it is dead, until the run ends)."""
        await self._running.wait()
        if self.dead:
            if self._released:
                raise asyncio.CancelledError
            if self._never is None:
                self._never = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._never)


class FaultyBackend:
    """An async backend whose write primitives may be delayed, refused or lose their reply.

    Each call of a primitive by a process is a visit keyed ``process:primitive#n``. With a
    ``gate``, the wrapper belongs to one simulated process (``process``), and its round trips
    stop when that process is killed or stopped. Closing the wrapper leaves the store open: the
    run owns it.
    """

    def __init__(
        self,
        backend: Any,
        faults: Faults,
        sleep: Callable[[float], Awaitable[None]],
        *,
        gate: ProcessGate | None = None,
        process: str | None = None,
    ) -> None:
        self._backend, self._faults, self._sleep = backend, faults, sleep
        self._gate, self._process = gate, process
        self._visits: dict[tuple[str, str], int] = {}

    async def close(self) -> None:
        """Nothing: the run closes its store."""

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._backend, name)
        gate = self._gate
        if name not in _WRITES or not callable(target):
            if gate is None or not inspect.iscoroutinefunction(target):
                return target

            async def read(*args: Any, **kwargs: Any) -> Any:
                await gate.passage()
                result = await target(*args, **kwargs)
                await gate.passage()
                return result

            return read

        async def primitive(*args: Any, **kwargs: Any) -> Any:
            process = self._process or current_process.get()
            if gate is not None:
                await gate.passage()
            n = self._visits[process, name] = self._visits.get((process, name), 0) + 1
            key, site = f"{process}:{name}#{n}", f"store:{name}"
            if self._faults.decide(f"{site}:store_delay", key):
                await self._sleep(self._faults.amount(f"{site}:store_delay", key, 0.01, 0.1))
            if self._faults.decide(f"{site}:store_fail", key):
                raise BackendUnavailable(f"{name}: the store did not answer (injected)")
            result = await target(*args, **kwargs)
            if gate is not None:
                await gate.passage()
            if self._faults.decide(f"{site}:store_ack_lost", key):
                raise BackendUnavailable(f"{name}: the reply was lost (injected)")
            return result

        return primitive
