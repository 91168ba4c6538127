"""The processes of tests/acceptance/test_holds_processes.py.

    python -m tests.acceptance._holds_child hold URL LEDGER BARRIER INDEX COUNTER UNITS LIMIT TTL
    python -m tests.acceptance._holds_child reserve URL LEDGER BARRIER INDEX COUNTER UNITS LIMIT

Each takes ``UNITS`` of the counter (``hold``: under a hold with ``TTL``; ``reserve``: for good,
the way that leaks), writes ``holding`` to the shared ``O_APPEND`` ledger, then waits for the test
to touch ``kill-INDEX`` (it SIGKILLs itself, still holding them) or ``release-INDEX`` (it gives
them back and exits 0).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import agentlease as al
from tests.acceptance._idempotency_child import BARRIER_TIMEOUT, Ledger


def _wait(barrier: Path, index: str) -> bool:
    """Wait for the test's word: True to release, False to die."""
    deadline = time.monotonic() + BARRIER_TIMEOUT
    while time.monotonic() < deadline:
        if (barrier / f"kill-{index}").exists():
            return False
        if (barrier / f"release-{index}").exists():
            return True
        time.sleep(0.005)
    raise SystemExit("the test never said what to do")


def hold(
    url: str, path: str, barrier: str, index: str, counter: str, units: str, limit: str, ttl: str
) -> int:
    ledger = Ledger(path)
    with al.SharedState.connect(url) as state:
        with state.hold(counter, int(units), limit=int(limit), ttl=float(ttl)) as held:
            ledger.write("holding", index=int(index), pid=os.getpid(), value=held.value)
            if not _wait(Path(barrier), index):
                os.kill(os.getpid(), signal.SIGKILL)
            held.check()
        ledger.write("released", index=int(index))
    ledger.close()
    return 0


def reserve(
    url: str, path: str, barrier: str, index: str, counter: str, units: str, limit: str
) -> int:
    ledger = Ledger(path)
    with al.SharedState.connect(url) as state:
        value = state.reserve(counter, int(units), limit=int(limit))
        ledger.write("holding", index=int(index), pid=os.getpid(), value=value)
        if not _wait(Path(barrier), index):
            os.kill(os.getpid(), signal.SIGKILL)
        state.release(counter, int(units))
        ledger.write("released", index=int(index))
    ledger.close()
    return 0


def main(argv: list[str]) -> int:
    command, rest = argv[0], argv[1:]
    if command == "hold":
        return hold(*rest)
    if command == "reserve":
        return reserve(*rest)
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
