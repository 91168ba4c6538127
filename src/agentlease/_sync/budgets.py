# Generated from agentlease/_async/budgets.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""Retry budgets, circuit breakers and spend budgets, shared through the store.

Written once for asyncio; the synchronous face is generated from this file by scripts/unasync.py.

* **Retry budget** (:class:`RetryBudget`): a retry goes ahead only while
  ``retries < max(minimum, calls * ratio)`` for its scope, checked and counted in one atomic step
  on the store, so eight subagents in eight processes retrying against one failing dependency
  share one allowance instead of multiplying it. The scope is the **root task** by default (the
  task a request started as; tasks enqueued from a handler inherit it), so a fan-out shares it
  with no wiring. Calls are counted locally and sent with the next step that goes to the store
  anyway (a retry), or every ``flush_every`` calls: the healthy path makes no round trip of its
  own, and the store's count of calls lags by at most that many per process, which only makes
  the allowance smaller (never larger) than the exact one.
* **Circuit breaker** (:class:`CircuitBreaker`): closed, then open after ``threshold``
  consecutive failures (counted in the store, across processes), open for ``cooldown`` seconds
  on the store's clock, then half-open: the store admits **exactly one** trial call across every
  process, numbered by a fence, and only that trial's outcome closes (success) or reopens
  (failure) the circuit; a slow call that lost its turn changes nothing. Each process caches the
  state it last saw for at most ``staleness`` seconds: while closed, a call costs no round trip
  (so another process's opening reaches this one within ``staleness``); while open, calls are
  refused locally until the cooldown it was told of ends, and while half-open for at most
  ``staleness``. A success writes only when this
  process saw failures to reset. The refusal, :class:`~agentlease.errors.CircuitOpen`, is a
  :class:`~agentlease.errors.ToolUnavailable`: data for a planner (``retry_after_s``,
  ``do_not_retry``), not an invitation to retry.
* **Spend budget** (:class:`SpendBudget`): a limit per root task and kind (``"usd"`` in
  micro-dollars, ``"tokens"``, any name), set once (a different limit later is refused). A call
  reserves an estimate before it starts (a counter hold under a lease, so a process that dies
  gives it back) and settles the actual amount after; a reservation that would cross the limit
  raises :class:`~agentlease.errors.BudgetExceeded` and takes nothing, so no call that was
  allowed to start can take the total past the limit as long as its actual spend is within its
  estimate.

Budget and breaker records expire ``ttl`` seconds (default: 7 days) after their last write, on
the store's clock.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar
from types import TracebackType

from agentlease import _clock, _guards
from agentlease import _validate as check
from agentlease._deadline import current_root
from agentlease._records import BreakerState, BudgetState
from agentlease.errors import (
    BudgetExceeded,
    CircuitOpen,
    ConflictError,
    InvalidInput,
    LimitReached,
    MissingIdentity,
    RetryBudgetExhausted,
)

from .holds import CounterHold
from .state import SharedState

__all__ = ["CircuitBreaker", "RetryBudget", "SpendBudget", "SpendHold"]

DEFAULT_TTL = 7 * 24 * 3600.0
"""How long a budget or breaker record outlives its last write (the default retention of a
finished task)."""

_MAX_RATIO = 1000.0
_WHAT = "a retry budget"


def _scope(scope: str | None, what: str) -> str:
    """The scope given, or the root task of the work running now."""
    if scope is not None:
        return _guards.record_key(scope)
    root = current_root()
    if root is None:
        raise MissingIdentity(
            f"{what} is scoped to the root task by default, and no task is running here:"
            " run it inside a worker's handler or name a scope=..."
        )
    return root.root


class RetryBudget:
    """A retry budget shared through the store: ``retries < max(minimum, calls * ratio)``.

    Give it to :func:`agentlease.retry` (``budget=``); the worker's own task retries use one
    too when configured. Scoped to the root task of the work running now unless ``scope`` is
    given (then every holder of the same scope on the same store shares it).

    Args:
        state: the shared state of the store that keeps the budget.
        scope: a fixed scope; by default the current root task (resolved at each call).
        ratio: retries allowed per call, beyond ``minimum`` (0.1: one retry per ten calls).
        minimum: retries allowed however few the calls.
        flush_every: calls counted locally before they are sent on their own.
        ttl: seconds the record outlives its last write.

    Raises:
        InvalidInput: a bad ratio, minimum, flush_every or scope.
    """

    def __init__(
        self,
        state: SharedState,
        *,
        scope: str | None = None,
        ratio: float = 0.1,
        minimum: int = 3,
        flush_every: int = 100,
        ttl: float = DEFAULT_TTL,
    ) -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, int | float):
            raise InvalidInput(f"ratio must be a number, not {type(ratio).__name__}")
        if not 0.0 <= ratio <= _MAX_RATIO:
            raise InvalidInput(f"ratio must be within [0, {_MAX_RATIO:g}], not {ratio!r}")
        self.state = state
        self.scope = None if scope is None else _guards.record_key(scope)
        self.ratio = float(ratio)
        self.minimum = check.integer(minimum, "minimum", low=0, high=1_000_000)
        self.flush_every = check.integer(flush_every, "flush_every", low=1, high=1_000_000)
        self.ttl = check.duration(ttl, "ttl")
        self._pending: dict[str, int] = {}
        self._lock = threading.Lock()

    def _take_pending(self, scope: str) -> int:
        with self._lock:
            return self._pending.pop(scope, 0)

    def _give_back(self, scope: str, calls: int) -> None:
        if calls:
            with self._lock:
                self._pending[scope] = self._pending.get(scope, 0) + calls

    def _send(self, key: str, calls: int, retry: bool) -> BudgetState:
        """One budget step on the store; calls it could not send are kept for the next."""
        try:
            return self.state.backend.retry_budget(
                f"retry:{key}", calls, retry, self.ratio, self.minimum, self.ttl
            )
        except BaseException:
            self._give_back(key, calls)
            raise

    def record_call(self, scope: str | None = None) -> None:
        """Count one call (a first attempt, not a retry); sent to the store with the next retry
        or every ``flush_every`` calls."""
        key = self.scope if scope is None and self.scope is not None else _scope(scope, _WHAT)
        with self._lock:
            pending = self._pending.get(key, 0) + 1
            if pending < self.flush_every:
                self._pending[key] = pending
                return
            self._pending.pop(key, None)
        self._send(key, pending, False)

    def flush(self, scope: str | None = None) -> None:
        """Send the calls counted locally now (for example before the process exits)."""
        key = _scope(scope or self.scope, _WHAT)
        pending = self._take_pending(key)
        if pending:
            self._send(key, pending, False)

    def acquire_retry(self, scope: str | None = None) -> None:
        """Take one retry from the budget, or refuse, in one atomic step on the store.

        Raises:
            RetryBudgetExhausted: ``retries >= max(minimum, calls * ratio)``; nothing taken.
        """
        key = _scope(scope or self.scope, _WHAT)
        got = self._send(key, self._take_pending(key), True)
        if not got.granted:
            raise RetryBudgetExhausted(
                key, got.calls, got.retries, max(float(self.minimum), got.calls * self.ratio)
            )


_TRIALS: ContextVar[dict[int, int] | None] = ContextVar("agentlease_breaker_trials", default=None)


class CircuitBreaker:
    """A circuit breaker for one dependency, its state shared through the store.

    Give it to :func:`agentlease.retry` (``breaker=``), or call :meth:`before`, then
    :meth:`success` or :meth:`failure` around each call to the dependency, in the same context.

    Args:
        state: the shared state of the store that keeps the breaker.
        dependency: the dependency's name (shared by every process that calls it).
        threshold: consecutive failures that open the circuit.
        cooldown: seconds the circuit stays open before its one half-open trial.
        trial_for: seconds the trial may take before another caller gets a trial instead.
        staleness: seconds this process trusts the state it last saw (must be below
            ``cooldown``); the bound on how late it learns that another process opened it.
        ttl: seconds the record outlives its last write.
        tool: the tool name reported in refusals.

    Raises:
        InvalidInput: a bad name, threshold or duration.
    """

    def __init__(
        self,
        state: SharedState,
        dependency: str,
        *,
        threshold: int = 5,
        cooldown: float = 30.0,
        trial_for: float | None = None,
        staleness: float = 1.0,
        ttl: float = DEFAULT_TTL,
        tool: str | None = None,
    ) -> None:
        self.state = state
        self.dependency = _guards.record_key(dependency)
        self.threshold = check.integer(threshold, "threshold", low=1, high=1_000_000)
        self.cooldown = check.duration(cooldown, "cooldown")
        self.trial_for = check.duration(
            self.cooldown if trial_for is None else trial_for, "trial_for"
        )
        self.staleness = check.non_negative(staleness, "staleness")
        if self.staleness >= self.cooldown:
            raise InvalidInput(
                f"staleness ({self.staleness:g} s) must be below cooldown ({self.cooldown:g} s),"
                " so that every process asks the store before the half-open trial"
            )
        self.ttl = check.duration(ttl, "ttl")
        self.tool = tool
        self._key = f"breaker:{self.dependency}"
        self._seen: BreakerState | None = None
        self._seen_at = -float("inf")  # _clock.monotonic() when _seen was read

    @property
    def seen(self) -> BreakerState | None:
        """The state this process last read or wrote (``None`` before any)."""
        return self._seen

    def _see(self, state: BreakerState, at: float) -> None:
        self._seen, self._seen_at = state, at

    def _trial(self) -> int:
        trials = _TRIALS.get()
        return 0 if trials is None else trials.get(id(self), 0)

    def _set_trial(self, fence: int) -> None:
        trials = dict(_TRIALS.get() or {})
        if fence:
            trials[id(self)] = fence
        else:
            trials.pop(id(self), None)
        _TRIALS.set(trials)

    def _refusal(self, state: BreakerState, retry_after: float) -> CircuitOpen:
        return CircuitOpen(
            self.dependency, state.state, state.failures, max(0.0, retry_after), tool=self.tool
        )

    def before(self) -> None:
        """Admit a call, or refuse it.

        Raises:
            CircuitOpen: the circuit is open, or half-open with its trial in flight elsewhere.
        """
        if self._trial():
            self._set_trial(0)
        now = _clock.monotonic()
        seen = self._seen
        if seen is not None:
            age = now - self._seen_at
            if seen.state == "closed" and age < self.staleness:
                return
            # Open: nothing changes before the cooldown ends. Half-open: the trial may close
            # the circuit any moment, so the refusal is trusted for the staleness only.
            trusted = seen.retry_after if seen.state == "open" else self.staleness
            if seen.state != "closed" and age < min(trusted, seen.retry_after):
                raise self._refusal(seen, seen.retry_after - age)
        sent = _clock.monotonic()
        state = self.state.backend.breaker_admit(self._key, self.trial_for, self.ttl)
        self._see(state, sent)
        if state.trial:
            self._set_trial(state.fence)
            return
        if state.state != "closed":
            raise self._refusal(state, state.retry_after)

    def success(self) -> None:
        """Report that the admitted call succeeded: a trial closes the circuit; otherwise this
        writes only if this process saw consecutive failures to reset."""
        fence = self._trial()
        seen = self._seen
        if fence == 0 and (seen is None or seen.failures == 0):
            return
        if fence:
            self._set_trial(0)
        sent = _clock.monotonic()
        state = self.state.backend.breaker_record(
            self._key, fence, True, self.threshold, self.cooldown, self.ttl
        )
        self._see(state, sent)

    def failure(self, exc: BaseException | None = None) -> None:
        """Report that the admitted call failed in a way that counts against the dependency."""
        fence = self._trial()
        self._set_trial(0)
        sent = _clock.monotonic()
        state = self.state.backend.breaker_record(
            self._key, fence, False, self.threshold, self.cooldown, self.ttl
        )
        self._see(state, sent)

    def __enter__(self) -> CircuitBreaker:
        self.before()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.success()
        elif isinstance(exc, Exception):
            self.failure(exc)
        else:
            self._set_trial(0)  # cancelled: the trial runs out and another caller gets one


class SpendHold:
    """A reservation of a spend budget; settle it with the actual amount (see
    :meth:`SpendBudget.reserve`)."""

    def __init__(self, budget: SpendBudget, hold: CounterHold, scope: str) -> None:
        self.budget = budget
        self.scope = scope
        self.estimate = hold.units
        self.actual: int | None = None
        self._hold = hold

    def settle(self, actual: int) -> None:
        """Record what the call really spent in place of the estimate, in one atomic step.

        Raises:
            InvalidInput: ``actual`` is not a non-negative integer.
            HoldLost: the reservation ran out first (the process froze past its TTL).
        """
        actual = check.integer(actual, "actual", low=0, high=check.EXACT_INT)
        self._hold.commit(units=actual)
        self.actual = actual

    def __enter__(self) -> SpendHold:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._hold.__exit__(exc_type, exc, tb)


class SpendBudget:
    """A spend limit of one kind, shared by every process working for one root task.

    Args:
        state: the shared state of the store that keeps the budget.
        kind: what is counted: ``"usd"`` (in micro-dollars: 1 USD = 1_000_000), ``"tokens"``,
            any name.
        limit: the limit, in integer units; set once per scope and kind (a different limit
            later is refused). ``None`` uses the limit already set.
        scope: a fixed scope; by default the current root task.
        hold_ttl: seconds an unsettled reservation outlives its holder's last renewal.

    Raises:
        InvalidInput: a bad kind, limit or duration.
    """

    def __init__(
        self,
        state: SharedState,
        kind: str,
        *,
        limit: int | None = None,
        scope: str | None = None,
        hold_ttl: float = 30.0,
    ) -> None:
        self.state = state
        self.kind = _guards.field_name(kind)
        self.limit = (
            None if limit is None else check.integer(limit, "limit", low=0, high=check.EXACT_INT)
        )
        self.scope = None if scope is None else _guards.record_key(scope)
        self.hold_ttl = check.duration(hold_ttl, "hold_ttl")
        self._limits: dict[str, int] = {}

    def _limit(self, scope: str) -> int:
        known = self._limits.get(scope)
        if known is not None:
            return known
        key = f"spend-limit:{scope}"
        current = self.state.get(key)
        stored = current.value.get(self.kind)
        if stored is None and self.limit is not None:
            try:
                self.state.set_field(
                    key, self.kind, self.limit, expected_version=current.version
                )
                stored = self.limit
            except ConflictError:
                stored = (self.state.get(key)).value.get(self.kind)
        if stored is None:
            raise InvalidInput(
                f"no {self.kind!r} limit is set for {scope!r}: give limit=... the first time"
            )
        if not isinstance(stored, int) or isinstance(stored, bool):
            raise InvalidInput(f"the stored {self.kind!r} limit of {scope!r} is not an integer")
        if self.limit is not None and stored != self.limit:
            raise InvalidInput(
                f"the {self.kind!r} limit of {scope!r} is {stored}; a different limit"
                f" ({self.limit}) is refused"
            )
        self._limits[scope] = stored
        return stored

    def _counter(self, scope: str) -> str:
        return _guards.record_key(f"spend:{scope}:{self.kind}")

    def spent(self, scope: str | None = None) -> int:
        """Units spent or reserved so far in the scope (unsettled reservations included)."""
        key = _scope(scope or self.scope, "a spend budget")
        return self.state.counter(self._counter(key))

    def reserve(self, estimate: int, *, scope: str | None = None) -> SpendHold:
        """Reserve ``estimate`` units before a call; use the result as a context manager and
        :meth:`SpendHold.settle` it with the actual amount (leaving the block unsettled
        gives the reservation back)::

            with budget.reserve(2_000) as spend:
                reply = llm(...)
                spend.settle(reply.cost_micro_usd)

        Raises:
            BudgetExceeded: the reservation would cross the limit; nothing was reserved.
            InvalidInput: no limit was ever set for the scope, or a different one was.
        """
        key = _scope(scope or self.scope, "a spend budget")
        estimate = check.integer(estimate, "estimate", low=1, high=check.EXACT_INT)
        limit = self._limit(key)
        hold = self.state.hold(self._counter(key), estimate, limit=limit, ttl=self.hold_ttl)
        try:
            hold.__enter__()
        except LimitReached as refused:
            spent = self.state.counter(self._counter(key))
            raise BudgetExceeded(key, self.kind, limit, spent, estimate) from refused
        return SpendHold(self, hold, key)
