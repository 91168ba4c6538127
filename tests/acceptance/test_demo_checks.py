"""The demo's invariant checks catch the violations they exist for (synthetic ledgers)."""

from __future__ import annotations

from typing import Any

from agentlease._demo.checks import Faults, check
from agentlease._records import Task


def task(task_id: str, attempt: int, state: str = "done", reclaims: int = 0) -> Task:
    return Task(
        id=task_id,
        queue="demo",
        state=state,
        priority=0,
        payload_json=b"{}",
        attempt=attempt,  # type: ignore[arg-type]
        reclaims=reclaims,
        failures=0,
        max_reclaims=5,
        created_at=0.0,
        run_at=0.0,
        result_json=f'{{"task":"{task_id}","attempt":{attempt}}}'.encode(),
    )


def claimed(task_id: str, attempt: int, t: float, expires: float, pid: int = 1) -> dict[str, Any]:
    return {
        "kind": "claimed",
        "task": task_id,
        "attempt": attempt,
        "t": t,
        "leased_at": t,
        "expires_at": expires,
        "pid": pid,
    }


def completed(task_id: str, attempt: int, t: float, pid: int = 1) -> dict[str, Any]:
    return {"kind": "completed", "task": task_id, "attempt": attempt, "t": t, "pid": pid}


def names_failing(
    records: list[dict[str, Any]], tasks: list[Task], faults: Faults | None = None
) -> set[str]:
    checks, _ = check(tasks, records, faults or Faults())
    return {c.name for c in checks if not c.ok}


def test_a_clean_history_passes() -> None:
    records = [claimed("a", 1, 0.0, 2.0), completed("a", 1, 1.0)]
    assert names_failing(records, [task("a", 1)]) == set()


def test_duplicate_completion_is_caught() -> None:
    records = [claimed("a", 1, 0.0, 2.0), completed("a", 1, 1.0), completed("a", 1, 1.1, pid=2)]
    assert "exactly one accepted completion per task" in names_failing(records, [task("a", 1)])


def test_lost_task_is_caught() -> None:
    records = [claimed("a", 1, 0.0, 2.0)]
    failing = names_failing(records, [task("a", 1, state="leased")])
    assert "every task completed" in failing


def test_overlapping_leases_are_caught() -> None:
    records = [
        claimed("a", 1, 0.0, 2.0),
        claimed("a", 2, 1.0, 3.0, pid=2),
        completed("a", 2, 2.5, 2),
    ]
    assert "no task in two live leases at once" in names_failing(records, [task("a", 2)])


def test_stale_write_accepted_is_caught() -> None:
    records = [
        claimed("a", 1, 0.0, 2.0),
        claimed("a", 2, 2.5, 4.5, pid=2),
        {"kind": "write", "task": "a", "attempt": 1, "ok": True, "t_send": 3.0, "t": 3.1, "pid": 1},
        completed("a", 2, 4.0, 2),
    ]
    assert "every zombie write rejected" in names_failing(records, [task("a", 2)])


def test_fresh_claim_jumping_a_reaped_task_is_caught() -> None:
    records = [
        claimed("a", 1, 0.0, 2.0),
        {"kind": "reaped", "task": "a", "attempt": 1, "outcome": "requeued", "t": 2.1, "pid": 2},
        claimed("b", 1, 2.2, 4.0, pid=2),
        completed("b", 1, 2.5, 2),
        claimed("a", 2, 2.6, 4.6, pid=2),
        completed("a", 2, 3.0, 2),
    ]
    failing = names_failing(records, [task("a", 2, reclaims=1), task("b", 1)])
    assert failing == {"reaped tasks claimed ahead of older queued ones"}
