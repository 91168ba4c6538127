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

**Every store call has a bound.** A tool call, a renewal and each give-back waits for the store
at most ``call_timeout`` (a third of ``lease_for``, the worker's bound too), beyond what the call
waits for by design (a lock set's ``timeout``); past it, it is refused with
:class:`~agentlease.errors.BackendUnavailable`, so a hung store never hangs an agent. What such
a call did may still land once the store answers again (a claim nobody was told about): it is
bounded like everything else, by its lease or TTL. A give-back the store refuses or does not
answer (the store is down as the session ends) is logged at warning level with its typed error;
the lease then expires by itself, at most ``lease_for`` later.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import orjson

from agentlease._async.idempotency import AsyncAction, AsyncIdempotency
from agentlease._async.queue import AsyncQueue
from agentlease._async.state import AsyncLockSet, AsyncSharedState
from agentlease._clock import monotonic
from agentlease._records import Job, Lease
from agentlease.errors import (
    AgentLeaseError,
    BackendUnavailable,
    InvalidInput,
    LeaseLost,
    NotFound,
)

__all__ = ["ActionFailed", "Holdings", "LockHolder", "Runtime", "SessionRequired", "bounded"]

logger = logging.getLogger("agentlease.mcp")


@contextlib.asynccontextmanager
async def bounded(seconds: float, what: str) -> AsyncIterator[None]:
    """Wait at most ``seconds`` for the body; past it, cancel it and raise BackendUnavailable
    (a TimeoutError raised by the body itself passes unchanged)."""
    deadline = asyncio.timeout(seconds)
    try:
        async with deadline:
            yield
    except TimeoutError:
        if not deadline.expired():
            raise
        raise BackendUnavailable(
            f"no answer from the store within {seconds:g} s ({what}): it may be hung or overloaded"
        ) from None


def _problem(exc: BaseException) -> str:
    """A logged failure as its type and message (typed: an agentlease error, or a bug)."""
    return f"{type(exc).__name__}: {exc}"


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
            if not self._acquired.done():  # acquiring failed: acquired() raises it, and only it
                if isinstance(exc, Exception):
                    self._acquired.set_exception(exc)
                    return
                self._acquired.cancel()
            raise

    async def acquired(self) -> AsyncLockSet:
        """The held set, once acquired; raises what acquiring raised (LockTimeout, ...). If
        the wait is cancelled (its bound, the session's end), the set is given up: released if
        it was acquired; an acquisition the store may still grant lapses with its TTL
        (``hold``)."""
        try:
            return await asyncio.shield(self._acquired)
        except asyncio.CancelledError:
            self._task.cancel()
            raise

    def forget(self) -> None:
        """The set ended by itself (its cap): log how, if it ended with an error."""
        if self._task.done() and not self._task.cancelled():
            exc = self._task.exception()
            if exc is not None:
                logger.warning("lock set %s ended with %s", self.names, _problem(exc))

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
        """The session ended: release its leases and lock sets, abandon its reservations.

        Each give-back is bounded by the runtime's ``call_timeout``; one that fails is logged
        (warning, with its typed error) and left to its lease, TTL or cap."""
        if self.closed:
            return
        self.closed = True
        self.runtime.sessions.discard(self)
        rt = self.runtime
        leases, self.leases = list(self.leases.values()), {}
        for claimed in leases:
            lease = claimed.lease
            try:
                async with bounded(rt.call_timeout, "giving a task back"):
                    await rt.queue.release(lease, front=True)
            except LeaseLost:
                pass  # not ours any more: nothing to give back
            except Exception as exc:
                logger.warning(
                    "could not give task %s (attempt %d) back as its session ended: %s; "
                    "its lease expires within %g s",
                    lease.task_id,
                    lease.attempt,
                    _problem(exc),
                    rt.lease_for,
                )
        holders, self.locks = list(self.locks.values()), {}
        for holder in holders:
            try:
                async with bounded(rt.call_timeout, "releasing a lock set"):
                    await holder.release()
            except Exception as exc:
                logger.warning(
                    "could not release lock set %s as its session ended: %s; it is freed "
                    "within %g s",
                    holder.names,
                    _problem(exc),
                    holder.hold,
                )
        actions, self.actions = list(self.actions.values()), {}
        for held in actions:
            try:
                async with bounded(rt.call_timeout, "abandoning a reservation"):
                    await held.action.abandon()
            except Exception as exc:
                logger.warning(
                    "could not abandon reservation %s as its session ended: %s",
                    held.action.key,
                    _problem(exc),
                )


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
    calls: int = 0
    _idle: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    @property
    def call_timeout(self) -> float:
        """The longest a tool call, a renewal or a give-back waits for the store."""
        return self.lease_for / 3

    def open_session(self) -> Holdings:
        holdings = Holdings(self)
        self.sessions.add(holdings)
        return holdings

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        """Count a tool call in flight (:meth:`shutdown` waits for them)."""
        self.calls += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.calls -= 1
            if not self.calls:
                self._idle.set()

    async def renew_forever(self) -> None:
        """Every third of ``lease_for``: extend every session's leases in one round trip,
        forget those the store no longer grants, and abandon reservations past the cap. A
        failed round (an outage, a hung store) is logged and the next tick tries again."""
        while True:
            await asyncio.sleep(self.lease_for / 3)
            try:
                async with bounded(self.call_timeout, "a renewal"):
                    await self.renew_once()
            except AgentLeaseError as exc:
                logger.warning("renewing leases failed: %s", _problem(exc))
            except Exception:  # a bug must not end the renewals of every session
                logger.exception("renewing leases failed")

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
                    holder.forget()

    async def close(self) -> None:
        """End every session (what they hold is given back)."""
        for session in list(self.sessions):
            await session.close()

    async def shutdown(self, grace: float) -> None:
        """The server is stopping: end every session, then wait for the tool calls in flight
        (a claim that lands now gives its task back itself); at most ``grace`` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self.close()
                if self.calls:
                    await self._idle.wait()


def not_held(what: str, ident: str) -> NotFound:
    """The refusal for a lock set or reservation this session does not hold."""
    return NotFound(
        f"no {what} {ident!r} is held by this session (released already, ended by its cap,"
        " or taken in another session)"
    )
