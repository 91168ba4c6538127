"""The Redis scripts' partition work is made only where a task has a partition."""

from __future__ import annotations

import pytest

from agentlease.backends import lua


@pytest.mark.parametrize("name", ["complete", "fail"])
def test_unpark_is_made_only_for_a_task_with_a_partition(name: str) -> None:
    top, body = lua.SCRIPTS[name].text.decode().split(f"-- {name}.lua\n")
    assert "local function unpark(" not in top
    assert "local function unpark(" in body


def test_claim_makes_unpark_only_when_it_searches() -> None:
    top, body = lua.SCRIPTS["claim"].text.decode().split("-- claim.lua\n")
    assert "local function unpark(" not in top
    assert body.index("local function unpark(") > body.index("if woke then")


def test_every_partition_key_carries_the_queue_tag() -> None:
    keys = lua.queue_keys("p", "q")
    for name in ("enqueue", "claim", "complete", "fail", "reap", "requeue_dead", "stats"):
        assert {"{p:q}:pk", "{p:q}:ph"} <= set(getattr(keys, name)), name
