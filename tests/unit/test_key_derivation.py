"""Idempotency keys: stable for the same action anywhere, different for any other action."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlease import InvalidName, MissingIdentity, NotJSON
from agentlease._policy.keys import (
    canonical_json,
    check_key,
    derive_key,
    fingerprint,
    fingerprint_names,
    key_and_fingerprint,
    legacy_fingerprint,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
ids = st.text(min_size=1, max_size=20)


def shuffled(value: object, rng: random.Random) -> object:
    """The same JSON value with every object's keys in another insertion order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


# A pinned vector: if this changes, every stored key changes; bump KEY_VERSION instead.
GOLDEN_ARGS = {"to": "ana@example.com", "amount": 12.5, "items": [1, 2.0, "é"], "ok": True}
GOLDEN_KEY = "828be458af95feecaefa16603cf6dafd17a1556a68069b09217f2d732c40a709"


@given(json_values, ids, ids, ids, st.integers(0, 2**32))
@settings(max_examples=300)
def test_the_key_ignores_dict_order(
    args: object, task: str, step: str, tool: str, seed: int
) -> None:
    other = shuffled(args, random.Random(seed))
    assert derive_key(task, step, tool, args) == derive_key(task, step, tool, other)
    assert fingerprint(args, tool, step) == fingerprint(other, tool, step)


@given(json_values, json_values, ids, ids, ids)
def test_the_key_differs_when_the_arguments_differ(
    a: object, b: object, task: str, step: str, tool: str
) -> None:
    same = canonical_json(a) == canonical_json(b)
    assert (derive_key(task, step, tool, a) == derive_key(task, step, tool, b)) == same
    assert (fingerprint(a, tool, step) == fingerprint(b, tool, step)) == same


@given(json_values, st.lists(ids, min_size=3, max_size=3), st.lists(ids, min_size=3, max_size=3))
def test_the_key_differs_when_any_identity_part_differs(
    args: object, one: list[str], two: list[str]
) -> None:
    k1 = derive_key(one[0], one[1], one[2], args)
    k2 = derive_key(two[0], two[1], two[2], args)
    assert (k1 == k2) == (one == two)


@given(json_values, st.lists(ids, min_size=2, max_size=2), st.lists(ids, min_size=2, max_size=2))
def test_the_fingerprint_differs_when_the_tool_or_step_differs(
    args: object, one: list[str], two: list[str]
) -> None:
    f1, f2 = fingerprint(args, one[0], one[1]), fingerprint(args, two[0], two[1])
    assert (f1 == f2) == (one == two)
    assert fingerprint_names(f1) == (one[0], one[1])


def test_the_fingerprint_is_versioned_and_names_its_action() -> None:
    fp = fingerprint({"cents": 100.0}, "stripe.refund")
    assert fp == fingerprint({"cents": 100}, "stripe.refund", None)
    assert fp != fingerprint({"cents": 100}, "stripe.refund", "step-1")
    version, digest, label = fp.split(":", 2)
    assert version == "2"
    assert len(digest) == 64
    assert json.loads(label) == ["stripe.refund", None]
    assert fingerprint_names(fp) == ("stripe.refund", None)
    assert fingerprint_names(fingerprint(None, "t:x", 'a "b"')) == ("t:x", 'a "b"')
    long = fingerprint(None, "t" * 500)
    assert fingerprint_names(long) == ("t" * 100, None)
    assert long != fingerprint(None, "t" * 499)  # the digest covers the whole name
    assert key_and_fingerprint("order-1", "s", "t", [1])[1] == fingerprint([1], "t", "s")
    with pytest.raises(MissingIdentity):
        fingerprint({}, "")


def test_the_legacy_fingerprint_is_pinned_and_names_nothing() -> None:
    import hashlib

    old = legacy_fingerprint(GOLDEN_ARGS)
    assert old == hashlib.sha256(b"agentlease-args/1\x00" + canonical_json(GOLDEN_ARGS)).hexdigest()
    assert fingerprint_names(old) is None
    assert fingerprint_names("2:abc:not json") is None


def test_parts_cannot_run_into_each_other() -> None:
    assert derive_key("a:b", "c", "t", None) != derive_key("a", "b:c", "t", None)
    assert derive_key("a", "bc", "t", None) != derive_key("ab", "c", "t", None)


def test_numbers_have_one_spelling() -> None:
    assert derive_key("t", "s", "charge", {"amount": 10}) == derive_key(
        "t", "s", "charge", {"amount": 10.0}
    )
    assert derive_key("t", "s", "charge", {"amount": 10}) != derive_key(
        "t", "s", "charge", {"amount": 10.5}
    )
    assert derive_key("t", "s", "x", [True]) != derive_key("t", "s", "x", [1])
    assert derive_key("t", "s", "x", (1, 2)) == derive_key("t", "s", "x", [1, 2])
    assert canonical_json({"b": 1, "a": [1.0, 0.5]}) == b'{"a":[1,0.5],"b":1}'


def test_the_key_is_pinned() -> None:
    key = derive_key("order-42", "charge", "stripe.charge", GOLDEN_ARGS)
    assert key == GOLDEN_KEY
    # Stable across releases: recomputed from the documented encoding by hand.
    import hashlib

    identity = json.dumps(
        [1, "order-42", "charge", "stripe.charge", {**GOLDEN_ARGS, "items": [1, 2, "é"]}],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()
    assert key == hashlib.sha256(b"agentlease-key/1\x00" + identity).hexdigest()


def test_the_key_is_the_same_in_another_process_with_another_hash_seed() -> None:
    code = (
        "from agentlease._policy.keys import derive_key;"
        f"print(derive_key('order-42', 'charge', 'stripe.charge', {GOLDEN_ARGS!r}))"
    )
    here = derive_key("order-42", "charge", "stripe.charge", GOLDEN_ARGS)
    for seed in ("0", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            timeout=60,
        )
        assert out.stdout.strip() == here


@pytest.mark.parametrize(
    ("task", "step", "tool"), [("", "s", "t"), ("t", "", "t"), ("t", "s", ""), (None, "s", "t")]
)
def test_missing_identity_is_an_error(task: object, step: object, tool: object) -> None:
    with pytest.raises(MissingIdentity):
        derive_key(task, step, tool, {})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad", [{1, 2}, {"x": float("nan")}, {1: "a"}, object(), [2**70], {"f": float("inf")}]
)
def test_arguments_that_are_not_json_are_refused(bad: object) -> None:
    with pytest.raises(NotJSON):
        derive_key("t", "s", "tool", bad)


@pytest.mark.parametrize("bad", ["", "a b", "x" * 257, "é", "a\nb", 5])
def test_caller_keys_are_checked(bad: object) -> None:
    with pytest.raises(InvalidName):
        check_key(bad)
    assert check_key("Idem-0f3a:9") == "Idem-0f3a:9"
