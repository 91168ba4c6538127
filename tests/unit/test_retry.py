"""al.retry: only the named errors are retried, within the attempts and the deadline, with the
budget's and the breaker's hooks called in their order, on both faces."""

from __future__ import annotations

import asyncio
import inspect
import math
import random
import time

import pytest

import agentlease as al
from agentlease._retry import NEVER_RETRIED

TINY = 0.001  # a backoff bound small enough that the sleeps cost nothing


class Flaky:
    """Raises the given errors in turn, then returns "ok"; counts its calls."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.raised: list[BaseException] = []

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            exc = self.errors.pop(0)
            self.raised.append(exc)
            raise exc
        return "ok"


def test_retries_the_named_errors_until_success() -> None:
    flaky = Flaky(OSError("a"), ConnectionError("b"))
    assert al.retry(on=OSError, base=TINY)(flaky)() == "ok"
    assert flaky.calls == 3


def test_a_tuple_of_types_and_a_predicate() -> None:
    flaky = Flaky(KeyError("a"), OSError("b"))
    assert al.retry(on=(KeyError, OSError), base=TINY)(flaky)() == "ok"
    assert flaky.calls == 3

    def transient(exc: BaseException) -> bool:
        return isinstance(exc, OSError) and exc.errno == 11

    flaky = Flaky(OSError(11, "again"), OSError(2, "no such file"))
    with pytest.raises(OSError, match="no such file"):
        al.retry(on=transient, base=TINY)(flaky)()
    assert flaky.calls == 2


def test_other_errors_propagate_at_once() -> None:
    flaky = Flaky(ValueError("bug"))
    with pytest.raises(ValueError, match="bug"):
        al.retry(on=OSError, base=TINY)(flaky)()
    assert flaky.calls == 1


def test_the_attempts_bound_and_the_last_error_propagates_unchanged() -> None:
    flaky = Flaky(*(OSError(f"failure {n}") for n in range(10)))
    with pytest.raises(OSError, match="failure 3") as caught:
        al.retry(on=OSError, attempts=4, base=TINY)(flaky)()
    assert flaky.calls == 4
    assert caught.value is flaky.raised[-1]
    assert caught.value.__cause__ is None

    once = Flaky(OSError("only"))
    with pytest.raises(OSError, match="only"):
        al.retry(on=OSError, attempts=1)(once)()
    assert once.calls == 1


@pytest.mark.parametrize(
    "exc",
    [
        al.DeadlineExceeded(),
        al.CircuitOpen("db", "open", 5, 3.0),
        al.RetryBudgetExhausted("root", 10, 3, 3.0),
        al.Cancelled("stopped"),
        asyncio.CancelledError(),
        KeyboardInterrupt(),
    ],
    ids=lambda e: type(e).__name__,
)
def test_stop_errors_are_never_retried_even_by_a_predicate_that_says_yes(
    exc: BaseException,
) -> None:
    flaky = Flaky(exc)
    with pytest.raises(type(exc)):
        al.retry(on=lambda e: True, base=TINY)(flaky)()
    assert flaky.calls == 1
    flaky = Flaky(exc)
    with pytest.raises(type(exc)):  # a parent of the refusals may be named; they still stop
        al.retry(on=(al.AgentLeaseError, OSError), base=TINY)(flaky)()
    assert flaky.calls == 1


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"on": Exception}, al.InvalidInput),
        ({"on": BaseException}, al.InvalidInput),
        ({"on": (OSError, Exception)}, al.InvalidInput),
        ({"on": ()}, al.InvalidInput),
        ({"on": None}, al.InvalidInput),
        ({"on": int}, al.InvalidInput),
        ({"on": "OSError"}, al.InvalidInput),
        ({"on": al.DeadlineExceeded}, al.InvalidInput),
        ({"on": al.CircuitOpen}, al.InvalidInput),
        ({"on": asyncio.CancelledError}, al.InvalidInput),
        ({"on": KeyboardInterrupt}, al.InvalidInput),
        ({"on": OSError, "attempts": 0}, al.InvalidInput),
        ({"on": OSError, "attempts": True}, al.InvalidInput),
        ({"on": OSError, "attempts": 2.0}, al.InvalidInput),
        ({"on": OSError, "base": 0}, al.InvalidDuration),
        ({"on": OSError, "base": -1}, al.InvalidDuration),
        ({"on": OSError, "cap": math.inf}, al.InvalidDuration),
        ({"on": OSError, "cap": "10"}, al.InvalidDuration),
        ({"on": OSError, "jitter": 1}, al.InvalidInput),
        ({"on": OSError, "rand": 42}, al.InvalidInput),
        ({"on": OSError, "budget": object()}, al.InvalidInput),
        ({"on": OSError, "breaker": object()}, al.InvalidInput),
    ],
)
def test_arguments_are_refused_with_typed_errors(
    kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        al.retry(**kwargs)  # type: ignore[arg-type]


def test_every_never_retried_type_is_refused_as_on() -> None:
    for kind in NEVER_RETRIED:
        with pytest.raises(al.InvalidInput, match="never retried"):
            al.retry(on=kind)


def test_the_exact_backoff_without_jitter_and_the_full_jitter_bound() -> None:
    exact = al.retry(on=OSError, base=0.5, cap=3.0, jitter=False)
    assert [exact.backoff(n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert exact.backoff(10_000) == 3.0
    jittered = al.retry(on=OSError, base=0.5, cap=3.0, rand=random.Random(1))
    for n in range(6):
        for _ in range(50):
            assert 0.0 <= jittered.backoff(n) <= min(3.0, 0.5 * 2**n)


def test_the_iterator_numbers_attempts_and_reports_the_delays() -> None:
    seen = []
    flaky = Flaky(OSError(), OSError())
    for attempt in al.retry(on=OSError, base=TINY, cap=1.0, jitter=False):
        seen.append((attempt.number, attempt.delay))
        with attempt:
            flaky()
    assert seen == [(1, 0.0), (2, TINY), (3, 2 * TINY)]


def test_the_iterator_lets_the_last_error_out_unchanged() -> None:
    flaky = Flaky(*(OSError(f"failure {n}") for n in range(3)))

    def loop() -> None:
        for attempt in al.retry(on=OSError, attempts=3, base=TINY):
            with attempt:
                flaky()

    with pytest.raises(OSError, match="failure 2") as caught:
        loop()
    assert caught.value is flaky.raised[-1]


def test_the_decorator_keeps_the_function_s_identity() -> None:
    def fetch(url: str) -> str:
        """Fetch it."""
        return url

    async def afetch(url: str) -> str:
        """Fetch it, async."""
        return url

    wrapped = al.retry(on=OSError)(fetch)
    awrapped = al.retry(on=OSError)(afetch)
    assert wrapped.__name__ == "fetch"
    assert wrapped.__doc__ == "Fetch it."
    assert wrapped.__wrapped__ is fetch  # type: ignore[attr-defined]
    assert inspect.iscoroutinefunction(awrapped)
    assert not inspect.iscoroutinefunction(wrapped)
    assert wrapped("x") == "x"
    assert asyncio.run(awrapped("y")) == "y"


# The deadline.


def test_no_sleep_that_would_reach_the_deadline() -> None:
    flaky = Flaky(OSError("slow"))
    with al.deadline(30):
        with pytest.raises(al.DeadlineExceeded) as caught:
            al.retry(on=OSError, base=60.0, cap=60.0, jitter=False)(flaky)()
        # It gave up at once: it neither slept the 60 s backoff nor waited for the deadline.
        left = al.remaining()
        assert left is not None
        assert left > 0
    assert flaky.calls == 1
    assert caught.value.__cause__ is flaky.raised[0]
    assert "within the next backoff" in str(caught.value)
    assert caught.value.payload()["reason"] == "deadline"


def test_a_deadline_that_passed_stops_before_the_first_attempt() -> None:
    flaky = Flaky()
    with al.deadline(0.01):
        time.sleep(0.02)
        with pytest.raises(al.DeadlineExceeded):
            al.retry(on=OSError)(flaky)()
    assert flaky.calls == 0


def test_an_attempt_that_ran_past_the_deadline_is_not_retried() -> None:
    calls = 0

    def slow() -> None:
        nonlocal calls
        calls += 1
        time.sleep(0.03)
        raise OSError("late")

    with al.deadline(0.01), pytest.raises(al.DeadlineExceeded) as caught:
        al.retry(on=OSError, base=TINY)(slow)()
    assert calls == 1
    assert isinstance(caught.value.__cause__, OSError)


async def test_no_async_sleep_that_would_reach_the_deadline() -> None:
    calls = 0

    @al.retry(on=OSError, base=60.0, cap=60.0, jitter=False)
    async def slow() -> None:
        nonlocal calls
        calls += 1
        raise OSError("slow")

    async with al.deadline(30):
        with pytest.raises(al.DeadlineExceeded) as caught:
            await slow()
        left = al.remaining()
        assert left is not None
        assert left > 0
    assert calls == 1
    assert isinstance(caught.value.__cause__, OSError)


# The hooks.


class Hooks:
    """A fake budget and breaker that log each call; the budget allows ``retries`` retries,
    the breaker refuses once ``open_after`` attempts were admitted."""

    def __init__(self, *, retries: int = 100, open_after: int = 100) -> None:
        self.log: list[str] = []
        self.retries = retries
        self.open_after = open_after
        self.admitted = 0

    def record_call(self) -> None:
        self.log.append("record_call")

    def acquire_retry(self) -> None:
        self.log.append("acquire_retry")
        if self.retries == 0:
            raise al.RetryBudgetExhausted("root", 1, 0, 0.0)
        self.retries -= 1

    def before(self) -> None:
        self.log.append("before")
        if self.admitted >= self.open_after:
            raise al.CircuitOpen("dep", "open", 3, 5.0)
        self.admitted += 1

    def success(self) -> None:
        self.log.append("success")

    def failure(self, exc: BaseException) -> None:
        self.log.append(f"failure:{type(exc).__name__}")


class AsyncHooks(Hooks):
    async def record_call(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        super().record_call()

    async def acquire_retry(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        super().acquire_retry()

    async def before(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        super().before()

    async def success(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        super().success()

    async def failure(self, exc: BaseException) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        super().failure(exc)


TWO_FAILURES_THEN_OK = [
    "before",
    "record_call",
    "failure:OSError",
    "acquire_retry",
    "before",
    "failure:OSError",
    "acquire_retry",
    "before",
    "success",
]


def test_the_hooks_in_order_on_the_sync_face() -> None:
    hooks = Hooks()
    call = al.retry(on=OSError, base=TINY, budget=hooks, breaker=hooks)(Flaky(OSError(), OSError()))
    assert call() == "ok"
    assert hooks.log == TWO_FAILURES_THEN_OK
    hooks.log.clear()
    assert call() == "ok"  # a second call is recorded as a call
    assert hooks.log == ["before", "record_call", "success"]


async def test_the_hooks_are_awaited_in_order_on_the_async_face() -> None:
    hooks = AsyncHooks()
    flaky = Flaky(OSError(), OSError())

    @al.retry(on=OSError, base=TINY, budget=hooks, breaker=hooks)
    async def call() -> str:
        return flaky()

    assert await call() == "ok"
    assert hooks.log == TWO_FAILURES_THEN_OK

    hooks.log.clear()
    flaky = Flaky(OSError())
    async for attempt in al.retry(on=OSError, base=TINY, budget=hooks, breaker=hooks):
        async with attempt:
            flaky()
    assert hooks.log == [
        "before",
        "record_call",
        "failure:OSError",
        "acquire_retry",
        "before",
        "success",
    ]


def test_the_last_failure_is_reported_to_the_breaker_and_a_bug_is_not() -> None:
    hooks = Hooks()
    with pytest.raises(OSError, match="second"):
        al.retry(on=OSError, attempts=2, base=TINY, budget=hooks, breaker=hooks)(
            Flaky(OSError("first"), OSError("second"))
        )()
    assert hooks.log == [
        "before",
        "record_call",
        "failure:OSError",
        "acquire_retry",
        "before",
        "failure:OSError",
    ]
    hooks.log.clear()
    with pytest.raises(ValueError, match="bug"):
        al.retry(on=OSError, budget=hooks, breaker=hooks)(Flaky(ValueError("bug")))()
    assert hooks.log == ["before", "record_call"]


def test_a_spent_budget_stops_at_once_with_the_last_error_attached() -> None:
    hooks = Hooks(retries=1)
    flaky = Flaky(OSError("first"), OSError("second"), OSError("third"))
    with pytest.raises(al.RetryBudgetExhausted) as caught:
        al.retry(on=OSError, attempts=5, base=TINY, budget=hooks)(flaky)()
    assert flaky.calls == 2
    assert caught.value.__context__ is flaky.raised[-1]
    assert hooks.log == ["record_call", "acquire_retry", "acquire_retry"]


async def test_a_spent_budget_stops_the_async_face_too() -> None:
    hooks = AsyncHooks(retries=0)
    flaky = Flaky(OSError("first"), OSError("second"))

    async def loop() -> None:
        async for attempt in al.retry(on=OSError, base=TINY, budget=hooks):
            async with attempt:
                flaky()

    with pytest.raises(al.RetryBudgetExhausted) as caught:
        await loop()
    assert flaky.calls == 1
    assert caught.value.__context__ is flaky.raised[0]


def test_an_open_circuit_stops_at_once_and_is_not_counted_as_a_call() -> None:
    hooks = Hooks(open_after=1)
    flaky = Flaky(OSError("first"), OSError("second"))
    with pytest.raises(al.CircuitOpen) as caught:
        al.retry(on=OSError, attempts=5, base=TINY, budget=hooks, breaker=hooks)(flaky)()
    assert flaky.calls == 1
    assert caught.value.__context__ is flaky.raised[0]
    hooks.log.clear()
    with pytest.raises(al.CircuitOpen):
        al.retry(on=OSError, budget=hooks, breaker=hooks)(flaky)()
    assert hooks.log == ["before"]


def test_awaited_hooks_are_refused_on_the_sync_face() -> None:
    with pytest.raises(al.InvalidInput, match="must be awaited"):
        al.retry(on=OSError, budget=AsyncHooks())(Flaky())()
    with pytest.raises(al.InvalidInput, match="must be awaited"):
        for _attempt in al.retry(on=OSError, breaker=AsyncHooks()):
            pass


async def test_a_plain_with_on_the_async_face() -> None:
    hooks = Hooks()  # plain methods: a plain `with` can call the breaker
    flaky = Flaky(OSError())
    async for attempt in al.retry(on=OSError, base=TINY, breaker=hooks):
        with attempt:
            result = flaky()
    assert result == "ok"
    assert hooks.log == ["before", "failure:OSError", "before", "success"]

    async def plain_with() -> None:
        async for attempt in al.retry(on=OSError, breaker=AsyncHooks()):
            with attempt:
                pass

    with pytest.raises(al.InvalidInput, match="async with attempt"):
        await plain_with()


async def test_an_attempt_of_a_sync_loop_is_not_entered_with_async_with() -> None:
    async def async_with() -> None:
        for attempt in al.retry(on=OSError):
            async with attempt:
                pass

    with pytest.raises(al.InvalidInput, match="with attempt"):
        await async_with()


async def test_the_async_iterator_retries_and_lets_the_last_error_out() -> None:
    flaky = Flaky(*(OSError(f"failure {n}") for n in range(5)))
    numbers = []

    async def loop() -> None:
        async for attempt in al.retry(on=OSError, attempts=3, base=TINY):
            numbers.append(attempt.number)
            async with attempt:
                flaky()

    with pytest.raises(OSError, match="failure 2") as caught:
        await loop()
    assert numbers == [1, 2, 3]
    assert caught.value is flaky.raised[-1]


async def test_cancellation_is_never_retried_on_the_async_face() -> None:
    started = asyncio.Event()
    calls = 0

    @al.retry(on=lambda e: True, base=TINY)
    async def hang() -> None:
        nonlocal calls
        calls += 1
        started.set()
        await asyncio.sleep(3600)

    task = asyncio.create_task(hang())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == 1


def test_stop_returns_before_the_next_attempt_when_the_block_is_skipped() -> None:
    numbers = []
    for attempt in al.retry(on=OSError):
        numbers.append(attempt.number)
    assert numbers == [1]
