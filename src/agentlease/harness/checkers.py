"""Invariants checked over a run's history of what the simulated world really did.

Each checker is a pure function from a sequence of :class:`~agentlease.harness.history.Op` to a
list of :class:`Violation`; it reads only the vocabulary of :mod:`agentlease.harness.history`, so
it runs as well on a history recorded elsewhere and loaded with ``History.load``. Only ``ok`` ops
count as having happened unless a rule says otherwise, and an op whose fields are missing or of
the wrong type is skipped, never raised on (except where the rule is about a missing field).

A violation carries its *witness*, the few ops that prove it, and a plain "because" chain that
names the injected faults (``fault`` ops of the nemesis) that touched the same task, step or key,
so a reader sees what happened and why::

    for violation in check(History.load("run.jsonl")):
        print(violation.format(seed=7, replay="agentlease replay run.jsonl --seed 7"))
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import orjson

from agentlease.harness.history import History, Op, ops_of

__all__ = [
    "CHECKERS",
    "Checker",
    "Violation",
    "check",
    "completions",
    "created_once",
    "effects_traced",
    "facts_agree",
    "locks_released",
    "monotonic",
    "spend_within_budget",
]


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant, with the ops that prove it.

    Attributes:
        checker: the name of the checker that found it.
        message: one plain sentence: what is wrong.
        witness: the few ops that prove it (and the faults that explain it), in history order.
        because: the story of the witness, one sentence per line, naming ops by ``#index``.
    """

    checker: str
    message: str
    witness: tuple[Op, ...]
    because: tuple[str, ...] = ()

    def format(self, *, seed: int | None = None, replay: str | None = None) -> str:
        """The violation as text for a person: message, witness, because, seed and replay.

        Args:
            seed: the seed of the run, shown when given.
            replay: the command that replays the run, shown when given.
        """
        lines = [f"VIOLATION {self.checker}: {self.message}", "witness:"]
        lines += [f"  {op.describe()}" for op in self.witness]
        if self.because:
            lines.append("because:")
            lines += [f"  {line}" for line in self.because]
        if seed is not None:
            lines.append(f"seed: {seed}")
        if replay is not None:
            lines.append(f"replay: {replay}")
        return "\n".join(lines)


Checker = Callable[[Sequence[Op]], list[Violation]]
"""A checker: the ops of a history in, the violations found out (``[]`` when clean)."""

_Ids = tuple[str | None, ...]  # ids a fault's key must all name (None: unknown, ignored)

# The rule each checker enforces: the last line of each of its violations' "because".
_RULES = {
    "created_once": "A step creates each kind of resource once; a retry must reuse it.",
    "monotonic": "Each move starts from the state the last move left, and goes forward.",
    "locks_released": "A task's locks are released, or expire, by the time the task ends.",
    "spend_within_budget": "A scope never spends more than its budget.",
    "effects_traced": "Every side effect traces to exactly one step of the plan.",
    "facts_agree": "Branches agree on a field's value, or their conflict is reconciled.",
    "completions": "A task ends once: done once, or dead-lettered or cancelled with a reason.",
}

_ENDED = {"complete": "completed", "dead": "dead-lettered", "cancel": "cancelled"}

# How a fault reads in a "because" line; ``{call}`` is "the call to <tool>" or "a call".
_FAULT_DOING = {
    "delay": "delayed {call}, so another branch could overtake it",
    "duplicate": "delivered {call} twice",
    "drop_response": "dropped the response to {call} after it ran",
    "reorder": "held back the response to {call} until a later one was delivered",
    "ack_lost": "lost the acknowledgement of {call}, which landed after the caller gave up",
    "crash": "killed the agent process (as SIGKILL) after {call}",
    "freeze": "froze the agent process past its lease (as SIGSTOP), then resumed it",
    "store_delay": "delayed {call}",
    "store_fail": "made the store refuse {call}",
    "store_ack_lost": "lost the store's reply to {call} after it was applied",
}


# -- reading fields --------------------------------------------------------------------------


def _text(op: Op, name: str) -> str | None:
    """A field that must be a non-empty string, or None."""
    value = op.value.get(name)
    return value if isinstance(value, str) and value else None


def _number(op: Op, name: str) -> int | float | None:
    """A field that must be a finite number (not a bool), or None."""
    value = op.value.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def _canon(value: Any) -> str:
    """Canonical JSON of a value, to compare values and to show them."""
    try:
        option = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
        return orjson.dumps(value, option=option).decode()
    except TypeError:
        return repr(value)


def _name(value: Any) -> str:
    """A name as a person reads it: a string as is, anything else as JSON."""
    return value if isinstance(value, str) else _canon(value)


def _amount(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _resource(op: Op) -> str:
    return _name(op.value["resource"]) if op.value.get("resource") is not None else "one"


def _branch(op: Op) -> str:
    return _name(op.value.get("branch", "(unnamed)"))


def _told(op: Op) -> str:
    """A fact's value, with its step and evidence when it has them."""
    step = f" at step {_name(op.value['step'])}" if op.value.get("step") is not None else ""
    evidence = op.value.get("evidence")
    seen = f" (evidence: {_name(evidence)})" if evidence is not None else ""
    return f"{_canon(op.value['value'])}{step}{seen}"


def _step(task: str | None, step: str) -> str:
    return f"step {step} of task {task}" if task else f"step {step}"


def _ends(op: Op) -> bool:
    """Whether the op ends its task: an ok ``complete``, or a ``dead`` or ``cancel`` (ok, info)."""
    if op.f == "complete":
        return op.type == "ok"
    return op.f in ("dead", "cancel") and op.type in ("ok", "info")


# -- building violations ---------------------------------------------------------------------


def _fault_line(op: Op) -> str:
    kind, site, key = (_name(op.value.get(name, "?")) for name in ("kind", "site", "key"))
    parts = site.split(":")
    call = "a call"
    if len(parts) > 1 and parts[0] == "tool":
        call = f"the call to {parts[1]}"
    elif len(parts) > 1 and parts[0] == "store":
        call = f"the store's {parts[1]}"
    doing = _FAULT_DOING.get(kind, f"injected a {kind} fault into {{call}}").replace("{call}", call)
    return f"#{op.index} the nemesis {doing} (site {site}, key {key})."


def _touching(faults: Sequence[Op], about: Sequence[_Ids], before: int) -> list[Op]:
    """The (last three) faults up to ``before`` whose key names every id of one of ``about``.

    A fault's key is a "/"-separated path such as ``t1/s3/1`` (task, step, attempt).
    """
    groups = [{i for i in group if i} for group in about]
    groups = [group for group in groups if group]
    found = []
    for op in faults:
        key = op.value.get("key")
        if op.index > before or not isinstance(key, str):
            continue
        parts = {key, *key.split("/")}
        if any(group <= parts for group in groups):
            found.append(op)
    return found[-3:]


def _index_of(line: str) -> float:
    """The op index a "because" line begins with ("#12 ..."), or infinity."""
    head = line.split(" ", 1)[0]
    return int(head[1:]) if head[:1] == "#" and head[1:].isdigit() else math.inf


class _Report:
    """The violations one checker finds: each witnessed by its proof and the faults that touched
    the same task, step or key, and explained by a story that ends with the checker's rule."""

    def __init__(self, checker: str, ops: Sequence[Op]) -> None:
        self.checker, self.rule = checker, _RULES[checker]
        self.faults = ops_of(ops, "fault", None)
        self.found: list[Violation] = []

    def add(
        self, message: str, proof: Sequence[Op], *story: str, about: Sequence[_Ids] = ()
    ) -> None:
        touched = _touching(self.faults, about, max(op.index for op in proof))
        witness = {op.index: op for op in [*proof, *touched]}
        # A timeline: the story's lines and the faults by op index, then the rule.
        lines = [*story, *(_fault_line(op) for op in touched)]
        because = (*sorted(lines, key=_index_of), self.rule)
        self.found.append(
            Violation(self.checker, message, tuple(witness[i] for i in sorted(witness)), because)
        )


# -- the checkers ----------------------------------------------------------------------------


def created_once(ops: Sequence[Op]) -> list[Violation]:
    """No step creates a kind of resource more than once.

    Ok ``effect`` ops are grouped by task, step and ``kind`` (``"effect"`` when absent); a group
    of two or more is a violation (a retry or a duplicated call made a second one).
    """
    groups: dict[tuple[str | None, str, str], list[Op]] = defaultdict(list)
    for op in ops_of(ops, "effect"):
        step = _text(op, "step")
        if step is not None:
            groups[(_text(op, "task"), step, _text(op, "kind") or "effect")].append(op)
    report = _Report("created_once", ops)
    for (task, step, kind), group in groups.items():
        if len(group) < 2:
            continue
        a, b = group[:2]
        seen = f"{_resource(a)} at #{a.index}", f"{_resource(b)} at #{b.index}"
        more = len(group) - 2
        listed = f"twice: {seen[0]} and" if not more else f"{len(group)} times: {seen[0]},"
        report.add(
            f"{_step(task, step)} created {kind} {listed} {seen[1]}"
            + (f" and {more} more" if more else ""),
            [a, b],
            f"#{a.index} {a.process} created {kind} {_resource(a)} for {_step(task, step)}.",
            f"#{b.index} {b.process} created {kind} {_resource(b)} for the same step.",
            about=[(task, step), (task,)],
        )
    return report.found


def monotonic(ops: Sequence[Op]) -> list[Violation]:
    """Every key's transitions link up and only move forward.

    Ok ``transition`` ops of one ``key`` must chain: each starts ``from`` the state the previous
    one moved ``to`` (otherwise the previous move was overwritten: a lost update or a move
    backwards). A transition that carries an ``order`` of states must move strictly forward in it.
    """
    report = _Report("monotonic", ops)
    last: dict[str, Op] = {}
    for op in ops_of(ops, "transition"):
        if not all(name in op.value for name in ("key", "from", "to")):
            continue
        key, old, new = _name(op.value["key"]), _canon(op.value["from"]), _canon(op.value["to"])
        moved = f"#{op.index} {op.process} moved {key} from {old} to {new}"
        previous = last.get(_canon(op.value["key"]))
        was = None if previous is None else _canon(previous.value["to"])
        if previous is not None and was != old:
            report.add(
                f"key {key} was moved from {old} at #{op.index}, but #{previous.index} had "
                f"already moved it to {was}: that update was lost",
                [previous, op],
                f"#{previous.index} {previous.process} moved {key} from "
                f"{_canon(previous.value['from'])} to {was}.",
                f"{moved}, a state that was no longer current.",
                about=[(key,)],
            )
        order = op.value.get("order")
        states = [_canon(state) for state in order] if isinstance(order, list) else []
        if old in states and new in states and states.index(new) <= states.index(old):
            report.add(
                f"key {key} went from {old} to {new} at #{op.index}, which is not forward in "
                f"its order {' -> '.join(states)}",
                [op],
                f"{moved}.",
                about=[(key,)],
            )
        last[_canon(op.value["key"])] = op
    return report.found


def locks_released(ops: Sequence[Op]) -> list[Violation]:
    """No lock is still held when its task ends.

    A task ends at its first ok ``complete`` or at a ``dead`` or ``cancel`` op. A lock taken (ok
    ``lock``) for the task before then must be released (ok ``unlock`` of the same lock and owner)
    before it ends, or expire by then: at its ``expires`` time on the run's clock, or, for a lock
    with a ``ttl`` renewed by the process that took it, ``ttl`` after that process stopped
    renewing (a ``crash`` fault whose ``target`` is that process, or a ``freeze`` of it for
    ``seconds`` longer than the ``ttl``). A lock of a task that never ended is not this
    checker's business.
    """
    ends: dict[str, Op] = {}  # each task's first end
    for op in ops:
        if _ends(op) and _text(op, "task"):
            ends.setdefault(op.value["task"], op)
    unlocks = ops_of(ops, "unlock")
    held: dict[tuple[str, str, str], Op] = {}  # the last lock taken before the task ended
    for op in ops_of(ops, "lock"):
        lock, owner, task = _text(op, "lock"), _text(op, "owner"), _text(op, "task")
        if lock and owner and task and task in ends and op.index < ends[task].index:
            held[(lock, owner, task)] = op
    report = _Report("locks_released", ops)
    for (lock, owner, task), op in sorted(held.items(), key=lambda item: item[1].index):
        end = ends[task]
        if any(
            op.index < u.index < end.index
            and (_text(u, "lock"), _text(u, "owner")) == (lock, owner)
            for u in unlocks
        ):
            continue
        expires = _number(op, "expires")
        if expires is None:
            expires = _renewals_stopped(ops, op)
        if expires is not None and expires <= end.time:
            continue
        expiry = "with no expiry" if expires is None else f"to expire at {expires:.3f}s"
        report.add(
            f"lock {lock} taken by {owner} for task {task} at #{op.index} was still held when "
            f"the task was {_ENDED[end.f]} at #{end.index}",
            [op, end],
            f"#{op.index} {owner} took lock {lock} for task {task}, {expiry}.",
            f"#{end.index} task {task} was {_ENDED[end.f]} at {end.time:.3f}s, and {owner} had "
            f"not released {lock} before then.",
            about=[(task,), (lock,)],
        )
    return report.found


def _renewals_stopped(ops: Sequence[Op], taken: Op) -> float | None:
    """When a renewed lock ran out because the process renewing it was killed or frozen for
    longer than its ``ttl`` (run clock), or ``None``."""
    ttl = _number(taken, "ttl")
    if ttl is None:
        return None
    for op in ops:
        if op.index <= taken.index or op.f != "fault" or _text(op, "target") != taken.process:
            continue
        kind = _text(op, "kind")
        if kind == "crash":
            return op.time + ttl
        if kind == "freeze" and (_number(op, "seconds") or 0.0) > ttl:
            return op.time + ttl
    return None


def spend_within_budget(ops: Sequence[Op]) -> list[Violation]:
    """No scope spends more than its budget.

    The last ``budget`` op of a scope (ok, any process) sets its ``limit``; the ``units`` of its
    ok ``spend`` ops must not add up to more. Spending in a scope without a budget is allowed.
    """
    budgets: dict[str, tuple[Op, float]] = {}
    spends: dict[str, list[tuple[Op, float]]] = defaultdict(list)
    for op in ops:
        scope, number = _text(op, "scope"), _number(op, "limit" if op.f == "budget" else "units")
        if op.type == "ok" and scope is not None and number is not None:
            if op.f == "budget":
                budgets[scope] = (op, number)
            elif op.f == "spend":
                spends[scope].append((op, number))
    report = _Report("spend_within_budget", ops)
    for scope, (budget, limit) in budgets.items():
        spent = [op for op, _ in spends[scope]]
        totals = list(accumulate(units for _, units in spends[scope]))
        crossing = next((i for i, total in enumerate(totals) if total > limit), None)
        if crossing is None:
            continue
        over, total = spent[crossing], totals[-1]
        proof = spent[: crossing + 1] if len(spent) <= 6 else [*spent[:2], over, spent[-1]]
        report.add(
            f"scope {scope} spent {_amount(total)} of {_amount(limit)} in {len(spent)} "
            f"spend{'s' * (len(spent) > 1)}; the spend at #{over.index} crossed the limit",
            [budget, *proof],
            f"#{budget.index} the budget of scope {scope} was set to {_amount(limit)}.",
            f"#{over.index} {over.process} spent {_amount(spends[scope][crossing][1])}, bringing "
            f"the total to {_amount(totals[crossing])}.",
            *(
                [f"In all, {len(spent)} spends came to {_amount(total)}."]
                if over is not spent[-1]
                else []
            ),
            about=[(scope,)],
        )
    return report.found


def effects_traced(ops: Sequence[Op]) -> list[Violation]:
    """Every side effect traces to exactly one step the plan began.

    Each ok ``effect`` must name a ``step``; when the history has ``step`` ops (ok or invoke),
    that step must be one of them; and each ``resource`` must be created under one step only.
    """
    begun = {
        (_text(op, "task"), _text(op, "step"))
        for op in ops_of(ops, "step", None)
        if op.type in ("ok", "invoke")
    }
    report = _Report("effects_traced", ops)
    owners: dict[str, dict[tuple[str | None, str], Op]] = defaultdict(dict)
    for op in ops_of(ops, "effect"):
        kind, step, task = _text(op, "kind") or "effect", _text(op, "step"), _text(op, "task")
        what = f"the {kind} effect at #{op.index} ({_resource(op)})"
        created = f"#{op.index} {op.process} created {kind} {_resource(op)}"
        if step is None:
            report.add(
                f"{what} names no step, so it cannot be traced to the plan",
                [op],
                f"{created}, naming no step.",
            )
        elif begun and not _began(begun, task, step):
            report.add(
                f"{what} names {_step(task, step)}, which the plan never began",
                [op],
                f"{created} for {_step(task, step)}, which no step op began.",
                about=[(task, step)],
            )
        elif op.value.get("resource") is not None:
            owners[_canon(op.value["resource"])].setdefault((task, step), op)
    for steps in owners.values():
        if len(steps) < 2:
            continue
        (first_step, a), (second_step, b) = list(steps.items())[:2]
        count = "two steps" if len(steps) == 2 else f"{len(steps)} steps"
        report.add(
            f"resource {_resource(a)} was created under {count}: {_step(*first_step)} at "
            f"#{a.index} and {_step(*second_step)} at #{b.index}",
            [a, b],
            f"#{a.index} {a.process} created {_resource(a)} for {_step(*first_step)}.",
            f"#{b.index} {b.process} created it again for {_step(*second_step)}.",
            about=[first_step, second_step],
        )
    return report.found


def _began(begun: set[tuple[str | None, str | None]], task: str | None, step: str) -> bool:
    """Whether a step op began this step (of this task, when both name their task)."""
    if task is None:
        return any(s == step for _, s in begun)
    return (task, step) in begun or (None, step) in begun


def facts_agree(ops: Sequence[Op]) -> list[Violation]:
    """No two facts assert different values for one field of one scope.

    Ok ``fact`` ops are grouped by ``scope`` and ``field``; values are compared as canonical JSON
    (``1`` is not ``"1"``). At most one violation per field, naming both branches, their values
    and their evidence.
    """
    groups: dict[tuple[str, str], dict[str, Op]] = defaultdict(dict)
    for op in ops_of(ops, "fact"):
        field = _text(op, "field")
        if field is not None and "value" in op.value:
            group = groups[(_canon(op.value.get("scope")), field)]
            group.setdefault(_canon(op.value["value"]), op)  # the first fact of each value
    report = _Report("facts_agree", ops)
    for (_, field), values in groups.items():
        if len(values) < 2:
            continue
        a, b = list(values.values())[:2]
        scope = a.value.get("scope")
        where = f"field {field}" + ("" if scope is None else f" of scope {_name(scope)}")
        same = _canon(a.value.get("branch")) == _canon(b.value.get("branch"))
        who = "the same branch later" if same else f"branch {_branch(b)}"
        more = f" ({len(values)} different values in all)" if len(values) > 2 else ""
        report.add(
            f"{where} has conflicting values: branch {_branch(a)} found {_told(a)} at "
            f"#{a.index}, but {who} found {_told(b)} at #{b.index}{more}",
            [a, b],
            *(f"#{op.index} branch {_branch(op)} asserted {field} = {_told(op)}." for op in (a, b)),
            about=[
                (_text(a, "scope"),),
                (_text(a, "branch"), _text(a, "step")),
                (_text(b, "branch"), _text(b, "step")),
                (_text(a, "branch"),),
                (_text(b, "branch"),),
            ],
        )
    return report.found


def completions(ops: Sequence[Op]) -> list[Violation]:
    """Every enqueued task ended exactly once, and said why when it did not succeed.

    For each task of an ok ``enqueue``: at most one ok ``complete``; never both completed and
    dead-lettered; and without a completion, a ``dead`` or ``cancel`` op (ok or info) with a
    non-empty ``reason``.
    """
    enqueued: dict[str, Op] = {}
    for op in ops_of(ops, "enqueue"):
        enqueued.setdefault(_text(op, "task") or "", op)
    enqueued.pop("", None)
    done: dict[str, list[Op]] = defaultdict(list)
    stopped: dict[str, list[Op]] = defaultdict(list)
    last: dict[str, Op] = {}
    for op in ops:
        task = _text(op, "task")
        if task in enqueued:
            last[task] = op
            if _ends(op):
                (done if op.f == "complete" else stopped)[task].append(op)
    report = _Report("completions", ops)

    def add(task: str, message: str, *proof: Op) -> None:
        story = [f"#{op.index} {op.process} {_did(op)} task {task}." for op in proof]
        report.add(f"task {task} {message}", proof, *story, about=[(task,)])

    for task, enqueue in enqueued.items():
        completed, dead = done[task], [op for op in stopped[task] if op.f == "dead"]
        silent = [op for op in stopped[task] if _text(op, "reason") is None]
        if len(completed) > 1:
            a, b = completed[:2]
            count = "two" if len(completed) == 2 else f"{len(completed)}"
            first = "" if len(completed) == 2 else " the first two"
            add(
                task, f"has {count} accepted completions,{first} at #{a.index} and #{b.index}", a, b
            )
        if completed and dead:
            add(
                task,
                f"was both completed (#{completed[0].index}) and dead-lettered (#{dead[0].index})",
                completed[0],
                dead[0],
            )
        elif not completed and not stopped[task]:
            add(
                task,
                "never ended: not done, dead-lettered or cancelled",
                *([enqueue] if last[task] is enqueue else [enqueue, last[task]]),
            )
        elif not completed and silent:
            add(
                task, f"was {_ENDED[silent[0].f]} at #{silent[0].index} without a reason", silent[0]
            )
    return report.found


def _did(op: Op) -> str:
    done = {"enqueue": "enqueued", **_ENDED}.get(op.f)
    if done is None:
        return f"recorded {op.f} ({op.type}) for"
    return done if op.type == "ok" else f"{done} ({op.type})"


CHECKERS: dict[str, Checker] = {
    "created_once": created_once,
    "monotonic": monotonic,
    "locks_released": locks_released,
    "spend_within_budget": spend_within_budget,
    "effects_traced": effects_traced,
    "facts_agree": facts_agree,
    "completions": completions,
}
"""Every checker by name, in the order :func:`check` runs them."""


def check(
    history: History | Sequence[Op], checkers: Mapping[str, Checker] | None = None
) -> list[Violation]:
    """Run checkers over a history and gather their violations.

    Args:
        history: a :class:`~agentlease.harness.history.History` or its ops.
        checkers: the checkers to run, by name; :data:`CHECKERS` when omitted.

    Returns:
        The violations of each checker in turn (``[]`` for a clean history).
    """
    ops = history.ops if isinstance(history, History) else history
    found: list[Violation] = []
    for checker in (CHECKERS if checkers is None else checkers).values():
        found.extend(checker(ops))
    return found
