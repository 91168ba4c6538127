"""The processes of tests/acceptance/test_retry_processes.py.

    python -m tests.acceptance._retry_child storm URL LEDGER GO FAIL_FOR SCOPE BUDGET
    python -m tests.acceptance._retry_child breaker URL LEDGER GO FAIL_FOR RUN_FOR DEPENDENCY
    python -m tests.acceptance._retry_child spend URL LEDGER SCOPE LIMIT SEED
    python -m tests.acceptance._retry_child spend-and-die URL LEDGER SCOPE LIMIT ESTIMATE
    python -m tests.acceptance._retry_child trial URL LEDGER GO DEPENDENCY

Each waits for the file ``GO``, which holds the common start time (wall clock). The dependency
is a function that writes a ``call`` line to the shared ``O_APPEND`` ledger (what the dependency
saw, with the time) and fails for ``FAIL_FOR`` seconds after the start.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path

import agentlease as al
from tests.acceptance._idempotency_child import BARRIER_TIMEOUT, Ledger


class DependencyDown(Exception):
    """The dependency failed (a 503)."""


def _dependency(ledger: Ledger, fail_until: float, **fields: object) -> None:
    now = time.time()
    ledger.write("call", t=now, **fields)
    if now < fail_until:
        raise DependencyDown("503")


def _start(ledger: Ledger, go: str) -> float:
    """Say ready, wait for the test's ``go`` file, sleep until the start time it holds."""
    ledger.write("ready")
    until = time.monotonic() + BARRIER_TIMEOUT
    path = Path(go)
    while not path.exists():
        if time.monotonic() > until:
            raise SystemExit("the test never said go")
        time.sleep(0.005)
    start = float(path.read_text())
    time.sleep(max(0.0, start - time.time()))
    return start


def storm(url: str, path: str, go: str, fail_for: str, scope: str, budget: str) -> int:
    """One request, three retries at most, against a dependency that fails for a while: with
    ``BUDGET=1`` the retries draw on the budget shared with the other processes of ``SCOPE``."""
    ledger = Ledger(path)
    with al.SharedState.connect(url) as state:
        shared = al.RetryBudget(state, scope=scope) if budget == "1" else None
        fail_until = _start(ledger, go) + float(fail_for)
        try:
            for attempt in al.retry(on=DependencyDown, attempts=4, base=0.05, budget=shared):
                with attempt:
                    _dependency(ledger, fail_until)
            ledger.write("outcome", outcome="ok")
        except al.RetryBudgetExhausted as refused:
            ledger.write("outcome", outcome="budget", payload=refused.payload())
        except DependencyDown:
            ledger.write("outcome", outcome="failed")
    ledger.close()
    return 0


def breaker(url: str, path: str, go: str, fail_for: str, run_for: str, dependency: str) -> int:
    """Call the dependency through a shared breaker as fast as it lets us until ``STOP``."""
    ledger = Ledger(path)
    with al.SharedState.connect(url) as state:
        guard = al.CircuitBreaker(
            state, dependency, threshold=3, cooldown=0.4, staleness=0.1, trial_for=0.4
        )
        start = _start(ledger, go)
        fail_until, stop = start + float(fail_for), start + float(run_for)
        refusals = 0
        while time.time() < stop:
            asked = time.time()  # the breaker decides at or after this: the staleness bound's clock
            try:
                guard.before()
            except al.CircuitOpen as refused:
                if refusals == 0:
                    ledger.write("refused", payload=refused.payload())
                refusals += 1
                time.sleep(0.01)
                continue
            fence = guard._trial()
            try:
                _dependency(ledger, fail_until, fence=fence, asked=asked)
            except DependencyDown:
                guard.failure()
                seen = guard.seen
                if seen is not None and seen.state == "open":
                    ledger.write("opened", t=time.time(), fence=fence)
            else:
                guard.success()
                if fence:
                    ledger.write("closed", t=time.time(), fence=fence)
            time.sleep(0.005)
        ledger.write("done", refusals=refusals)
    ledger.close()
    return 0


def spend(url: str, path: str, scope: str, limit: str, seed: str) -> int:
    """Reserve, call, settle, until the budget refuses five times in a row."""
    ledger = Ledger(path)
    rand = random.Random(int(seed))
    with al.SharedState.connect(url) as state:
        budget = al.SpendBudget(state, "usd", limit=int(limit), scope=scope)
        refused = 0
        while refused < 5:
            estimate = rand.randint(1, 200)
            try:
                hold = budget.reserve(estimate)
            except al.BudgetExceeded:
                refused += 1
                continue
            refused = 0
            with hold:
                actual = rand.randint(0, estimate)
                hold.settle(actual)
            ledger.write("spent", amount=actual, estimate=estimate)
        ledger.write("done")
    ledger.close()
    return 0


def spend_and_die(url: str, path: str, scope: str, limit: str, estimate: str) -> int:
    """Reserve ``estimate`` under a 1 s hold TTL, say so, and SIGKILL itself before settling."""
    ledger = Ledger(path)
    with al.SharedState.connect(url) as state:
        budget = al.SpendBudget(state, "usd", limit=int(limit), scope=scope, hold_ttl=1.0)
        budget.reserve(int(estimate))
        ledger.write("reserved", estimate=int(estimate))
        os.kill(os.getpid(), signal.SIGKILL)
    return 1


def trial(url: str, path: str, go: str, dependency: str) -> int:
    """Take the half-open trial of an open breaker, then wait for the test's ``go`` file (the
    test freezes this process meanwhile) and report the trial a success."""
    ledger = Ledger(path)
    with al.SharedState.connect(url) as state:
        guard = al.CircuitBreaker(state, dependency, threshold=1, cooldown=0.3, staleness=0.0)
        guard.before()
        ledger.write("trial", fence=guard._trial())
        until = time.monotonic() + BARRIER_TIMEOUT
        while not Path(go).exists():
            if time.monotonic() > until:
                raise SystemExit("the test never said go")
            time.sleep(0.005)
        guard.success()
        seen = guard.seen
        ledger.write("reported", state=None if seen is None else seen.state)
    ledger.close()
    return 0


def main(argv: list[str]) -> int:
    command, rest = argv[0], argv[1:]
    if command == "storm":
        return storm(*rest)
    if command == "breaker":
        return breaker(*rest)
    if command == "spend":
        return spend(*rest)
    if command == "spend-and-die":
        return spend_and_die(*rest)
    if command == "trial":
        return trial(*rest)
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
