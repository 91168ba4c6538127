"""The processes of tests/acceptance/test_guards_processes.py.

    python -m tests.acceptance._guards_child lost URL LEDGER BARRIER INDEX PARTIES ROUNDS MODE KEY
    python -m tests.acceptance._guards_child skew URL LEDGER BARRIER INDEX PARTIES ROUNDS MODE
    python -m tests.acceptance._guards_child deadlock URL LEDGER BARRIER INDEX PARTIES ROUNDS LOCKS
    python -m tests.acceptance._guards_child holder URL LEDGER BARRIER LOCK TTL
    python -m tests.acceptance._guards_child zombie URL LEDGER LOCK ACCOUNT TTL

``MODE`` is ``naive`` (read, check, then a blind write: the anomaly) or ``guarded`` (the same
schedule through the guard). Processes meet at file barriers (:func:`meet`) to force the
interleaving that breaks the naive code on every round. What each process saw and did goes to
the shared ``O_APPEND`` ledger of ``tests/acceptance/_idempotency_child.py``.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import agentlease as al
from tests.acceptance._idempotency_child import BARRIER_TIMEOUT, Ledger

# The write-skew scenarios (see ``skew``): who is on the rota, and the capacity's size.
DOCTORS = ("alice", "bob")
SLOTS = 10


def meet(barrier: Path, name: str, index: int, parties: int) -> None:
    """Arrive at barrier ``name`` and wait (bounded) until all ``parties`` have arrived."""
    (barrier / f"{name}.{index}").touch()
    waiting = [barrier / f"{name}.{i}" for i in range(parties)]
    deadline = time.monotonic() + BARRIER_TIMEOUT
    while not all(p.exists() for p in waiting):
        if time.monotonic() > deadline:
            raise SystemExit(f"barrier {name} never opened")
        time.sleep(0.001)


def rota_key(r: int) -> str:
    return f"rota-{r}"


def on_call_key(r: int) -> str:
    return f"on-call-{r}"


def slots_key(r: int) -> str:
    return f"slots-{r}"


def capacity_key(r: int) -> str:
    return f"capacity-{r}"


def lost(
    url: str, path: str, barrier: str, index: str, parties: str, rounds: str, mode: str, key: str
) -> int:
    """Each round, append this process's note to the record's list: read, (meet), write.

    ``naive`` writes the whole list back blind, and meets again after writing so every round
    starts from one value; ``guarded`` uses ``update`` (compare-and-set, re-read and re-apply on a
    conflict), meeting on its first attempt only."""
    ledger, gate, i, n = Ledger(path), Path(barrier), int(index), int(parties)
    with al.SharedState.connect(url) as state:
        for r in range(int(rounds)):
            note = f"p{i}-r{r}"
            if mode == "naive":
                notes = state.get(key).value["notes"]
                assert isinstance(notes, list)
                meet(gate, f"read-{r}", i, n)  # every process has read before any writes
                version = state.set_field(key, "notes", [*notes, note])
                ledger.write("wrote", round=r, note=note, version=version)
                meet(gate, f"wrote-{r}", i, n)
                continue
            calls = 0

            def append(
                value: dict[str, al.JSON], r: int = r, note: str = note
            ) -> dict[str, al.JSON]:
                nonlocal calls
                calls += 1
                if calls == 1:
                    meet(gate, f"read-{r}", i, n)  # first attempts all read before any writes
                notes = value["notes"]
                assert isinstance(notes, list)
                return {**value, "notes": [*notes, note]}

            got = state.update(key, append)
            ledger.write("wrote", round=r, note=note, version=got.version, calls=calls)
    ledger.close()
    return 0


def skew(
    url: str, path: str, barrier: str, index: str, parties: str, rounds: str, mode: str
) -> int:
    """Each round, two write-skew scenarios, each checked, then (after a barrier) written:

    * the rota: this process's doctor asks for leave if someone else is on call; ``guarded``
      takes one from the on-call counter with ``minimum=1`` before leaving;
    * the capacity: this process allocates a slot if one is left; ``guarded`` reserves it on the
      capacity counter with ``limit=SLOTS``.
    """
    ledger, gate, i, n = Ledger(path), Path(barrier), int(index), int(parties)
    doctor = DOCTORS[i]
    with al.SharedState.connect(url) as state:
        for r in range(int(rounds)):
            rota = state.get(rota_key(r)).value
            others_on_call = [d for d, on in rota.items() if on and d != doctor]
            meet(gate, f"rota-{r}", i, n)  # both checked before either writes
            if mode == "naive":
                if others_on_call:
                    state.set_field(rota_key(r), doctor, False)
                    ledger.write("left", round=r, doctor=doctor)
            else:
                try:
                    state.take(on_call_key(r), minimum=1)
                except al.LimitReached as exc:
                    ledger.write("refused", round=r, doctor=doctor, value=exc.value, low=exc.low)
                else:
                    state.set_field(rota_key(r), doctor, False)
                    ledger.write("left", round=r, doctor=doctor)

            used = state.get(slots_key(r)).value["used"]
            assert isinstance(used, int)
            meet(gate, f"slots-{r}", i, n)  # both saw the last slot free before either takes it
            if mode == "naive":
                if used < SLOTS:
                    state.set_field(slots_key(r), "used", used + 1)
                    ledger.write("granted", round=r)
            else:
                try:
                    count = state.reserve(capacity_key(r), limit=SLOTS)
                except al.LimitReached as exc:
                    ledger.write("full", round=r, value=exc.value, high=exc.high)
                else:
                    ledger.write("granted", round=r, count=count)
    ledger.close()
    return 0


def deadlock(
    url: str, path: str, barrier: str, index: str, parties: str, rounds: str, locks: str
) -> int:
    """Lock ``locks`` (comma-separated, in this process's order) ``rounds`` times; write ``enter``
    to the ledger just after acquiring and ``exit`` just before releasing."""
    ledger, gate, i = Ledger(path), Path(barrier), int(index)
    names = locks.split(",")
    rand = random.Random(i)
    with al.SharedState.connect(url) as state:
        meet(gate, "start", i, int(parties))
        for r in range(int(rounds)):
            with state.locks(names, timeout=BARRIER_TIMEOUT, ttl=10.0) as held:
                ledger.write("enter", round=r, names=list(held.names), tokens=held.tokens)
                time.sleep(0.002)  # hold it long enough for the other to want it
                held.check()
                ledger.write("exit", round=r)
            time.sleep(rand.uniform(0, 0.003))
        ledger.write("done", rounds=int(rounds))
    ledger.close()
    return 0


def holder(url: str, path: str, barrier: str, lock: str, ttl: str) -> int:
    """Hold ``lock`` (renewing it) until the test opens the ``kill`` barrier, then SIGKILL self
    while still holding it."""
    ledger = Ledger(path)
    state = al.SharedState.connect(url)
    with state.locks([lock], timeout=BARRIER_TIMEOUT, ttl=float(ttl)) as held:
        ledger.write("holding", owner=held.owner, token=held.tokens[lock])
        kill = Path(barrier) / "kill"
        deadline = time.monotonic() + BARRIER_TIMEOUT
        while not kill.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit("the holder should be dead by now")


def zombie(url: str, path: str, lock: str, account: str, ttl: str) -> int:
    """Hold ``lock``, write ``account`` with its token, then freeze (SIGSTOP self). Once resumed
    (SIGCONT from the test), write again with the same, now stale, token: report the refusal,
    and the lock set's verdict on exit."""
    ledger = Ledger(path)
    with al.SharedState.connect(url) as state:
        try:
            with state.locks([lock], timeout=BARRIER_TIMEOUT, ttl=float(ttl)) as held:
                token = held.tokens[lock]
                version = state.set_field(account, "balance", 100, fence=token)
                ledger.write("wrote", owner=held.owner, token=token, version=version)
                # Frozen long before the first renewal (a third of the TTL from now), so no
                # renewal is cut off half way through a store transaction.
                os.kill(os.getpid(), signal.SIGSTOP)
                ledger.write("resumed")
                try:
                    state.set_field(account, "balance", 0, fence=token)
                except al.FencedOff as exc:
                    ledger.write("fenced", fence=exc.fence, current_fence=exc.current_fence)
                else:
                    ledger.write("late-write-accepted")
        except al.LockLost as exc:
            ledger.write("lost", names=list(exc.names))
        else:
            ledger.write("released")
    ledger.close()
    return 0


def main(argv: list[str]) -> int:
    command, rest = argv[0], argv[1:]
    commands: dict[str, Callable[..., int]] = {
        "lost": lost,
        "skew": skew,
        "deadlock": deadlock,
        "holder": holder,
        "zombie": zombie,
    }
    if command not in commands:
        raise SystemExit(f"unknown command {command!r}")
    return commands[command](*rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
