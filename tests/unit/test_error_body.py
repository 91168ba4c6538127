"""The JSON body of a refusal that integrations hand to an agent (agentlease._error_body)."""

from __future__ import annotations

import json

import agentlease as al
from agentlease._error_body import error_body


def test_a_lease_lost_names_both_attempts() -> None:
    body = error_body(al.LeaseLost("t-1", 3, 4, "leased"))
    assert body["error"] == "LeaseLost"
    assert (body["task_id"], body["attempt"], body["current_attempt"]) == ("t-1", 3, 4)
    assert body["state"] == "leased"
    assert "attempt 3" in body["message"]
    json.dumps(body)


def test_values_that_are_not_plain_json_become_text() -> None:
    current = {"when": object(), "tags": {"b", "a"}, "ratio": float("nan"), "n": [1, (2, 3)]}
    body = error_body(al.ConflictError("order:1", 2, 5, current))
    assert body["expected_version"] == 2
    assert body["current_version"] == 5
    value = body["current_value"]
    assert isinstance(value["when"], str)
    assert value["tags"] == ["a", "b"]
    assert value["ratio"] == "nan"
    assert value["n"] == [1, [2, 3]]
    json.dumps(body, allow_nan=False)


def test_a_refusal_for_a_planner_gives_its_payload() -> None:
    exc = al.CircuitOpen("payments", "open", 5, 12.5, tool="charge")
    assert error_body(exc) == exc.payload()
    assert error_body(exc)["error"] == "CircuitOpen"


def test_other_exceptions_give_their_type_and_message_only() -> None:
    exc = ValueError("bad")
    exc.secret = "hunter2"  # type: ignore[attr-defined]
    assert error_body(exc) == {"error": "ValueError", "message": "bad"}
