"""Typed facts and their reconciliation: agreement, preferred sources, versions, unions, and
conflicts that name both branches and their evidence."""

from __future__ import annotations

import pytest

import agentlease as al


def fact(field: str, value: object, source: str, **kw: object) -> al.Fact:
    return al.Fact(field=field, value=value, source=source, **kw)  # type: ignore[arg-type]


def test_agreeing_branches_merge_and_key_order_does_not_matter() -> None:
    merged = al.reconcile(
        [
            fact("order", {"id": 7, "status": "paid"}, "billing"),
            fact("order", {"status": "paid", "id": 7}, "crm"),
            fact("customer", "ada", "crm"),
        ]
    )
    assert merged == {"order": {"id": 7, "status": "paid"}, "customer": "ada"}


def test_a_disagreement_names_both_branches_and_their_evidence() -> None:
    with pytest.raises(al.ReconciliationConflict) as caught:
        al.reconcile(
            [
                fact("status", "paid", "billing", step="s1", evidence="invoice 12"),
                fact("status", "refunded", "crm", evidence="ticket 9"),
            ]
        )
    conflict = caught.value
    assert conflict.field == "status"
    assert (conflict.first.source, conflict.second.source) == ("billing", "crm")
    for text in ("'billing'", "'crm'", "invoice 12", "ticket 9", "'paid'", "'refunded'", "s1"):
        assert text in str(conflict)
    with pytest.raises(al.ReconciliationConflict):
        al.reconcile([fact("n", 1, "a"), fact("n", "1", "b")])  # 1 is not "1"


def test_policies() -> None:
    facts = [
        fact("status", "paid", "crm", version=3),
        fact("status", "refunded", "billing", version=5),
        fact("tags", ["vip", "eu"], "crm"),
        fact("tags", ["eu", {"k": 1}], "billing"),
        fact("owner", "bob", "crm"),
        fact("owner", "eve", "billing"),
    ]
    merged = al.reconcile(
        facts,
        {
            "status": al.LatestByVersion(),
            "tags": al.Union(),
            "owner": al.PreferSource("billing", "crm"),
        },
    )
    assert merged == {"status": "refunded", "tags": ["vip", "eu", {"k": 1}], "owner": "eve"}
    with pytest.raises(al.ReconciliationConflict):
        al.reconcile(facts[4:], {"owner": al.PreferSource("hr")})  # nobody preferred: must agree


def test_equal_versions_with_different_values_conflict() -> None:
    with pytest.raises(al.ReconciliationConflict) as caught:
        al.reconcile(
            [
                fact("v", 1, "a", version=2),
                fact("v", 2, "b", version=2),
                fact("v", 0, "c", version=1),
            ],
            {"v": al.LatestByVersion()},
        )
    assert "version 2" in str(caught.value)


def test_bad_facts_and_policies_are_typed_refusals() -> None:
    for bad in (
        {"field": "", "value": 1, "source": "a"},
        {"field": "f", "value": 1, "source": "a b"},
        {"field": "f", "value": {1, 2}, "source": "a"},
        {"field": "f", "value": 1, "source": "a", "version": -1},
        {"field": "f", "value": 1, "source": "a", "evidence": object()},
    ):
        with pytest.raises(al.InvalidInput):
            al.Fact(**bad)  # type: ignore[arg-type]
    with pytest.raises(al.InvalidInput):
        al.reconcile(["not a fact"])  # type: ignore[list-item]
    with pytest.raises(al.InvalidInput):
        al.reconcile([fact("t", "x", "a")], {"t": al.Union()})
    with pytest.raises(al.InvalidInput):
        al.reconcile([fact("v", 1, "a")], {"v": al.LatestByVersion()})
    with pytest.raises(al.InvalidInput):
        al.PreferSource()
    with pytest.raises(al.InvalidInput):
        al.Fact.from_json({"field": "f", "value": 1})
    one = fact("f", [1], "a", step="s", evidence={"url": "u"}, version=4)
    assert al.Fact.from_json(one.as_json()) == one
