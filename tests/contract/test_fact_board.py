"""Facts contributed through the store by many branches at once, then reconciled, on every
store (threads stand in for processes; the board is one record written field by field)."""

from __future__ import annotations

import threading

import pytest

import agentlease as al


def test_branches_contribute_concurrently_and_reconcile(state: al.SharedState) -> None:
    board = al.FactBoard(state, scope="request-3")

    def branch(name: str) -> None:
        mine = al.FactBoard(state, scope="request-3")
        mine.add(al.Fact(field="city", value="Paris", source=name, evidence=f"{name} page"))
        mine.add(al.Fact(field="tags", value=[name], source=name))

    threads = [threading.Thread(target=branch, args=(f"b{n}",)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(board.facts()) == 12  # nobody's finding overwrote another's
    merged = board.reconcile({"tags": al.Union()})
    assert merged["city"] == "Paris"
    assert sorted(merged["tags"]) == [f"b{n}" for n in range(6)]  # type: ignore[arg-type]
    board.add(al.Fact(field="city", value="Lyon", source="b3", evidence="b3 second look"))
    with pytest.raises(al.ReconciliationConflict) as caught:
        board.reconcile({"tags": al.Union()})
    assert "b3 second look" in str(caught.value)
    assert al.FactBoard(state, scope="request-4").facts() == []
    with pytest.raises(al.MissingIdentity):
        al.FactBoard(state).facts()


async def test_the_async_face(astate: al.AsyncSharedState) -> None:
    state = astate
    board = al.AsyncFactBoard(state, scope="request-5")
    await board.add(al.Fact(field="n", value=1, source="a", version=1))
    await board.add(al.Fact(field="n", value=2, source="b", version=2))
    assert await board.reconcile({"n": al.LatestByVersion()}) == {"n": 2}
