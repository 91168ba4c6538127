"""Retry discipline with real processes on real stores (SQLite, Redis, Redis Cluster, PostgreSQL).

- **Retry storm.** Eight processes make one request each against a dependency that fails for a
  while, each allowed three retries. Without a budget the dependency sees 4 calls per process;
  with the retry budget they share through the store (ratio 0.1, minimum 3), it sees at most
  ``calls * (1 + ratio) + minimum``.
- **Breaker.** Four processes hammer a dependency that fails, then recovers, through one
  circuit breaker shared in the store: once the circuit opens the dependency sees no ordinary
  call (after the breaker's stated staleness), each half-open window admits exactly one trial
  across the four, and after a trial succeeds calls flow again. The refusals are JSON payloads.
- **Spend.** Eight processes reserve, spend and settle against one limit until it refuses
  them: the total never passes the limit and equals what they settled. A process SIGKILLed
  between reserving and settling gives its reservation back once the hold's TTL runs out.
- **A frozen trial.** A process SIGSTOPped while it holds the half-open trial loses its turn; its
  late success does not close the circuit that a later trial reopened.

The memory store, which processes cannot share, is covered with threads in
tests/contract/test_budgets.py.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

import agentlease as al
from tests.acceptance._idempotency_child import read_ledger
from tests.acceptance.test_idempotency_processes import Children, of

pytestmark = pytest.mark.xdist_group("processes")  # many processes on short timings

FAIL_FOR = 1.0  # the dependency's outage in the storm (the retries end well inside it)
STORM = 8
RATIO, MINIMUM = 0.1, 3


class RetryChildren(Children):
    """Children running tests/acceptance/_retry_child.py."""

    module = "tests.acceptance._retry_child"


def _go(kids: Children, path: Path, count: int, go: Path) -> None:
    """Wait until ``count`` children are ready, then give them a common start time."""
    kids.wait_for("every child ready", lambda: len(of(read_ledger(path), "ready")) == count)
    tmp = go.with_suffix(".tmp")
    tmp.write_text(repr(time.time() + 0.2))
    tmp.rename(go)


def _storm(url: str, tmp_path: Path, budget: bool) -> list[dict[str, object]]:
    path, go = tmp_path / f"storm-{int(budget)}.jsonl", tmp_path / "go"
    kids = RetryChildren(tmp_path)
    try:
        procs = [
            kids.spawn("storm", url, path, go, FAIL_FOR, "request-1", int(budget))
            for _ in range(STORM)
        ]
        _go(kids, path, STORM, go)
        for proc in procs:
            assert kids.finish(proc) == 0, kids.stderr()
    finally:
        kids.reap()
    return read_ledger(path)


def test_without_a_budget_the_dependency_sees_every_retry(tmp_path: Path) -> None:
    lines = _storm(f"sqlite:///{tmp_path / 'store.db'}", tmp_path, budget=False)
    assert len(of(lines, "call")) == STORM * 4  # one request became 32 calls
    assert len(of(lines, "outcome", outcome="failed")) == STORM


def test_a_shared_budget_bounds_the_storm(url: str, tmp_path: Path) -> None:
    lines = _storm(url, tmp_path, budget=True)
    calls = len(of(lines, "call"))
    bound = STORM * (1 + RATIO) + MINIMUM
    assert STORM < calls <= bound, f"{calls} calls for {STORM} requests (bound {bound})"
    refused = of(lines, "outcome", outcome="budget")
    assert len(refused) + len(of(lines, "outcome", outcome="failed")) == STORM
    assert refused, "the budget refused no retry"
    payload = refused[0]["payload"]
    assert isinstance(payload, dict)
    assert payload["reason"] == "retry_budget"
    assert payload["do_not_retry"] is True
    assert payload["retries"] <= MINIMUM
    json.dumps(payload)


def test_an_open_breaker_lets_one_trial_through_per_window(url: str, tmp_path: Path) -> None:
    path, go = tmp_path / "breaker.jsonl", tmp_path / "go"
    kids = RetryChildren(tmp_path)
    dependency = "payments-api"
    try:
        procs = [kids.spawn("breaker", url, path, go, 1.2, 2.4, dependency) for _ in range(4)]
        _go(kids, path, 4, go)
        for proc in procs:
            assert kids.finish(proc) == 0, kids.stderr()
    finally:
        kids.reap()
    lines = read_ledger(path)
    calls = of(lines, "call")
    opened = of(lines, "opened")
    closed = of(lines, "closed")
    assert opened, "the circuit never opened"
    assert closed, "no trial closed the circuit after the dependency recovered"
    trials = [c for c in calls if c["fence"]]
    fences = [c["fence"] for c in trials]
    assert len(fences) == len(set(fences)), f"a half-open window let two trials in: {fences}"
    t_open = min(float(o["t"]) for o in opened)
    # The store closed the circuit after the first successful trial call reached the dependency
    # (its "closed" line may be written later still): calls admitted after that are legitimate.
    first_close = min(closed, key=lambda c: float(c["t"]))
    t_close = next(float(c["t"]) for c in trials if c["fence"] == first_close["fence"])
    # A process trusts a closed state for `staleness` after it asked the store, and the store
    # opened the circuit before the first process learned it had (t_open): so no ordinary call
    # was admitted (asked) later than t_open + staleness, however late it reached the dependency.
    staleness = 0.1
    ordinary = [
        c
        for c in calls
        if not c["fence"] and t_open + staleness < float(c["asked"]) and float(c["t"]) < t_close
    ]
    assert ordinary == [], f"{len(ordinary)} ordinary calls reached the dependency while open"
    assert any(float(c["t"]) > t_close and not c["fence"] for c in calls), "calls never resumed"
    refused = of(lines, "refused")
    assert refused
    payload = refused[0]["payload"]
    assert isinstance(payload, dict)
    assert payload["reason"] == "circuit_open"
    assert payload["dependency"] == dependency
    assert payload["do_not_retry"] is True
    assert payload["retry_after_s"] is not None


def test_concurrent_spenders_never_pass_the_limit(url: str, tmp_path: Path) -> None:
    path, limit = tmp_path / "spend.jsonl", 5_000
    kids = RetryChildren(tmp_path)
    try:
        procs = [kids.spawn("spend", url, path, "request-9", limit, seed) for seed in range(8)]
        for proc in procs:
            assert kids.finish(proc) == 0, kids.stderr()
    finally:
        kids.reap()
    lines = read_ledger(path)
    assert len(of(lines, "done")) == 8
    settled = sum(int(line["amount"]) for line in of(lines, "spent"))
    with al.SharedState.connect(url) as state:
        budget = al.SpendBudget(state, "usd", scope="request-9")
        spent = budget.spent()
    assert spent == settled
    assert spent <= limit
    assert spent > limit // 2  # they stopped because it was (nearly) full, not earlier


def test_a_spender_killed_mid_call_gives_its_reservation_back(url: str, tmp_path: Path) -> None:
    path, limit = tmp_path / "die.jsonl", 1_000
    kids = RetryChildren(tmp_path)
    try:
        proc = kids.spawn("spend-and-die", url, path, "request-7", limit, 900)
        kids.finish(proc)
    finally:
        kids.reap()
    assert of(read_ledger(path), "reserved"), kids.stderr()
    with al.SharedState.connect(url) as state:
        budget = al.SpendBudget(state, "usd", limit=limit, scope="request-7")
        with pytest.raises(al.BudgetExceeded):
            budget.reserve(200)  # the dead process's 900 are still held
        deadline = time.monotonic() + 10
        while True:  # its hold's TTL (1 s) runs out on the store's clock: the 900 come back
            try:
                with budget.reserve(200) as hold:
                    hold.settle(150)
                break
            except al.BudgetExceeded:
                assert time.monotonic() < deadline, "the dead spender's reservation never came back"
                time.sleep(0.1)
        assert budget.spent() == 150


def test_a_frozen_trial_that_lost_its_turn_cannot_close_the_circuit(
    url: str, tmp_path: Path
) -> None:
    """A process takes the half-open trial and is SIGSTOPped past its turn; another caller gets
    the next trial and it fails (the circuit opens again); the frozen process resumes and
    reports success: its fence is stale, the circuit stays open."""
    path, go, dependency = tmp_path / "trial.jsonl", tmp_path / "go", "frozen-dep"
    kids = RetryChildren(tmp_path)
    with al.SharedState.connect(url) as state:
        here = al.CircuitBreaker(
            state, dependency, threshold=1, cooldown=0.3, trial_for=0.3, staleness=0.0
        )
        here.before()
        here.failure()  # open
        time.sleep(0.35)
        # The next trial's failure reopens the circuit for long (a cooldown is the recorder's).
        reopener = al.CircuitBreaker(
            state, dependency, threshold=1, cooldown=60, trial_for=0.3, staleness=0.0
        )
        try:
            proc = kids.spawn("trial", url, path, go, dependency)
            kids.wait_for("the child's trial", lambda: bool(of(read_ledger(path), "trial")))
            proc.send_signal(signal.SIGSTOP)
            first = of(read_ledger(path), "trial")[0]["fence"]
            assert first > 0
            time.sleep(0.35)  # past the frozen trial's turn
            reopener.before()  # the next trial is this caller's
            assert reopener.seen is not None
            assert reopener.seen.fence == first + 1
            reopener.failure()  # it failed: open again, for a minute
            proc.send_signal(signal.SIGCONT)
            go.touch()
            assert kids.finish(proc) == 0, kids.stderr()
        finally:
            kids.reap()
        assert of(read_ledger(path), "reported")[0]["state"] == "open"
        with pytest.raises(al.CircuitOpen) as caught:
            reopener.before()
        assert caught.value.state == "open"
