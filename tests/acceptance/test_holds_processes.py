"""Counter holds with real processes on real stores (SQLite, Redis, Redis Cluster, PostgreSQL):
a process SIGKILLed while it holds units of a bounded counter does not leak them.

Ten seats, four processes take two each, one of them is SIGKILLed while holding its seats:

- with ``reserve`` (for good) the dead process's seats are gone for ever: after everyone else
  has given theirs back, long past any lease, only eight of ten seats are left;
- with ``hold`` the store gives them back once the dead holder's TTL has run out (on the store's
  clock, at the next step that touches the counter, no reaper running): the others keep theirs
  meanwhile, and after they release all ten seats are there again.

The memory store, which processes cannot share, is covered with threads in
tests/contract/test_counter_holds.py.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import agentlease as al
from tests.acceptance._idempotency_child import read_ledger
from tests.acceptance.test_idempotency_processes import Children, of

# Many real processes (SIGKILL, SIGSTOP) on short leases: the "processes" group runs one test at
# a time on one xdist worker, so they starve neither each other nor the servers' connections.
pytestmark = pytest.mark.xdist_group("processes")

SEATS = 10
HOLDERS = 4
EACH = 2
TTL = 2.0  # of the holds: long enough for renewals on a loaded machine, short to wait out


class HoldChildren(Children):
    """Children running tests/acceptance/_holds_child.py."""

    module = "tests.acceptance._holds_child"


@contextmanager
def children(tmp_path: Path) -> Iterator[HoldChildren]:
    kids = HoldChildren(tmp_path)
    try:
        yield kids
    finally:
        kids.reap()


def seats_taken(url: str, tmp_path: Path, mode: str) -> tuple[int, int]:
    """HOLDERS processes take EACH seat of SEATS (``mode``: hold or reserve); the first is
    SIGKILLed holding them, the others release theirs once the dead one's TTL has passed (for
    ``hold``: once the store gave its seats back). Returns the count while the others still
    held theirs, and the count after they released."""
    path, gate, counter = tmp_path / "ledger.jsonl", tmp_path / "barrier", "seats"
    gate.mkdir()
    extra = (TTL,) if mode == "hold" else ()
    with children(tmp_path) as kids, al.SharedState.connect(url) as state:
        procs = [
            kids.spawn(mode, url, path, gate, i, counter, EACH, SEATS, *extra)
            for i in range(HOLDERS)
        ]
        kids.wait_for(
            "every process holding its seats",
            lambda: len(of(read_ledger(path), "holding")) == HOLDERS,
        )
        assert state.counter(counter) == HOLDERS * EACH
        with pytest.raises(al.LimitReached):
            state.reserve(counter, SEATS - HOLDERS * EACH + 1, limit=SEATS)

        (gate / "kill-0").touch()  # the first holder SIGKILLs itself, holding its seats
        assert kids.finish(procs[0]) == -signal.SIGKILL
        killed_at = time.monotonic()
        if mode == "hold":
            kids.wait_for(
                "the dead holder's seats back",
                lambda: state.counter(counter) == (HOLDERS - 1) * EACH,
            )
        time.sleep(max(0.0, killed_at + 2 * TTL - time.monotonic()))  # long past its TTL
        during = state.counter(counter)

        for i in range(1, HOLDERS):
            (gate / f"release-{i}").touch()
        for proc in procs[1:]:
            assert kids.finish(proc) == 0, kids.stderr()
        assert len(of(read_ledger(path), "released")) == HOLDERS - 1
        return during, state.counter(counter)


@pytest.mark.slow
def test_a_sigkilled_process_leaks_the_seats_it_reserved(url: str, tmp_path: Path) -> None:
    during, after = seats_taken(url, tmp_path, "reserve")
    assert during == HOLDERS * EACH, "the dead process's seats never came back"
    assert after == EACH, f"{SEATS - EACH} seats left of {SEATS}, for ever"


@pytest.mark.slow
def test_a_sigkilled_holder_gives_its_seats_back_after_its_ttl(url: str, tmp_path: Path) -> None:
    during, after = seats_taken(url, tmp_path, "hold")
    assert during == (HOLDERS - 1) * EACH, "the others kept their seats, renewed"
    assert after == 0, "all ten seats are there again"
    with al.SharedState.connect(url) as state:
        assert state.reserve("seats", SEATS, limit=SEATS) == SEATS
