"""What an MCP session holds: the leases it claimed, the lock sets it acquired and the
idempotency reservations it began, kept alive while the session lives and given back when it
ends.

An agent does not heartbeat while its model thinks, so the server does it: one renewer per
server extends every session's leases every third of ``lease_for`` in one round trip. Nothing
is renewed for ever: the store ends every lease ``lease_cap`` after its claim (the queue's
``max_lease``), a reservation is abandoned (left in flight, as after a crash) ``lease_cap``
after it began, and a lock set is released ``hold`` seconds (at most ``lock_cap``) after it
was acquired. When the session ends, its leases are released to the front of their queues,
its lock sets released and its reservations abandoned.

A lock set is held by a task of its own, from acquisition to release, because a lock set's
guard (no lock held across a model call) lives in the context of the code that holds it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from dataclasses import dataclass, field

import orjson

from agentlease._async.idempotency import AsyncAction, AsyncIdempotency
from agentlease._async.queue import AsyncQueue
from agentlease._async.state import AsyncLockSet, AsyncSharedState
from agentlease._clock import monotonic
from agentlease._records import Job, Lease
from agentlease.errors import AgentLeaseError, InvalidInput, NotFound

__all__ = ["ActionFailed", "Holdings", "LockHolder", "Runtime", "SessionRequired"]

logger = logging.getLogger("agentlease.mcp")


class SessionRequired(InvalidInput):
    """A tool that takes something on the session's behalf (a claim, a lock set, a
    reservation) was called without a session (the stateless 2026 protocol era): nothing would
    give it back when the agent goes away."""


class ActionFailed(Exception):
    """The failure an agent reports for its own side effect (stored and replayed as this)."""


def encode_lease(lease: Lease) -> str:
    """The lease as one opaque string an agent passes back (queue, task, attempt, token)."""
    raw = orjson.dumps([lease.queue, lease.task_id, lease.attempt, lease.token, lease.leased_at])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_lease(text: object) -> Lease:
    """The lease an agent passed back (from :func:`encode_lease`); InvalidInput if it is not
    one."""
    if not isinstance(text, str) or not 0 < len(text) <= 2000:
        raise InvalidInput("lease must be the string claim returned")
    try:
        queue, task_id, attempt, token, leased_at = orjson.loads(
            base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        )
    except (ValueError, TypeError):
        raise InvalidInput("lease must be the string claim returned") from None
    from agentlease._validate import lease as valid

    return valid(Lease(task_id, queue, token, attempt, leased_at, leased_at))


@dataclass(eq=False)
class Claimed:
    """A lease the session holds, with what ``fail`` needs to apply the retry policy."""

    lease: Lease
    failures: int


@dataclass(eq=False)
class HeldAction:
    """A reservation the session began, and when its renewals stop (``time.monotonic``)."""

    action: AsyncAction
    until: float


class LockHolder:
    """One lock set, held by a task of its own until released, capped or the session ends."""

    def __init__(
        self, state: AsyncSharedState, names: list[str], timeout: float, hold: float
    ) -> None:
        self.id = uuid.uuid4().hex
        self.names = names
        self.hold = hold
        self._set = state.locks(names, timeout=timeout, ttl=hold)
        self._acquired: asyncio.Future[AsyncLockSet] = asyncio.get_running_loop().create_future()
        self._done = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"agentlease-mcp-locks-{self.id}")

    async def _run(self) -> None:
        try:
            async with self._set as held:
                self._acquired.set_result(held)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._done.wait(), self.hold)
        except BaseException as exc:
            if not self._acquired.done():
                self._acquired.set_exception(exc)
            raise

    async def acquired(self) -> AsyncLockSet:
        """The held set, once acquired; raises what acquiring raised (LockTimeout, ...)."""
        return await asyncio.shield(self._acquired)

    @property
    def ended(self) -> bool:
        """Whether the set was released (by the agent, its cap or an error)."""
        return self._task.done()

    async def release(self) -> None:
        """Release the set (a no-op if its cap already did); raises LockLost if it was lost."""
        self._done.set()
        await asyncio.shield(self._task)


@dataclass(eq=False)
class Holdings:
    """Everything one MCP session holds (see the module docstring)."""

    runtime: Runtime
    leases: dict[tuple[str, str], Claimed] = field(default_factory=dict)
    locks: dict[str, LockHolder] = field(default_factory=dict)
    actions: dict[str, HeldAction] = field(default_factory=dict)
    closed: bool = False

    def check_open(self) -> None:
        if self.closed:
            raise SessionRequired("the session has ended")

    def add_job(self, job: Job) -> None:
        self.leases[(job.task_id, job.lease.token)] = Claimed(job.lease, job.failures)

    def take(self, lease: Lease) -> Claimed | None:
        """Stop renewing ``lease`` (a final write follows); what the session knew of it."""
        return self.leases.pop((lease.task_id, lease.token), None)

    def lease(self, given: Lease) -> Lease:
        """The session's own copy of ``given`` (with its latest expiry), else ``given``."""
        held = self.leases.get((given.task_id, given.token))
        return given if held is None else held.lease

    async def close(self) -> None:
        """The session ended: release its leases and lock sets, abandon its reservations."""
        if self.closed:
            return
        self.closed = True
        self.runtime.sessions.discard(self)
        leases, self.leases = list(self.leases.values()), {}
        for claimed in leases:
            with contextlib.suppress(AgentLeaseError):
                await self.runtime.queue.release(claimed.lease, front=True)
        holders, self.locks = list(self.locks.values()), {}
        for holder in holders:
            with contextlib.suppress(Exception):
                await holder.release()
        actions, self.actions = list(self.actions.values()), {}
        for held in actions:
            with contextlib.suppress(AgentLeaseError):
                await held.action.abandon()


@dataclass(eq=False)
class Runtime:
    """The server's clients of the store, its live sessions and their renewer."""

    queue: AsyncQueue
    state: AsyncSharedState
    keys: AsyncIdempotency
    lease_for: float
    lease_cap: float
    lock_cap: float
    sessions: set[Holdings] = field(default_factory=set)

    def open_session(self) -> Holdings:
        holdings = Holdings(self)
        self.sessions.add(holdings)
        return holdings

    async def renew_forever(self) -> None:
        """Every third of ``lease_for``: extend every session's leases in one round trip,
        forget those the store no longer grants, and abandon reservations past the cap."""
        while True:
            await asyncio.sleep(self.lease_for / 3)
            try:
                await self.renew_once()
            except AgentLeaseError as exc:  # an outage: the next tick tries again
                logger.warning("renewing leases failed: %s", exc)

    async def renew_once(self) -> None:
        held = [(s, key, c) for s in list(self.sessions) for key, c in list(s.leases.items())]
        if held:
            renewed = await self.queue.extend([c.lease for _, _, c in held])
            for (session, key, claimed), new in zip(held, renewed, strict=True):
                if new is None:
                    session.leases.pop(key, None)
                else:
                    claimed.lease = new
        now = monotonic()
        for session in list(self.sessions):
            for name, action in list(session.actions.items()):
                if action.until <= now:
                    session.actions.pop(name, None)
                    await action.action.abandon()
            for lock_id, holder in list(session.locks.items()):
                if holder.ended:
                    session.locks.pop(lock_id, None)

    async def close(self) -> None:
        for session in list(self.sessions):
            await session.close()


def not_held(what: str, ident: str) -> NotFound:
    """The refusal for a lock set or reservation this session does not hold."""
    return NotFound(
        f"no {what} {ident!r} is held by this session (released already, ended by its cap,"
        " or taken in another session)"
    )
