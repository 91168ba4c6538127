"""The harness's checkers: each invariant passes a clean history, catches each kind of violation
with its few witness ops and a "because" that names the faults, and survives malformed values."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from agentlease.harness.checkers import (
    CHECKERS,
    Checker,
    Violation,
    check,
    completions,
    created_once,
    effects_traced,
    facts_agree,
    locks_released,
    monotonic,
    spend_within_budget,
)
from agentlease.harness.history import History, Op


def new() -> History:
    """A history on a clock that ticks one second per op: op #i happens at time i + 1."""
    ticks = itertools.count()
    return History(clock=lambda: float(next(ticks)))


def indices(violation: Violation) -> list[int]:
    return [op.index for op in violation.witness]


def only(found: list[Violation]) -> Violation:
    assert len(found) == 1, [v.message for v in found]
    return found[0]


# -- created_once ----------------------------------------------------------------------------


def test_created_once_passes_one_resource_per_step_and_kind() -> None:
    h = new()
    h.world("effect", task="t1", step="s1", kind="charge", resource="ch-1")
    h.world("effect", task="t1", step="s1", kind="email", resource="em-1")  # another kind
    h.world("effect", task="t2", step="s1", kind="charge", resource="ch-2")  # another task
    h.record("world", "info", "effect", task="t1", step="s1", kind="charge", resource="ch-3")
    h.world("effect", step="s2", resource="r-1")
    assert created_once(h.ops) == []


def test_created_once_names_the_step_both_resources_and_the_fault() -> None:
    h = new()
    h.world("step", task="t1", step="s3")  # 0
    h.fault("duplicate", "tool:charge:duplicate", "t2/s3/1")  # 1: another task: not a cause
    h.world("effect", task="t1", step="s3", kind="charge", resource="ch-1")  # 2
    h.fault("duplicate", "tool:charge:duplicate", "t1/s3/1")  # 3
    h.world("effect", task="t1", step="s3", kind="charge", resource="ch-2")  # 4
    h.fault("crash", "worker", "t1/s3/2")  # 5: after the proof: not a cause
    v = only(created_once(h.ops))
    assert v.checker == "created_once"
    assert v.message == "step s3 of task t1 created charge twice: ch-1 at #2 and ch-2 at #4"
    assert indices(v) == [2, 3, 4]
    assert v.because[0].startswith("#2 world created charge ch-1")
    assert v.because[1] == (
        "#3 the nemesis delivered the call to charge twice"
        " (site tool:charge:duplicate, key t1/s3/1)."
    )
    assert v.because[2].startswith("#4 world created charge ch-2")
    assert len(v.because) == 4  # a timeline of two effects and one fault, then the rule


def test_created_once_counts_more_than_two_but_witnesses_two() -> None:
    h = new()
    for n in range(3):
        h.world("effect", step="s1", resource=f"r-{n}")
    v = only(created_once(h.ops))
    assert v.message == "step s1 created effect 3 times: r-0 at #0, r-1 at #1 and 1 more"
    assert indices(v) == [0, 1]


# -- monotonic -------------------------------------------------------------------------------

ORDER = ["pending", "paid", "shipped"]


def test_monotonic_passes_linked_forward_moves() -> None:
    h = new()
    h.world("transition", key="o1", **{"from": "pending", "to": "paid"}, order=ORDER)
    h.world("transition", key="o2", **{"from": None, "to": {"n": 1}})
    h.world("transition", key="o1", **{"from": "paid", "to": "shipped"}, order=ORDER)
    h.world("transition", key="o2", **{"from": {"n": 1}, "to": {"n": 2}})
    h.record("w1", "fail", "transition", key="o1", **{"from": "pending", "to": "paid"})
    assert monotonic(h.ops) == []


def test_monotonic_catches_a_lost_update() -> None:
    h = new()
    h.world("transition", key="o1", **{"from": "pending", "to": "paid"})  # 0
    h.fault("freeze", "process:freeze", "o1")  # 1
    h.world("transition", key="o1", **{"from": "pending", "to": "cancelled"})  # 2
    v = only(monotonic(h.ops))
    assert v.message == (
        'key o1 was moved from "pending" at #2, but #0 had already moved it to "paid": '
        "that update was lost"
    )
    assert indices(v) == [0, 1, 2]
    assert v.because[1].startswith("#1 the nemesis froze the agent process")
    assert "#2 world moved o1 from " in v.because[2]


def test_monotonic_catches_a_move_backwards_in_its_order() -> None:
    h = new()
    h.world("transition", key="o1", **{"from": "pending", "to": "paid"}, order=ORDER)
    h.world("transition", key="o1", **{"from": "paid", "to": "pending"}, order=ORDER)
    h.world("transition", key="o2", **{"from": "paid", "to": "paid"}, order=ORDER)  # stood still
    found = monotonic(h.ops)
    assert [indices(v) for v in found] == [[1], [2]]
    assert "not forward in its order" in found[0].message
    assert '"pending" -> "paid" -> "shipped"' in found[0].message


# -- locks_released --------------------------------------------------------------------------


def test_locks_released_passes_released_expired_and_unended_locks() -> None:
    h = new()
    h.world("lock", lock="L1", owner="w1", task="t1")  # 0
    h.world("lock", lock="L1", owner="w1", task="t1")  # 1: taken again (renewed)
    h.world("unlock", lock="L1", owner="w1")  # 2
    h.world("complete", task="t1")  # 3
    h.world("lock", lock="L2", owner="w2", task="t2", expires=6.0)  # 4: expires as it ends
    h.world("dead", task="t2", reason="poison")  # 5, at 6.0s
    h.world("lock", lock="L3", owner="w3", task="t3")  # never ends: not this checker's business
    h.world("lock", lock="L4", owner="w4", task="t1")  # taken after its task ended
    assert locks_released(h.ops) == []


def test_locks_released_catches_a_lock_held_past_the_end() -> None:
    h = new()
    h.world("lock", lock="L1", owner="w1", task="t1")  # 0
    h.world("unlock", lock="L1", owner="w2")  # 1: another owner's release does not count
    h.fault("crash", "process:crash", "t1/s1/1")  # 2
    h.record("store", "info", "cancel", task="t1", reason="stop")  # 3 ends it (info counts)
    h.world("unlock", lock="L1", owner="w1")  # 4: too late
    v = only(locks_released(h.ops))
    assert v.message == (
        "lock L1 taken by w1 for task t1 at #0 was still held when the task was cancelled at #3"
    )
    assert indices(v) == [0, 2, 3]
    assert "with no expiry" in v.because[0]
    assert v.because[1].startswith("#2 the nemesis killed the agent process")


def test_locks_released_catches_a_lock_that_would_expire_only_after_the_end() -> None:
    h = new()
    h.world("lock", lock="L1", owner="w1", task="t1", expires=30.0)  # 0
    h.world("complete", task="t1")  # 1, at 2.0s
    v = only(locks_released(h.ops))
    assert indices(v) == [0, 1]
    assert "completed at #1" in v.message
    assert "to expire at 30.000s" in v.because[0]


# -- spend_within_budget ---------------------------------------------------------------------


def test_spend_within_budget_passes_spending_up_to_the_limit() -> None:
    h = new()
    h.world("budget", scope="t1", limit=10)
    h.world("spend", scope="t1", units=4)
    h.world("spend", scope="t1", units=6)
    h.record("w1", "fail", "spend", scope="t1", units=5)  # did not happen
    h.world("spend", scope="t9", units=1000)  # no budget
    assert spend_within_budget(h.ops) == []


def test_spend_within_budget_witnesses_the_spends_up_to_the_crossing() -> None:
    h = new()
    h.world("budget", scope="t1", limit=10)  # 0
    h.world("spend", scope="t1", units=6)  # 1
    h.world("spend", scope="t1", units=3)  # 2
    h.world("spend", scope="t1", units=2.5)  # 3 crosses
    h.world("spend", scope="t1", units=1)  # 4
    v = only(spend_within_budget(h.ops))
    assert v.message == "scope t1 spent 12.5 of 10 in 4 spends; the spend at #3 crossed the limit"
    assert indices(v) == [0, 1, 2, 3]
    assert "bringing the total to 11.5" in v.because[1]


def test_spend_within_budget_keeps_a_long_witness_short() -> None:
    h = new()
    h.world("budget", scope="t1", limit=10)  # 0
    h.fault("duplicate", "tool:llm:duplicate", "t1/s2/1")  # 1
    for _ in range(14):
        h.world("spend", scope="t1", units=1)  # 2..15; the 11th (#12) crosses
    v = only(spend_within_budget(h.ops))
    assert v.message.startswith("scope t1 spent 14 of 10 in 14 spends")
    assert indices(v) == [0, 1, 2, 3, 12, 15]
    assert any(
        line.startswith("#1 the nemesis delivered the call to llm twice") for line in v.because
    )


# -- effects_traced --------------------------------------------------------------------------


def test_effects_traced_passes_effects_of_begun_steps() -> None:
    h = new()
    h.invoke("agent-1", "step", task="t1", step="s1")
    h.record("agent-1", "ok", "step", step="s2")
    h.world("effect", task="t1", step="s1", resource="r-1")
    h.world("effect", task="t7", step="s2", resource="r-2")  # the step op names no task
    h.world("effect", step="s1", resource="r-3")  # the effect names no task
    h.world("effect", task="t1", step="s1", resource="r-1")  # the same step again is fine here
    assert effects_traced(h.ops) == []


def test_effects_traced_catches_untraceable_and_unknown_steps() -> None:
    h = new()
    h.world("step", task="t1", step="s1")  # 0
    h.world("effect", kind="charge", resource="ch-1")  # 1: no step
    h.world("effect", step="", resource="ch-2")  # 2: an empty step
    h.world("effect", task="t2", step="s1", resource="ch-3")  # 3: s1 began for t1 only
    h.world("effect", task="t1", step="s9")  # 4: never began
    found = effects_traced(h.ops)
    assert [indices(v) for v in found] == [[1], [2], [3], [4]]
    assert found[0].message == (
        "the charge effect at #1 (ch-1) names no step, so it cannot be traced to the plan"
    )
    assert found[3].message == (
        "the effect effect at #4 (one) names step s9 of task t1, which the plan never began"
    )


def test_effects_traced_without_step_ops_checks_only_the_step_names() -> None:
    h = new()
    h.world("effect", step="s1", resource="r-1")
    h.world("effect", resource="r-2")
    assert [indices(v) for v in effects_traced(h.ops)] == [[1]]


def test_effects_traced_catches_a_resource_under_two_steps() -> None:
    h = new()
    h.world("effect", task="t1", step="s1", resource="r-1")  # 0
    h.world("effect", task="t1", step="s2", resource="r-2")  # 1
    h.world("effect", task="t1", step="s2", resource="r-1")  # 2
    v = only(effects_traced(h.ops))
    assert v.message == (
        "resource r-1 was created under two steps: step s1 of task t1 at #0 and "
        "step s2 of task t1 at #2"
    )
    assert indices(v) == [0, 2]


# -- facts_agree -----------------------------------------------------------------------------


def test_facts_agree_passes_equal_values_and_separate_scopes() -> None:
    h = new()
    h.world("fact", scope="t1", field="order", value={"id": 7, "s": "paid"}, branch="billing")
    h.world("fact", scope="t1", field="order", value={"s": "paid", "id": 7}, branch="crm")
    h.world("fact", scope="t2", field="order", value="other", branch="crm")
    h.record("b", "info", "fact", scope="t1", field="order", value="maybe", branch="b")
    assert facts_agree(h.ops) == []


def test_facts_agree_names_both_branches_values_and_evidence() -> None:
    h = new()
    fact = {"scope": "t1", "field": "status"}
    h.world("fact", **fact, value="paid", branch="billing", step="s1", evidence="invoice 12")
    h.fault("ack_lost", "tool:crm:ack_lost", "t1/s2/1")  # 1
    h.world("fact", **fact, value="refunded", branch="crm", step="s2", evidence="ticket 9")
    h.world("fact", scope="t1", field="status", value="open", branch="crm")  # 3: a third value
    v = only(facts_agree(h.ops))
    assert v.message == (
        'field status of scope t1 has conflicting values: branch billing found "paid" at step s1 '
        '(evidence: invoice 12) at #0, but branch crm found "refunded" at step s2 (evidence: '
        "ticket 9) at #2 (3 different values in all)"
    )
    assert indices(v) == [0, 1, 2]
    assert "#1 the nemesis lost the acknowledgement of the call to crm" in v.because[1]


def test_facts_agree_tells_json_types_apart_and_a_branch_from_itself() -> None:
    h = new()
    h.world("fact", field="n", value=1, branch="a")
    h.world("fact", field="n", value="1", branch="a")
    v = only(facts_agree(h.ops))
    assert 'branch a found 1 at #0, but the same branch later found "1" at #1' in v.message


# -- completions -----------------------------------------------------------------------------


def test_completions_passes_tasks_that_ended_once() -> None:
    h = new()
    for task in ("t1", "t2", "t3"):
        h.invoke("client", "enqueue", task=task).ok()
    h.invoke("w1", "complete", task="t1", attempt=1).fail()  # refused: not a completion
    h.world("complete", task="t1", attempt=2)
    h.world("dead", task="t2", reason="poison")
    h.record("store", "info", "cancel", task="t3", reason="user asked")
    h.world("complete", task="t9")  # never enqueued: not this history's task
    assert completions(h.ops) == []


def test_completions_catches_each_way_a_task_ends_wrongly() -> None:
    h = new()
    for task in ("t1", "t2", "t3", "t4"):
        h.world("enqueue", task=task)  # 0..3
    h.world("complete", task="t1", attempt=1)  # 4
    h.fault("lost_ack", "complete", "t1/s1/1")  # 5
    h.world("complete", task="t1", attempt=2)  # 6
    h.world("complete", task="t2")  # 7
    h.world("dead", task="t2", reason="timeout")  # 8
    h.invoke("w1", "claim", task="t3").info()  # 9, 10
    h.world("dead", task="t4", reason="")  # 11
    found = completions(h.ops)
    messages = [v.message for v in found]
    assert messages == [
        "task t1 has two accepted completions, at #4 and #6",
        "task t2 was both completed (#7) and dead-lettered (#8)",
        "task t3 never ended: not done, dead-lettered or cancelled",
        "task t4 was dead-lettered at #11 without a reason",
    ]
    assert [indices(v) for v in found] == [[4, 5, 6], [7, 8], [2, 10], [11]]
    assert "#5 the nemesis injected a lost_ack fault into a call" in found[0].because[1]


# -- check, loading, format ------------------------------------------------------------------


def bad_created_once(h: History) -> None:
    h.world("effect", task="ta", step="s1", kind="charge", resource="ch-1")
    h.fault("duplicate", "tool:charge:duplicate", "ta/s1/1")
    h.world("effect", task="ta", step="s1", kind="charge", resource="ch-2")


def bad_monotonic(h: History) -> None:
    h.world("transition", key="ob", **{"from": "new", "to": "paid"})
    h.world("transition", key="ob", **{"from": "new", "to": "void"})


def bad_locks_released(h: History) -> None:
    h.world("lock", lock="Lc", owner="wc", task="tc")
    h.world("cancel", task="tc", reason="stop")


def bad_spend_within_budget(h: History) -> None:
    h.world("budget", scope="td", limit=1)
    h.world("spend", scope="td", units=2)


def bad_effects_traced(h: History) -> None:
    h.world("effect", kind="email", resource="em-1")


def bad_facts_agree(h: History) -> None:
    h.world("fact", scope="tf", field="status", value="paid", branch="x")
    h.world("fact", scope="tf", field="status", value="void", branch="y")


def bad_completions(h: History) -> None:
    h.world("enqueue", task="tg")


BAD: dict[str, Callable[[History], None]] = {
    "created_once": bad_created_once,
    "monotonic": bad_monotonic,
    "locks_released": bad_locks_released,
    "spend_within_budget": bad_spend_within_budget,
    "effects_traced": bad_effects_traced,
    "facts_agree": bad_facts_agree,
    "completions": bad_completions,
}


def all_bad() -> History:
    h = new()
    for write in BAD.values():
        write(h)
    return h


def test_check_finds_one_violation_per_checker_in_order() -> None:
    h = all_bad()
    found = check(h)
    assert [v.checker for v in found] == list(CHECKERS)
    assert check(h.ops) == found  # the ops alone do as well
    assert check(h, {"monotonic": monotonic}) == [found[1]]
    assert check(new()) == []


def test_a_history_loaded_from_its_file_gets_the_same_verdict() -> None:
    h = all_bad()
    loaded = History.loads(h.dumps())
    assert check(loaded) == check(h)


def test_format_shows_witness_because_seed_and_replay() -> None:
    h = new()
    bad_created_once(h)
    v = only(check(h))
    text = v.format(seed=7, replay="agentlease replay t.jsonl --seed 7")
    lines = text.splitlines()
    assert lines[0] == f"VIOLATION created_once: {v.message}"
    assert lines[1] == "witness:"
    assert lines[2:5] == [f"  {op.describe()}" for op in v.witness]
    assert lines[5] == "because:"
    fault = (
        "#1 the nemesis delivered the call to charge twice"
        " (site tool:charge:duplicate, key ta/s1/1)."
    )
    assert lines[6:9] == [f"  {line}" for line in v.because[:3]]
    assert lines[7] == f"  {fault}"
    assert lines[-2:] == ["seed: 7", "replay: agentlease replay t.jsonl --seed 7"]
    assert "seed" not in v.format()


def test_each_checker_is_load_bearing() -> None:
    """Every bad history is caught, and without any one checker some bad history passes: a
    checker mutated into a no-op fails this test."""
    corpus = []
    for name, write in BAD.items():
        h = new()
        write(h)
        assert [v.checker for v in check(h)] == [name]
        corpus.append(h)

    def caught_all(checkers: dict[str, Checker]) -> bool:
        return all(check(h, checkers) for h in corpus)

    assert caught_all(CHECKERS)
    for name in CHECKERS:
        disabled: Checker = lambda ops: []  # noqa: E731
        assert not caught_all({**CHECKERS, name: disabled}), f"{name} is not load-bearing"


MALFORMED = [
    {},
    {"task": None, "step": 3, "kind": [], "resource": {"a": [1]}, "key": None},
    {"task": ["t"], "step": {"s": 1}, "lock": 5, "owner": None, "expires": "soon"},
    {"scope": 1, "limit": "ten", "units": True, "field": None, "value": float("nan")},
    {"scope": "s", "limit": float("inf"), "units": None, "from": [], "to": {}, "order": "abc"},
    {"key": {"k": [1, 2]}, "from": 1, "to": 0, "order": [0, 1, {"x": None}]},
    {"field": "f", "value": None, "branch": ["b"], "evidence": {"e": 1}, "step": None},
    {"task": "t", "reason": 0, "site": 7, "kind": None},
]


@pytest.mark.parametrize("value", MALFORMED)
def test_malformed_values_are_skipped_not_raised_on(value: dict[str, object]) -> None:
    h = new()
    vocabulary = "step effect transition lock unlock budget spend fact enqueue complete dead cancel"
    for f in [*vocabulary.split(), "fault"]:
        for process, type_ in (("world", "ok"), ("nemesis", "info"), ("w1", "invoke")):
            h.record(process, type_, f, **value)  # type: ignore[arg-type]
    for violation in check(h):
        assert violation.witness
        assert violation.format()
    # A value that is not even JSON (only an in-process history can hold one).
    odd = {**value, "value": object(), "resource": object(), "key": object(), "to": object()}
    for f in ("effect", "fact", "transition"):
        assert isinstance(check([Op(0, 0.0, "world", "ok", f, odd)] * 2), list)


def test_typed_facts_recorded_into_a_history_are_what_facts_agree_reads() -> None:
    from agentlease import Fact

    h = new()
    h.fact(Fact(field="address", value="1 Oak Lane", source="crm", step="s1"), scope="o7")
    h.fact(Fact(field="address", value="9 Elm St", source="billing", step="s1"), scope="o7")
    h.fact(Fact(field="address", value="9 Elm St", source="billing", step="s1"), scope="o8")
    v = only(facts_agree(h.ops))
    assert "crm" in v.message
    assert "billing" in v.message
    assert indices(v) == [0, 1]
