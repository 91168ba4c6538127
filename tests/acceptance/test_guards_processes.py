"""Shared-state guards with real processes on real stores: SQLite, Redis, Redis Cluster and
PostgreSQL (the memory store, which processes cannot share, is covered with threads in
tests/contract/test_shared_state.py).

Each anomaly is forced on every round by file barriers (see ``tests/acceptance/_guards_child.py``):
the processes all read or check before any of them writes. So the naive code is shown to break,
deterministically, and the same schedule through the guard is shown never to:

- lost update: blind read-modify-write of a whole list loses every update but one per round;
  ``update`` (compare-and-set, re-read and re-apply) loses none, and the record's version counts
  every write;
- write skew: the rota loses its last doctor and the last slot is allocated twice without the
  guard; with a bounded counter (``take(minimum=1)``, ``reserve(limit=)``) never;
- deadlock: processes locking {A, B} in opposite orders all finish (the set is acquired in
  canonical order, all or nothing), one holder at a time, with fencing tokens rising;
- a holder SIGKILLed while holding a lock set loses it once its TTL runs out, and the next holder
  gets a higher fencing token;
- a holder frozen (SIGSTOP) past its TTL and resumed after another took the lock has its late
  write refused (FencedOff) and its lock set reports LockLost; the record keeps the new value.

A few rounds by default; AGENTLEASE_DEEP=1 runs many more (and more seeds).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

import agentlease as al
from tests.acceptance._guards_child import (
    DOCTORS,
    SLOTS,
    capacity_key,
    on_call_key,
    rota_key,
    slots_key,
)
from tests.acceptance._idempotency_child import read_ledger
from tests.acceptance.test_idempotency_processes import (
    BOUND,
    Children,
    of,
    wait_stopped,
)

# Many real processes (SIGKILL, SIGSTOP) on short leases: the "processes" group runs one test at
# a time on one xdist worker, so they starve neither each other nor the servers' connections.
pytestmark = pytest.mark.xdist_group("processes")

DEEP = os.environ.get("AGENTLEASE_DEEP") == "1"
SEEDS = list(range(3)) if DEEP else [0]
WRITERS = 3  # processes racing on one record (lost update)
WRITE_ROUNDS = 60 if DEEP else 12
SKEW_ROUNDS = 40 if DEEP else 8
LOCKERS = 4 if DEEP else 2  # half lock [A, B], half [B, A]
LOCK_ROUNDS = 150 if DEEP else 25
TTL = 1.0  # the lock TTL of the SIGKILL and SIGSTOP scenarios


class GuardChildren(Children):
    """Children running tests/acceptance/_guards_child.py."""

    module = "tests.acceptance._guards_child"


@contextmanager
def children(tmp_path: Path) -> Iterator[GuardChildren]:
    kids = GuardChildren(tmp_path)
    try:
        yield kids
    finally:
        kids.reap()


def run_all(tmp_path: Path, *commands: tuple[str | Path, ...]) -> list[dict[str, Any]]:
    """Run one child per command to completion (each must exit 0); the ledger they wrote."""
    with children(tmp_path) as kids:
        for command in commands:
            kids.spawn(*command)
        for p in kids.procs:
            assert kids.finish(p) == 0, kids.stderr()
    return read_ledger(tmp_path / "ledger.jsonl")


def barrier_dir(tmp_path: Path) -> Path:
    path = tmp_path / "barrier"
    path.mkdir()
    return path


# -- 1. lost update -------------------------------------------------------------------------------


def race_on_a_list(
    url: str, tmp_path: Path, mode: str
) -> tuple[al.Versioned, list[dict[str, Any]]]:
    """WRITERS processes each append a note per round to one record's list, all reading before
    any writes; the record after, and the ledger."""
    key, ledger, gate = "doc", tmp_path / "ledger.jsonl", barrier_dir(tmp_path)
    with al.SharedState.connect(url) as state:
        assert state.compare_and_set(key, 0, {"notes": []}) == 1
        lines = run_all(
            tmp_path,
            *[
                ("lost", url, ledger, gate, i, WRITERS, WRITE_ROUNDS, mode, key)
                for i in range(WRITERS)
            ],
        )
        return state.get(key), lines


@pytest.mark.slow
def test_blind_read_modify_write_across_processes_loses_updates(url: str, tmp_path: Path) -> None:
    record, lines = race_on_a_list(url, tmp_path, "naive")
    writes = of(lines, "wrote")
    assert len(writes) == WRITERS * WRITE_ROUNDS, "every process wrote every round"
    assert record.version == 1 + WRITERS * WRITE_ROUNDS
    notes = record.value["notes"]
    assert isinstance(notes, list)
    # Every round, each writer put back the list it read plus its note: the last one wins.
    assert len(notes) == WRITE_ROUNDS, f"{len(notes)} of {len(writes)} notes survived"
    assert [n.rsplit("-r", 1)[1] for n in notes] == [str(r) for r in range(WRITE_ROUNDS)]
    lost = WRITERS * WRITE_ROUNDS - len(notes)
    assert lost == (WRITERS - 1) * WRITE_ROUNDS


@pytest.mark.slow
def test_update_across_processes_never_loses_one(url: str, tmp_path: Path) -> None:
    record, lines = race_on_a_list(url, tmp_path, "guarded")
    writes = of(lines, "wrote")
    expected = sorted(f"p{i}-r{r}" for i in range(WRITERS) for r in range(WRITE_ROUNDS))
    notes = record.value["notes"]
    assert isinstance(notes, list)
    assert sorted(notes) == expected, "every update is in the record"
    assert record.version == 1 + WRITERS * WRITE_ROUNDS, "one version per write, no more"
    assert sorted(w["version"] for w in writes) == list(range(2, 2 + WRITERS * WRITE_ROUNDS))
    for r in range(WRITE_ROUNDS):
        calls = sorted(w["calls"] for w in writes if w["round"] == r)
        assert len(calls) == WRITERS
        # All first attempts read before any wrote, so at most one went through unopposed:
        # the others hit a conflict, re-read and re-applied.
        assert calls[1] >= 2, f"round {r}: the race was not exercised ({calls})"
        # Each conflict is another writer's one write of the round: no needless retries.
        assert calls[-1] <= WRITERS, f"round {r}: {calls}"
    for p in {w["pid"] for w in writes}:
        mine = [w["note"] for w in writes if w["pid"] == p]
        assert [notes.index(n) for n in mine] == sorted(notes.index(n) for n in mine), (
            "each process's notes are in its order"
        )


# -- 2. write skew --------------------------------------------------------------------------------


def skew_rounds(url: str, tmp_path: Path, mode: str) -> list[dict[str, Any]]:
    """Both doctors ask for leave and both processes allocate the last slot, each round, every
    check made before any write; the ledger. Leaves the state for the caller to inspect."""
    ledger, gate = tmp_path / "ledger.jsonl", barrier_dir(tmp_path)
    with al.SharedState.connect(url) as state:
        for r in range(SKEW_ROUNDS):
            state.compare_and_set(rota_key(r), 0, dict.fromkeys(DOCTORS, True))
            state.add(on_call_key(r), len(DOCTORS))
            state.compare_and_set(slots_key(r), 0, {"used": SLOTS - 1})
            state.reserve(capacity_key(r), SLOTS - 1, limit=SLOTS)
    return run_all(
        tmp_path,
        *[
            ("skew", url, ledger, gate, i, len(DOCTORS), SKEW_ROUNDS, mode)
            for i in range(len(DOCTORS))
        ],
    )


@pytest.mark.slow
def test_write_skew_across_processes_breaks_the_invariants_without_the_guard(
    url: str, tmp_path: Path
) -> None:
    lines = skew_rounds(url, tmp_path, "naive")
    with al.SharedState.connect(url) as state:
        for r in range(SKEW_ROUNDS):
            assert sorted(x["doctor"] for x in of(lines, "left", round=r)) == sorted(DOCTORS)
            assert state.get(rota_key(r)).value == dict.fromkeys(DOCTORS, False), (
                f"round {r}: nobody is on call"
            )
            assert len(of(lines, "granted", round=r)) == 2, f"round {r}: the last slot went twice"
            # ... and the record of it even hides the overbooking (a lost update on top).
            assert state.get(slots_key(r)).value == {"used": SLOTS}


@pytest.mark.slow
def test_bounded_counters_across_processes_keep_the_invariants(url: str, tmp_path: Path) -> None:
    lines = skew_rounds(url, tmp_path, "guarded")
    with al.SharedState.connect(url) as state:
        for r in range(SKEW_ROUNDS):
            (left,) = of(lines, "left", round=r)
            (refused,) = of(lines, "refused", round=r)
            assert {left["doctor"], refused["doctor"]} == set(DOCTORS)
            assert refused["value"] == 1
            assert refused["low"] == 1
            rota = state.get(rota_key(r)).value
            assert rota == {d: d != left["doctor"] for d in DOCTORS}, f"round {r}: one on call"
            assert state.counter(on_call_key(r)) == 1
            (granted,) = of(lines, "granted", round=r)
            (full,) = of(lines, "full", round=r)
            assert granted["count"] == SLOTS
            assert full["value"] == SLOTS
            assert full["high"] == SLOTS
            assert state.counter(capacity_key(r)) == SLOTS, f"round {r}: the last slot went once"


# -- 3. deadlock ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_opposite_lock_orders_across_processes_never_deadlock(url: str, tmp_path: Path) -> None:
    ledger, gate = tmp_path / "ledger.jsonl", barrier_dir(tmp_path)
    a, b = "account-a", "account-b"
    orders = [f"{a},{b}" if i % 2 == 0 else f"{b},{a}" for i in range(LOCKERS)]
    started = time.monotonic()
    lines = run_all(
        tmp_path,
        *[
            ("deadlock", url, ledger, gate, i, LOCKERS, LOCK_ROUNDS, order)
            for i, order in enumerate(orders)
        ],
    )
    elapsed = time.monotonic() - started
    assert elapsed < BOUND, "every process finished all its rounds, in bounded time"
    pids = {x["pid"] for x in of(lines, "done")}
    assert len(pids) == LOCKERS
    events = [x for x in lines if x["kind"] in ("enter", "exit")]
    assert len(events) == 2 * LOCKERS * LOCK_ROUNDS
    # Mutual exclusion: the ledger's total order alternates enter / exit of one process.
    for enter, leave in zip(events[::2], events[1::2], strict=True):
        assert enter["kind"] == "enter", enter
        assert leave["kind"] == "exit", leave
        assert leave["pid"] == enter["pid"]
        assert leave["round"] == enter["round"]
        assert enter["names"] == [a, b], "acquired in canonical order"
    entries = events[::2]
    for lock in (a, b):
        tokens = [e["tokens"][lock] for e in entries]
        assert all(x < y for x, y in pairwise(tokens)), f"{lock}: fencing tokens rise"
    for p in pids:
        assert [e["round"] for e in entries if e["pid"] == p] == list(range(LOCK_ROUNDS))
    handovers = sum(x["pid"] != y["pid"] for x, y in pairwise(entries))
    assert handovers >= 1, "the processes never took turns: the race was not exercised"


# -- 4. a holder SIGKILLed ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_sigkilled_holder_loses_its_locks_after_the_ttl(
    url: str, tmp_path: Path, seed: int
) -> None:
    path, gate, lock = tmp_path / "ledger.jsonl", barrier_dir(tmp_path), f"invoice-{seed}"
    with children(tmp_path) as kids, al.SharedState.connect(url) as state:
        proc = kids.spawn("holder", url, path, gate, lock, TTL)
        kids.wait_for("the lock held", lambda: bool(of(read_ledger(path), "holding")))
        (holding,) = of(read_ledger(path), "holding")
        assert f":{proc.pid}:" in holding["owner"]
        assert state.lock_holders([lock]) == {lock: holding["owner"]}
        with pytest.raises(al.LockTimeout) as busy, state.locks([lock], timeout=0.05):
            pass
        assert busy.value.holder == holding["owner"]
        (gate / "kill").touch()  # the holder SIGKILLs itself, holding the lock
        assert kids.finish(proc) == -signal.SIGKILL
        with state.locks([lock], timeout=2 * TTL + 1.0) as held:
            assert held.tokens[lock] > holding["token"], "the next holder's token is higher"
            assert state.lock_holders([lock]) == {lock: held.owner}
        assert state.lock_holders([lock]) == {lock: None}


# -- 5. a holder frozen past its TTL --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_frozen_holder_is_fenced_off_when_it_wakes(url: str, tmp_path: Path, seed: int) -> None:
    path, lock, account = tmp_path / "ledger.jsonl", f"account-lock-{seed}", f"account-{seed}"
    with children(tmp_path) as kids, al.SharedState.connect(url) as state:
        proc = kids.spawn("zombie", url, path, lock, account, TTL)
        kids.wait_for("the zombie's first write", lambda: bool(of(read_ledger(path), "wrote")))
        wait_stopped(kids, proc)
        (wrote,) = of(read_ledger(path), "wrote")
        assert state.get(account) == al.Versioned({"balance": 100}, 1)
        with state.locks([lock], timeout=2 * TTL + 1.0) as held:
            token = held.tokens[lock]
            assert token > wrote["token"]
            assert state.set_field(account, "balance", 50, fence=token) == 2
            proc.send_signal(signal.SIGCONT)  # the zombie wakes and writes with its old token
            assert kids.finish(proc) == 0, kids.stderr()
            assert state.lock_holders([lock]) == {lock: held.owner}, "the zombie freed nothing"
        lines = of(read_ledger(path), "fenced") + of(read_ledger(path), "late-write-accepted")
        assert [(x["kind"], x.get("fence"), x.get("current_fence")) for x in lines] == [
            ("fenced", wrote["token"], token)
        ]
        assert [x["kind"] for x in read_ledger(path) if x["kind"] in ("lost", "released")] == [
            "lost"
        ], "the zombie's lock set reported the loss on exit"
        (lost,) = of(read_ledger(path), "lost")
        assert lost["names"] == [lock]
        assert state.get(account) == al.Versioned({"balance": 50}, 2), "the new holder's value"
