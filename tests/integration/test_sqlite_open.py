"""Many processes opening one new SQLite file at once all get a working store."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import agentlease as al


def _open(path: str, results: multiprocessing.Queue[str]) -> None:
    try:
        backend = al.connect(f"sqlite:///{path}")
        backend.close()
    except Exception as exc:  # reported to the parent
        results.put(repr(exc))
    else:
        results.put("ok")


def test_processes_opening_a_new_database_together_all_succeed(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    failures: list[str] = []
    for round_ in range(100):
        path = str(tmp_path / f"new-{round_}.db")
        results: multiprocessing.Queue[str] = ctx.Queue()
        procs = [ctx.Process(target=_open, args=(path, results)) for _ in range(6)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(60)
        failures += [o for o in outcomes if o != "ok"]
    assert failures == []
