"""The sealed plan: JSON with a MAC under the store's secret. Every edit (a field, a read's
version, the order of reads or writes, truncation), a plan of another store and anything that
is not a well-formed plan is refused with PlanRefused before the store is touched."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

import agentlease as al
from agentlease import PlanRefused
from agentlease._async.plans import FORMAT
from agentlease.backends.memory import MemoryBackend


def _state() -> al.SharedState:
    return al.SharedState(MemoryBackend(), space="shop")


def _sealed(state: al.SharedState) -> str:
    state.compare_and_set("order", 0, {"status": "paid"})
    with state.plan(step="refund-42", expires_in=3600) as plan:
        state.get("order")
        state.get("ledger")
        state.counter("refunds")
        plan.set_field("order", "status", "refunded")
        plan.compare_and_set("ledger", {"amount": 40})
        plan.reserve("refunds", 1, limit=5)
    return plan.seal()


def _untouched(state: al.SharedState) -> None:
    assert state.get("order").value == {"status": "paid"}
    assert state.get("ledger").version == 0
    assert state.counter("refunds") == 0


def test_the_sealed_plan_is_json_with_every_part() -> None:
    state = _state()
    body = orjson.loads(_sealed(state))
    assert body["format"] == FORMAT
    assert body["step"] == "refund-42"
    assert body["space"] == "shop"
    assert body["not_after"] == pytest.approx(body["created_at"] + 3600)
    assert [(r["kind"], r["key"], r["version"]) for r in body["reads"]] == [
        ("record", "order", 1),
        ("record", "ledger", 0),
        ("counter", "refunds", 0),
    ]
    assert body["writes"][0] == {
        "kind": "record",
        "key": "order",
        "fields": {"status": "refunded"},
        "replace": False,
        "machine": None,
        "fence": None,
    }
    assert body["writes"][2]["kind"] == "counter"
    assert len(body["mac"]) == 64


def _edit(path: list[Any], value: object) -> Callable[[dict[str, Any]], None]:
    def apply(body: dict[str, Any]) -> None:
        target: Any = body
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return apply


EDITS = {
    "step": _edit(["step"], "refund-43"),
    "space": _edit(["space"], "other"),
    "id": _edit(["id"], "0" * 32),
    "not_after": _edit(["not_after"], None),
    "keep_for": _edit(["keep_for"], 1.0),
    "read version": _edit(["reads", 0, "version"], 2),
    "read key": _edit(["reads", 0, "key"], "order2"),
    "write value": _edit(["writes", 0, "fields", "status"], "paid"),
    "write replace": _edit(["writes", 0, "replace"], True),
    "counter limit": _edit(["writes", 2, "high"], 10**9),
    "reads reordered": lambda b: b["reads"].reverse(),
    "writes reordered": lambda b: b["writes"].reverse(),
    "read dropped": lambda b: b["reads"].pop(),
    "mac": _edit(["mac"], "0" * 64),
    "mac removed": lambda b: b.pop("mac"),
    "extra field": _edit(["extra"], 1),
    "format": _edit(["format"], 2),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edited_plan_is_refused(edit: str) -> None:
    state = _state()
    body = orjson.loads(_sealed(state))
    EDITS[edit](body)
    with pytest.raises(PlanRefused):
        state.act(orjson.dumps(body).decode(), approved_by="ada")
    _untouched(state)


def test_a_truncated_or_foreign_text_is_refused() -> None:
    state = _state()
    sealed = _sealed(state)
    for text in [sealed[:-1], sealed[: len(sealed) // 2], "", "null", "[]", "{}", "x" * 100]:
        with pytest.raises(PlanRefused):
            state.act(text, approved_by="ada")
    for value in [None, 42, b"\xff\xfe", {"format": 1}]:
        with pytest.raises(PlanRefused):
            state.act(value, approved_by="ada")  # type: ignore[arg-type]
    _untouched(state)


def test_a_plan_sealed_by_another_store_is_refused() -> None:
    here, there = _state(), _state()
    sealed = _sealed(there)
    here.compare_and_set("order", 0, {"status": "paid"})
    with pytest.raises(PlanRefused, match="another store"):
        here.act(sealed, approved_by="ada")
    assert here.get("order").value == {"status": "paid"}


def test_the_json_key_order_does_not_matter_but_its_content_does() -> None:
    state = _state()
    body = orjson.loads(_sealed(state))
    reordered = dict(reversed(list(body.items())))
    receipt = state.act(orjson.dumps(reordered).decode(), approved_by="ada")
    assert receipt.first


def test_a_huge_text_is_refused_before_parsing() -> None:
    state = _state()
    with pytest.raises(PlanRefused):
        state.act(" " * (2**20 + 1), approved_by="ada")
