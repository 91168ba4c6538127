# Generated from agentlease/_async/idempotency.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""Idempotent side effects: a retried or resumed action returns its first outcome, never acts twice.

Written once for asyncio; the synchronous face is generated from this file by scripts/unasync.py.

An action (a tool call with a side effect) is named by its key (see
:mod:`agentlease._policy.keys`). Running it:

1. **reserve** the key in the store (one atomic step). The store answers with a reservation (an
   in-flight lease with a token and a fence), or with the key's record: ``done`` or ``failed``
   (replay the stored outcome: one round trip in all), ``in_flight`` and live
   (:class:`~agentlease.errors.DuplicateInFlight`, or wait up to ``wait`` seconds), or other
   arguments (:class:`~agentlease.errors.IdempotencyConflict`).
2. run the action while the reservation is renewed every third of ``hold_for``;
3. record the outcome, fenced by the token (one atomic step): ``complete`` with the JSON result, or
   ``fail`` with a permanent error (a ``fail_on`` type), or ``release`` when the error is known not
   to have applied (a ``release_on`` type or :class:`NotApplied`). A store that is unavailable
   for a while does not orphan the outcome: the write is retried with jittered backoff until the
   reservation's local deadline, and a retry refused as stale after an ambiguous first try reads
   the key to tell whether that first try was applied.

A reservation has a local deadline on the monotonic clock (the sending of its last confirmed
reservation or renewal, plus ``hold_for``, less a small margin): once it passes unrenewed (a
store outage), the holder has lost the key for good, whatever the store says later, and its
writes raise :class:`~agentlease.errors.ReservationLost` (:meth:`Action.check` says so
earlier).

Any other error is **ambiguous**: the side effect may or may not have happened (a timeout
mid-call). The reservation is then neither released nor failed: it stays in flight until its
in-flight lease runs out, so an immediate retry gets ``DuplicateInFlight`` instead of acting
while the first call may still land; after that a retry takes it over and acts, with the same
key, which the remote side can use to deduplicate. A holder that crashed is taken over the same
way, and its late write is refused (:class:`~agentlease.errors.ReservationLost`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import socket
from collections.abc import Callable
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

from agentlease import _clock, _deadline, _scope
from agentlease import _validate as check
from agentlease._codec import JSON, encode
from agentlease._outcomes import (
    ErrorTypes,
    NotApplied,
    Outcome,
    error_json,
    error_types,
    rebuild,
)
from agentlease._policy.keys import (
    check_key,
    fingerprint,
    fingerprint_names,
    key_and_fingerprint,
    legacy_fingerprint,
)
from agentlease._records import KeyHold, KeyRecord, KeyState
from agentlease._renewal import Renewals, Renewing, sync_sleep
from agentlease._settings import IdempotencySettings
from agentlease.backends import Backend, connect
from agentlease.errors import (
    AgentLeaseError,
    BackendUnavailable,
    DuplicateInFlight,
    IdempotencyConflict,
    InvalidInput,
    MissingIdentity,
    PayloadError,
    ReservationLost,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from contextvars import Token
    from types import TracebackType

__all__ = ["Action", "Idempotency"]

logger = logging.getLogger("agentlease.idempotency")
T = TypeVar("T")
_HOST = socket.gethostname()
_where = [f"{_HOST}:{os.getpid()}"]  # who holds this process's reservations (see _holder)


def _forked() -> None:
    _where[0] = f"{_HOST}:{os.getpid()}"


os.register_at_fork(after_in_child=_forked)


def _lapsed(hold: KeyHold) -> ReservationLost:
    return ReservationLost(
        hold.key,
        hold.fence,
        None,
        None,
        "no renewal was confirmed within hold_for: past its local deadline it may be taken over",
    )


class Action:
    """One reservation of one key, or the replay of its stored outcome.

    Use :meth:`Idempotency.action` or the ``@idempotent`` decorator rather than building one.
    One returned by :meth:`Idempotency.begin` is also a context manager (``with``)
    that sets :func:`agentlease.current_key` and :func:`agentlease.current_fence` inside its
    block (a replay sets neither: nothing is to run).
    """

    def __init__(
        self,
        store: Idempotency,
        key: str,
        fingerprint: str,
        *,
        hold: KeyHold | None = None,
        record: KeyRecord | None = None,
    ) -> None:
        self.key = key
        self.fingerprint = fingerprint
        self.hold = hold
        self.record = record
        self.result: JSON = None if record is None else record.result
        self._store = store
        self._renewal: Renewing | None = None
        self._settled = hold is None
        self._deadline = 0.0  # the local deadline once renewals stop (time.monotonic)
        self._scope_token: Token[tuple[str, int] | None] | None = None

    @property
    def replayed(self) -> bool:
        """The key already has an outcome: do not act; use :attr:`result` (or the error)."""
        return self.record is not None

    @property
    def fence(self) -> int:
        """The reservation's fencing number: +1 at every reservation of this key."""
        if self.hold is not None:
            return self.hold.fence
        assert self.record is not None
        return self.record.fence

    @property
    def taken_over(self) -> bool:
        """This reservation was taken over from a holder that crashed or timed out: that holder
        may have acted; pass :attr:`key` downstream so the remote side can tell."""
        return self.hold is not None and self.hold.taken_over

    def raise_if_failed(self, known: ErrorTypes = ()) -> None:
        """Raise the stored permanent failure again, as its own type when ``known`` names it
        (else :class:`~agentlease.errors.ReplayedFailure`)."""
        if self.record is not None and self.record.state == "failed":
            raise rebuild(self.key, self.record.error, known)

    def check(self) -> None:
        """Raise :class:`~agentlease.errors.ReservationLost` if the reservation is lost: a
        renewal found it taken over, or none was confirmed within ``hold_for`` (the store was
        unreachable), so another attempt may act. Once raised, it is raised for good. A
        replay, or an action with a recorded outcome, passes."""
        if self._renewal is not None:
            self._store._renewals.check(self._renewal)

    def _start(self, sent: float) -> None:
        assert self.hold is not None
        self._renewal = self._store._renewals.open(
            self.hold, self._store.settings.hold_for, sent=sent
        )

    def _stop(self) -> KeyHold:
        """Stop renewing, for the final write: the latest hold, or raise ReservationLost."""
        assert self.hold is not None
        self._settled = True
        if self._renewal is not None:
            renewal, self._renewal = self._renewal, None
            self.hold = self._store._renewals.close(renewal)
            self._deadline = renewal.deadline
        return self.hold

    def _record(
        self, write: Callable[[KeyHold], None], applied: KeyState | None
    ) -> None:
        """Send the final write, retrying while the store is unavailable, up to the local
        deadline; a retry refused as stale may follow a first try that was applied but whose
        reply was lost, and the key's record tells which (``applied``: the state that write
        leaves, ``None`` for a release).

        Raises:
            ReservationLost: the key was taken over, or the store stayed unavailable until the
                reservation's local deadline (the outcome is not recorded).
        """
        hold = self._stop()
        delay, retried = 0.05, False
        while True:
            try:
                write(hold)
                return
            except ReservationLost:
                if retried and self._applied(hold, applied):
                    return
                raise
            except BackendUnavailable as exc:
                left = self._deadline - _clock.monotonic()
                if left <= 0:
                    raise _lapsed(hold) from exc
                retried = True
                sync_sleep(min(left, delay * self._store._rand.uniform(0.5, 1.0)))
                delay = min(1.0, delay * 2)

    def _applied(self, hold: KeyHold, state: KeyState | None) -> bool:
        """Whether the store shows this reservation's own final write (``state``; ``None``:
        its release)."""
        try:
            record = self._store.backend.get_key(hold.key)
        except AgentLeaseError:
            return False
        if record is None:
            return False
        if state is None:  # released: no holder now, or already taken over by the next one
            return record.fence > hold.fence or (
                record.fence == hold.fence and record.state == "in_flight" and not record.holder
            )
        return record.fence == hold.fence and record.state == state

    def complete(self, result: JSON = None) -> None:
        """Record the result (fenced). A result that cannot be stored is recorded as a permanent
        failure instead (the side effect did happen) and its error raised.

        While the store is unavailable the write is retried, with jittered backoff, until the
        reservation's local deadline (``hold_for`` after the last confirmed renewal was sent).

        Raises:
            NotJSON, PayloadTooLarge: the result cannot be stored.
            ReservationLost: the reservation was taken over, or its local deadline passed (in
                an outage); nothing was recorded.
        """
        if self._settled:
            raise InvalidInput(f"action {self.key[:16]}... already has an outcome")
        settings = self._store.settings
        try:
            data = encode(result, what="the action's result", limit=settings.max_result_bytes)
        except PayloadError as exc:
            self.fail(exc)
            raise

        def write(hold: KeyHold) -> None:
            self._store.backend.complete_key(hold, data, settings.window)

        self._record(write, "done")
        self.result = result

    def fail(self, exc: BaseException) -> None:
        """Record a permanent failure (fenced): every later call raises it again.

        Raises:
            ReservationLost: as :meth:`complete`.
        """
        if self._settled:
            raise InvalidInput(f"action {self.key[:16]}... already has an outcome")
        error = error_json(exc)
        window = self._store.settings.window

        def write(hold: KeyHold) -> None:
            self._store.backend.fail_key(hold, error, window)

        self._record(write, "failed")

    def release(self) -> None:
        """Give the reservation up: the side effect is known not to have happened.

        Raises:
            ReservationLost: as :meth:`complete`.
        """
        if self._settled:
            raise InvalidInput(f"action {self.key[:16]}... already has an outcome")
        self._record(self._store.backend.release_key, None)

    def abandon(self) -> None:
        """Stop renewing and leave the reservation in flight (an ambiguous failure): it is taken
        over once its in-flight lease runs out."""
        self._settled = True
        if self._renewal is not None:
            renewal, self._renewal = self._renewal, None
            with contextlib.suppress(ReservationLost):
                self._store._renewals.close(renewal)

    def __enter__(self) -> Action:
        if not self.replayed and self._scope_token is None:
            self._scope_token = _scope.set_key(self.key, self.fence)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token, self._scope_token = self._scope_token, None
        if token is not None:
            _scope.reset_key(token)
        if self._settled:
            return
        if exc is not None:
            self._settle_error(exc, (), ())
            return
        self.abandon()
        logger.warning(
            "idempotent action %s... ended its block with no outcome recorded: left in flight"
            " until its lease runs out",
            self.key[:16],
        )

    def _settle_error(
        self, exc: BaseException, fail_on: ErrorTypes, release_on: ErrorTypes
    ) -> None:
        if isinstance(exc, NotApplied) or (release_on and isinstance(exc, release_on)):
            self.release()
        elif fail_on and isinstance(exc, fail_on):
            self.fail(exc)
        else:
            self.abandon()
            logger.warning(
                "idempotent action %s... raised %s: left in flight until its lease runs out",
                self.key[:16],
                type(exc).__qualname__,
            )


class Idempotency:
    """Idempotent actions on one store.

    Args:
        backend: the store (see :func:`agentlease.connect`).
        settings: the dedup window, the in-flight lease and limits.
    """

    def __init__(
        self, backend: Backend, *, settings: IdempotencySettings | None = None
    ) -> None:
        self.backend = backend
        self.settings = settings or IdempotencySettings()
        self._purged_at = _clock.monotonic()
        self._rand = random.Random()
        self._renewals = Renewals(self._renew, _lapsed)

    @classmethod
    def connect(cls, url: str, *, settings: IdempotencySettings | None = None) -> Idempotency:
        """Idempotent actions on the store at ``url``."""
        return cls(connect(url), settings=settings)

    def _renew(self, entry: Renewing) -> None:
        entry.lease = self.backend.extend_key(entry.lease, self.settings.hold_for)

    def close(self) -> None:
        """Stop renewing and release the store's connections."""
        self._renewals.stop()
        self.backend.close()

    def __enter__(self) -> Idempotency:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- keys ------------------------------------------------------------------------------------

    def identity(
        self,
        tool: str,
        args: object,
        *,
        step: str | None = None,
        task_id: str | None = None,
        key: str | None = None,
    ) -> tuple[str, str]:
        """The key and argument fingerprint of an action.

        The task and step come from the arguments, else from the current scope (a worker's job,
        :func:`agentlease.idempotency_scope`). A ``key`` given by the caller (an upstream
        ``Idempotency-Key``) is used as it is; the fingerprint covers the tool, the step (if
        one is known) and the arguments, so the same key given to another tool or step is a
        conflict.

        Raises:
            MissingIdentity: no task or step id is known.
            NotJSON: the arguments are not plain JSON.
        """
        return self._identity(_scope.current_scope(), tool, args, step, task_id, key)

    @staticmethod
    def _identity(
        scope: _scope.Scope,
        tool: str,
        args: object,
        step: str | None,
        task_id: str | None,
        key: str | None,
    ) -> tuple[str, str]:
        step_id = step if step is not None else scope.step
        if key is not None:
            return check_key(key), fingerprint(args, tool, step_id)
        task = task_id if task_id is not None else scope.task_id
        if task is None:
            raise MissingIdentity(
                f"idempotent tool {tool!r} runs outside a worker's task and no task id was given:"
                " use agentlease.idempotency_scope(task_id=...) or pass task_id"
            )
        if step_id is None:
            raise MissingIdentity(
                f"idempotent tool {tool!r} has no step id: give step=... or name it with"
                " agentlease.idempotency_scope(step=...)"
            )
        return key_and_fingerprint(task, step_id, tool, args)

    @staticmethod
    def _holder(scope: _scope.Scope) -> str:
        where = _where[0]
        if scope.task_id is None:
            return where
        attempt = "" if scope.attempt is None else f" attempt {scope.attempt}"
        return f"{where} task {scope.task_id}{attempt}"

    # -- the steps ---------------------------------------------------------------------------------

    def begin(
        self,
        tool: str,
        args: object,
        *,
        step: str | None = None,
        task_id: str | None = None,
        key: str | None = None,
        wait: float | None = None,
    ) -> Action:
        """Reserve an action's key, or load its stored outcome (:attr:`Action.replayed`).

        A reservation is renewed until its outcome is recorded (:meth:`Action.complete`,
        ``fail``, ``release``) or it is abandoned; :meth:`call` and :meth:`action` do that.
        Used as a context manager (``with keys.begin(...) as act:``), the
        action sets :func:`agentlease.current_key` and :func:`agentlease.current_fence` inside
        the block, as :meth:`action` does; record the outcome inside it. An error that escapes
        the block is handled as in :meth:`call` with no ``fail_on`` or ``release_on`` (released
        for :class:`NotApplied`, else left in flight), and a block that ends with no outcome
        leaves the reservation in flight. A caller that does not use it as one gets neither
        set: pass :attr:`Action.key` (and :attr:`Action.fence`) downstream yourself.

        Args:
            tool: the tool's name.
            args: its arguments (plain JSON).
            step: see :meth:`identity`.
            task_id: see :meth:`identity`.
            key: see :meth:`identity`.
            wait: seconds to wait for another attempt's reservation to finish (polling, with
                jitter) before giving up with DuplicateInFlight. By default no wait, except in a
                worker's job, which waits up to ``hold_for`` + 1 s: the lease on the task means
                no other attempt of it runs now, so an in-flight reservation is a predecessor's
                that crashed or failed ambiguously, and the job takes it over once it runs out.

        Raises:
            DuplicateInFlight: another attempt holds the key (after ``wait``).
            IdempotencyConflict: the key was used with other arguments.
            MissingIdentity, NotJSON: the action cannot be keyed.
        """
        derived = key is None
        scope = _scope.current_scope()
        key, fp = self._identity(scope, tool, args, step, task_id, key)
        settings = self.settings
        holder = self._holder(scope)
        if wait is None:
            wait = settings.hold_for + 1.0 if scope.attempt is not None else 0.0
        give_up = _deadline.cap(_clock.monotonic() + check.non_negative(wait, "wait"))
        self._maybe_purge()  # replays purge too, not only new reservations
        pause = 0.02
        while True:
            _deadline.check_deadline(f"the action {tool or key[:16]!r}")  # never start late
            sent = _clock.monotonic()
            got = self.backend.reserve_key(
                key, fp, holder, settings.hold_for, settings.window
            )
            if isinstance(got, KeyHold):
                confirmed = self._confirm(got, sent)
                if confirmed is None:
                    continue  # it ran out before its reply came, and was taken over: look again
                got, sent = confirmed
                if got.taken_over:
                    logger.warning(
                        "idempotency key %s... taken over (fence %d)", key[:16], got.fence
                    )
                action = Action(self, key, fp, hold=got)
                action._start(sent)
                return action
            if got.fingerprint != fp:
                if derived and got.fingerprint == legacy_fingerprint(args):
                    # Stored before fingerprints covered the tool; a derived key covers it.
                    fp = got.fingerprint
                    continue
                names = fingerprint_names(got.fingerprint)
                raise IdempotencyConflict(
                    key,
                    got.fingerprint,
                    fp,
                    stored_tool=None if names is None else names[0],
                    given_tool=tool,
                )
            if got.state != "in_flight":
                logger.debug("idempotency key %s... replayed (%s)", key[:16], got.state)
                return Action(self, key, fp, record=got)
            retry_after = max(0.0, (got.expires_at or got.now) - got.now)
            left = give_up - _clock.monotonic()
            if left <= 0:
                _deadline.check_deadline(f"the action {tool or key[:16]!r}")
                raise DuplicateInFlight(key, retry_after, got.holder)
            sync_sleep(min(left, retry_after + 0.001, self._rand.uniform(0, pause)))
            pause = min(pause * 2, 1.0)

    def _confirm(self, hold: KeyHold, sent: float) -> tuple[KeyHold, float] | None:
        """``hold`` (and when its latest confirming request was sent) if it is surely still
        held, else ``None``.

        A reservation whose reply took longer than a third of ``hold_for`` may have run out
        before the reply arrived, and another attempt may have taken it over and be acting. So
        before acting on it, extend it: the extension is fenced by the token, which a takeover
        replaces, so its success proves nobody else holds the key.

        Raises:
            BackendUnavailable: the store keeps answering too slowly to hold a reservation.
        """
        hold_for = self.settings.hold_for
        for attempt in range(4):
            if _clock.monotonic() - sent <= hold_for / 3:
                return hold, sent
            if attempt == 3:
                break
            sent = _clock.monotonic()
            try:
                hold = self.backend.extend_key(hold, hold_for)
            except ReservationLost:
                return None
        with contextlib.suppress(AgentLeaseError):
            self.backend.release_key(hold)  # nothing ran: let the next attempt act at once
        raise BackendUnavailable(
            f"the store at {self.backend.url} answers slower than a third of hold_for"
            f" ({hold_for} s): a reservation cannot be held safely"
        )

    def _maybe_purge(self) -> None:
        """Purge keys past the window every ``purge_every`` seconds of this client's use, and
        at every use while a purge finds a full batch (a backlog: a client reserving faster
        than one batch per interval still keeps up). Keys are purged on a timer too, by every
        worker on the store (``WorkerSettings.purge_every``), so a store whose clients fall
        idle does not keep them; this client has no timer of its own (no thread of its own to
        run one)."""
        if _clock.monotonic() - self._purged_at < self.settings.purge_every:
            return
        self._purged_at = _clock.monotonic()
        try:
            purged = self.backend.purge_keys(self.settings.purge_batch)
        except AgentLeaseError:
            logger.warning("purging expired idempotency keys failed", exc_info=True)
            return
        if purged >= self.settings.purge_batch:
            self._purged_at = -math.inf  # more are waiting: the next use purges again

    def call(
        self,
        fn: Callable[[], T],
        *,
        tool: str,
        args: object,
        step: str | None = None,
        task_id: str | None = None,
        key: str | None = None,
        wait: float | None = None,
        fail_on: ErrorTypes = (),
        release_on: ErrorTypes = (),
    ) -> Outcome[T]:
        """Run ``fn()`` at most once for this action, or replay its outcome.

        ``fn`` runs with :func:`agentlease.current_key` set to the action's key. Its result must
        be JSON. An error of a ``fail_on`` type is stored and raised again by every later call;
        one of a ``release_on`` type (or :class:`NotApplied`) releases the key; any other leaves
        it in flight until its in-flight lease runs out (see the module's account).

        Raises:
            DuplicateInFlight, IdempotencyConflict, ReservationLost, MissingIdentity: see
                :meth:`begin` and :meth:`Action.complete`.
            ReplayedFailure: a stored failure whose type is not among ``fail_on``.
        """
        fail_on = error_types(fail_on, "fail_on")
        release_on = error_types(release_on, "release_on")
        action = self.begin(tool, args, step=step, task_id=task_id, key=key, wait=wait)
        if action.replayed:
            action.raise_if_failed(fail_on)
            return Outcome(action.result, True, action.key)  # type: ignore[arg-type]
        token = _scope.set_key(action.key, action.fence)
        try:
            value = fn()
        except BaseException as exc:
            action._settle_error(exc, fail_on, release_on)
            raise
        finally:
            _scope.reset_key(token)
        action.complete(value)  # type: ignore[arg-type]
        return Outcome(value, False, action.key)

    @contextmanager
    def action(
        self,
        tool: str,
        args: object,
        *,
        step: str | None = None,
        task_id: str | None = None,
        key: str | None = None,
        wait: float | None = None,
        fail_on: ErrorTypes = (),
        release_on: ErrorTypes = (),
    ) -> Iterator[Action]:
        """An idempotent block, for code that is not one function::

            with keys.action("send_email", {"to": to}, step="welcome") as act:
                if not act.replayed:
                    act.result = send(to, headers={"Idempotency-Key": act.key})
            print(act.result)

        The block must skip the side effect when ``act.replayed`` is true. On a normal exit
        ``act.result`` is recorded; errors are handled as in :meth:`call`. A stored permanent
        failure is raised on entry.
        """
        fail_on = error_types(fail_on, "fail_on")
        release_on = error_types(release_on, "release_on")
        act = self.begin(tool, args, step=step, task_id=task_id, key=key, wait=wait)
        if act.replayed:
            act.raise_if_failed(fail_on)
            yield act
            return
        token = _scope.set_key(act.key, act.fence)
        try:
            yield act
        except BaseException as exc:
            act._settle_error(exc, fail_on, release_on)
            raise
        finally:
            _scope.reset_key(token)
        act.complete(act.result)

    def get(self, key: str) -> KeyRecord | None:
        """The stored record of ``key``, or ``None`` if it is absent or past the window."""
        return self.backend.get_key(check_key(key))

    def purge(self, limit: int = 1000) -> int:
        """Delete up to ``limit`` keys (1 to 1,000,000) past the dedup window now; how many
        were deleted."""
        return self.backend.purge_keys(check.integer(limit, "limit", low=1, high=1_000_000))
