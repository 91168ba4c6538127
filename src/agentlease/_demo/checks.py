"""The demo's invariants, checked against the store and against the independent ledger."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agentlease._records import Task

__all__ = ["Check", "Faults", "check"]


@dataclass(frozen=True, slots=True)
class Check:
    """One invariant: its name, whether it held, and the evidence."""

    name: str
    ok: bool
    detail: str


@dataclass(slots=True)
class Faults:
    """What the scenario did to the workers (wall-clock times on this machine)."""

    killed: dict[int, float] = field(default_factory=dict)
    frozen: dict[int, tuple[float, float]] = field(default_factory=dict)


def check(
    tasks: list[Task], records: Iterable[dict[str, Any]], faults: Faults
) -> tuple[list[Check], dict[str, Any]]:
    """Hold the store's final state and the ledger to every invariant.

    Returns:
        The checks, and the figures of the report.
    """
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_kind[r["kind"]].append(r)
    claims: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in by_kind["claimed"]:
        claims[r["task"]][r["attempt"]] = r
    ends: dict[tuple[str, int], float] = {}
    for r in by_kind["claimed"] + by_kind["extended"]:
        key = (r["task"], r["attempt"])
        ends[key] = max(ends.get(key, 0.0), r["expires_at"])
    completions = Counter(r["task"] for r in by_kind["completed"])
    completed_attempt = {r["task"]: r["attempt"] for r in by_kind["completed"]}

    checks: list[Check] = []
    done = [t for t in tasks if t.state == "done"]
    lost = [t.id for t in tasks if t.state != "done"]
    checks.append(
        Check(
            "every task completed", not lost, f"{len(done)}/{len(tasks)} done; not done: {lost[:5]}"
        )
    )

    duplicates = sum(c - 1 for c in completions.values() if c > 1)
    missing = [t.id for t in done if completions[t.id] == 0]
    checks.append(
        Check(
            "exactly one accepted completion per task",
            duplicates == 0 and not missing,
            f"{duplicates} duplicate completions; "
            f"{len(missing)} done tasks without one: {missing[:5]}",
        )
    )

    mismatched = []
    for t in done:
        result = t.result
        stored = result.get("attempt") if isinstance(result, dict) else None
        if not (stored == t.attempt == completed_attempt.get(t.id)):
            mismatched.append(t.id)
    checks.append(
        Check(
            "accepted result written by the last lease",
            not mismatched,
            f"{len(mismatched)} tasks whose stored result is not the last attempt's: "
            f"{mismatched[:5]}",
        )
    )

    overlaps = []
    after_done = []
    for task_id, per_attempt in claims.items():
        attempts = sorted(per_attempt)
        for a, b in itertools.pairwise(attempts):
            if per_attempt[b]["leased_at"] < ends[(task_id, a)]:
                overlaps.append(f"{task_id}#{a}/{b}")
        finished = completed_attempt.get(task_id)
        if finished is not None and any(a > finished for a in attempts):
            after_done.append(task_id)
    checks.append(
        Check(
            "no task in two live leases at once",
            not overlaps and not after_done,
            f"{len(overlaps)} overlapping leases {overlaps[:5]}; "
            f"{len(after_done)} tasks claimed after completion {after_done[:5]}",
        )
    )

    stale_accepted = []
    for r in by_kind["write"]:
        if not r["ok"]:
            continue
        later = claims[r["task"]].get(r["attempt"] + 1)
        if later is not None and r["t_send"] > later["t"]:
            stale_accepted.append(f"{r['task']}#{r['attempt']}")
    frozen_writes = [
        r
        for r in by_kind["zombie_rejected"]
        if r["pid"] in faults.frozen and r["t"] >= faults.frozen[r["pid"]][1]
    ]
    frozen_accepted = [
        r
        for kind in ("write", "extended", "completed")
        for r in by_kind[kind]
        if r["pid"] in faults.frozen
        and r["t"] >= faults.frozen[r["pid"]][1]
        and r.get("ok", True)
        and (r["task"], r["attempt"]) in _held_at_freeze(claims, r["pid"], faults)
    ]
    zombie_ok = (
        not stale_accepted
        and not frozen_accepted
        and (not faults.frozen or len({r["pid"] for r in frozen_writes}) == len(faults.frozen))
    )
    checks.append(
        Check(
            "every zombie write rejected",
            zombie_ok,
            f"{len(frozen_writes)} writes by resumed frozen workers, all rejected; "
            f"{len(frozen_accepted)} accepted; {len(stale_accepted)} stale writes accepted",
        )
    )

    fresh = sorted((r["leased_at"], r["task"]) for r in by_kind["claimed"] if r["attempt"] == 1)
    jumped = []
    for r in by_kind["reaped"]:
        if r.get("outcome") != "requeued":
            continue
        reclaim = claims[r["task"]].get(r["attempt"] + 1)
        until = reclaim["leased_at"] if reclaim is not None else float("inf")
        jumped += [f for t, f in fresh if r["t"] < t < until]
    checks.append(
        Check(
            "reaped tasks claimed ahead of older queued ones",
            not jumped,
            f"{len(by_kind['reaped'])} reaps; {len(jumped)} fresh claims jumped ahead {jumped[:5]}",
        )
    )

    recoveries: list[float] = []
    for pid, killed_at in faults.killed.items():
        for task_id, attempt in _held_at(claims, pid, killed_at, completed_attempt):
            nxt = claims[task_id].get(attempt + 1)
            if nxt is not None:
                recoveries.append(nxt["leased_at"] - killed_at)
    unrecovered = len(faults.killed) > 0 and not recoveries
    checks.append(
        Check(
            "killed workers' tasks ran again",
            not unrecovered,
            f"{len(recoveries)} tasks of {len(faults.killed)} killed workers re-leased; "
            f"slowest after {max(recoveries, default=0.0):.2f}s",
        )
    )

    figures = {
        "tasks": len(tasks),
        "completed": len(done),
        "lost": len(lost),
        "duplicate_completions": duplicates,
        "claims": len(by_kind["claimed"]),
        "tasks_claimed_more_than_once": sum(1 for c in claims.values() if len(c) > 1),
        "zombie_writes_rejected": len(by_kind["zombie_rejected"]),
        "zombie_writes_accepted": len(stale_accepted) + len(frozen_accepted),
        "reaped": sum(t.reclaims for t in tasks),
        "dead": sum(1 for t in tasks if t.state == "dead"),
        "recovery_seconds_max": round(max(recoveries, default=0.0), 3),
    }
    return checks, figures


def _held_at(
    claims: dict[str, dict[int, dict[str, Any]]],
    pid: int,
    at: float,
    completed_attempt: dict[str, int],
) -> list[tuple[str, int]]:
    """The lease ``pid`` (a one-slot worker) held at time ``at``: its last claim, if unfinished."""
    mine = [
        (r["t"], task_id, attempt)
        for task_id, per_attempt in claims.items()
        for attempt, r in per_attempt.items()
        if r["pid"] == pid and r["t"] <= at
    ]
    if not mine:
        return []
    _, task_id, attempt = max(mine)
    return [] if completed_attempt.get(task_id) == attempt else [(task_id, attempt)]


def _held_at_freeze(
    claims: dict[str, dict[int, dict[str, Any]]], pid: int, faults: Faults
) -> set[tuple[str, int]]:
    stopped_at = faults.frozen[pid][0]
    return {
        (task_id, attempt)
        for task_id, per_attempt in claims.items()
        for attempt, r in per_attempt.items()
        if r["pid"] == pid and r["t"] <= stopped_at and attempt + 1 in per_attempt
    }
