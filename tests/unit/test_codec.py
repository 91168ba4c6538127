"""JSON at the edge of the store (``_codec``) and argument checks (``_validate``).

Both run before anything is written, so a refusal here is what makes "a bad call writes nothing"
true on every backend. The properties use the standard library's ``json`` and hand-written
character sets as oracles, independent of the code under test.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import math
import string
import uuid
from dataclasses import dataclass
from pathlib import PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlease import (
    InvalidDuration,
    InvalidInput,
    InvalidName,
    NotJSON,
    PayloadError,
    PayloadTooLarge,
)
from agentlease import _validate as check
from agentlease._codec import DEFAULT_MAX_BYTES, decode, encode

# -- strategies ------------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


def buried(poison: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """A JSON value with ``poison`` somewhere inside it, often next to a ``null``."""
    return st.recursive(
        poison,
        lambda inner: (
            st.tuples(json_values, inner).map(list)
            | st.tuples(inner, st.none()).map(list)
            | st.tuples(
                st.text(max_size=5), inner, st.dictionaries(st.text(max_size=5), scalars)
            ).map(lambda t: {**t[2], t[0]: t[1]})
        ),
        max_leaves=6,
    )


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 1


class Mode(enum.StrEnum):
    FAST = "fast"


class Name(str):
    pass


class Count(int):
    pass


class Bag(dict):  # type: ignore[type-arg]
    pass


@dataclass
class Point:
    x: int


# -- encode / decode -------------------------------------------------------------------------------


@given(json_values)
def test_round_trip(value):
    data = encode(value)
    assert isinstance(data, bytes)
    assert decode(data) == value
    assert json.loads(data) == value  # plain JSON, readable by any parser


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.text(max_size=20),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=4),
        max_leaves=20,
    )
)
def test_encoding_is_compact_utf8(value):
    assert encode(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def test_tuples_become_arrays():
    assert decode(encode((1, (2, "three"), {"k": (None,)}))) == [1, [2, "three"], {"k": [None]}]


def test_examples():
    assert encode({"a": [1, 2.5, None, True]}) == b'{"a":[1,2.5,null,true]}'
    assert encode("é") == '"é"'.encode()
    assert decode(None) is None
    assert decode(b"null") is None


NOT_JSON = [
    pytest.param({1, 2}, id="set"),
    pytest.param(frozenset(), id="frozenset"),
    pytest.param(object(), id="object"),
    pytest.param(Point(1), id="dataclass"),
    pytest.param(datetime.datetime(2024, 1, 1), id="datetime"),
    pytest.param(datetime.date(2024, 1, 1), id="date"),
    pytest.param(decimal.Decimal("1.5"), id="decimal"),
    pytest.param(1 + 2j, id="complex"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param(bytearray(b"x"), id="bytearray"),
    pytest.param(uuid.UUID(int=5), id="uuid"),
    pytest.param(Colour.RED, id="enum"),
    pytest.param(PurePosixPath("/tmp"), id="path"),
    pytest.param(range(3), id="range"),
    pytest.param(float("nan"), id="nan"),
    pytest.param(float("inf"), id="inf"),
    pytest.param(float("-inf"), id="minus-inf"),
    pytest.param({"a": [1, {"b": float("nan")}]}, id="nested-nan"),
    pytest.param({1: "x"}, id="int-key"),
    pytest.param({None: "x"}, id="none-key"),
    pytest.param(Name("x"), id="str-subclass"),
    pytest.param(Count(1), id="int-subclass"),
    pytest.param(Bag(a=1), id="dict-subclass"),
    pytest.param(2**64, id="int-too-big"),
    pytest.param(-(2**63) - 1, id="int-too-small"),
    pytest.param("\ud800", id="lone-surrogate"),
    pytest.param({"id": uuid.UUID(int=5), "note": None}, id="uuid-next-to-null"),
    pytest.param([None, Colour.RED], id="enum-next-to-null"),
    pytest.param([None, {1, 2}], id="set-next-to-null"),
]


@pytest.mark.parametrize("value", NOT_JSON)
def test_refused_with_not_json(value):
    with pytest.raises(NotJSON):
        encode(value)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(Level.HIGH, id="int-enum"),
        pytest.param(Mode.FAST, id="str-enum"),
        pytest.param({"level": Level.HIGH}, id="nested-int-enum"),
        pytest.param([Mode.FAST, None], id="str-enum-next-to-null"),
    ],
)
def test_enums_that_equal_their_value_are_refused_too(value):
    """Enums are refused rather than reshaped, including those that compare equal to their
    value: the handler would receive a plain int or str, not the enum the producer sent."""
    with pytest.raises(NotJSON):
        encode(value)


@given(buried(st.sampled_from([math.nan, math.inf, -math.inf])))
def test_non_finite_numbers_anywhere_are_refused(value):
    with pytest.raises(NotJSON):
        encode(value)


@given(buried(st.sampled_from([object(), {1}, uuid.UUID(int=1), Colour.RED, b"x", Point(0)])))
def test_objects_anywhere_are_refused(value):
    with pytest.raises(NotJSON):
        encode(value)


def test_refusals_name_what_was_refused():
    with pytest.raises(NotJSON, match="result"):
        encode({1}, what="result")
    with pytest.raises(NotJSON, match="checkpoint"):
        encode(float("nan"), what="checkpoint")


@given(json_values)
def test_size_limit_is_inclusive(value):
    data = encode(value)
    assert encode(value, limit=len(data)) == data
    with pytest.raises(PayloadTooLarge) as info:
        encode(value, what="progress", limit=len(data) - 1)
    assert (info.value.what, info.value.size, info.value.limit) == (
        "progress",
        len(data),
        len(data) - 1,
    )
    assert "progress" in str(info.value)


def test_default_size_limit():
    big = "x" * (DEFAULT_MAX_BYTES - 2)
    assert len(encode(big)) == DEFAULT_MAX_BYTES
    with pytest.raises(PayloadTooLarge):
        encode(big + "x")


def test_payload_errors_are_typed():
    for cls in (NotJSON, PayloadTooLarge):
        assert issubclass(cls, PayloadError)
        assert issubclass(cls, InvalidInput)
        assert issubclass(cls, ValueError)


# -- names -----------------------------------------------------------------------------------------

QUEUE_CHARS = string.ascii_letters + string.digits + "_.:-"
ID_CHARS = string.ascii_letters + string.digits + "_.:@/+=-"
FIRST_CHARS = string.ascii_letters + string.digits + "_"


def queue_name_ok(s: str) -> bool:
    return 1 <= len(s) <= 128 and s[0] in FIRST_CHARS and all(c in QUEUE_CHARS for c in s)


def task_id_ok(s: str) -> bool:
    return 1 <= len(s) <= 200 and s[0] in FIRST_CHARS and all(c in ID_CHARS for c in s)


near_names = st.text(alphabet=ID_CHARS + " {}*\n\t\x00é/[]", max_size=210) | st.text(max_size=20)


@given(near_names)
def test_queue_names(name):
    if queue_name_ok(name):
        assert check.queue_name(name) == name
    else:
        with pytest.raises(InvalidName):
            check.queue_name(name)


@given(st.text(alphabet=QUEUE_CHARS, min_size=1, max_size=128).filter(queue_name_ok))
def test_every_well_formed_queue_name_is_accepted(name):
    assert check.queue_name(name) == name


@given(near_names)
def test_task_ids(value):
    if task_id_ok(value):
        assert check.task_id(value) == value
    else:
        with pytest.raises(InvalidName):
            check.task_id(value)


@pytest.mark.parametrize(
    "name", ["", " ", "a b", "{q}", "q\n", "-q", ".q", ":q", "q" * 129, "é", "a/b", "a*"]
)
def test_bad_queue_names(name):
    with pytest.raises(InvalidName):
        check.queue_name(name)


@pytest.mark.parametrize("value", [None, 1, 1.5, b"q", ["q"], True])
def test_names_must_be_strings(value):
    with pytest.raises(InvalidName):
        check.queue_name(value)
    with pytest.raises(InvalidName):
        check.task_id(value)


def test_name_limits():
    assert check.queue_name("q" * 128) == "q" * 128
    assert check.task_id("t" * 200) == "t" * 200
    with pytest.raises(InvalidName):
        check.task_id("t" * 201)
    assert check.task_id("user@example.com/job+1=2") == "user@example.com/job+1=2"
    assert check.task_id(uuid.UUID(int=3).hex) == uuid.UUID(int=3).hex


# -- durations and counts --------------------------------------------------------------------------


@given(st.floats() | st.integers(min_value=-(10**6), max_value=10**6))
def test_durations(value):
    if math.isfinite(value) and 0 < value <= check.LONGEST:
        seconds = check.duration(value, "lease_for")
        assert seconds == float(value)
        assert type(seconds) is float
    else:
        with pytest.raises(InvalidDuration, match="lease_for"):
            check.duration(value, "lease_for")


@given(st.floats() | st.integers(min_value=-(10**6), max_value=10**6))
def test_non_negative_durations(value):
    if math.isfinite(value) and 0 <= value <= check.LONGEST:
        assert check.non_negative(value, "delay") == float(value)
    else:
        with pytest.raises(InvalidDuration, match="delay"):
            check.non_negative(value, "delay")


@pytest.mark.parametrize("value", [True, False, "1", None, [1], 1 + 0j, decimal.Decimal(1)])
def test_durations_must_be_real_numbers(value):
    with pytest.raises(InvalidDuration):
        check.duration(value, "lease_for")
    with pytest.raises(InvalidDuration):
        check.non_negative(value, "delay")


def test_optional_duration():
    assert check.optional_duration(None, "progress_timeout") is None
    assert check.optional_duration(2, "progress_timeout") == 2.0
    with pytest.raises(InvalidDuration):
        check.optional_duration(0, "progress_timeout")


@given(st.integers(min_value=-5, max_value=10_010))
def test_batch_sizes(n):
    if 1 <= n <= 10_000:
        assert check.batch_size(n) == n
    else:
        with pytest.raises(InvalidInput):
            check.batch_size(n)


@pytest.mark.parametrize("value", [1.0, True, "1", None])
def test_batch_size_must_be_an_int(value):
    with pytest.raises(InvalidInput):
        check.batch_size(value)


@given(st.integers(min_value=-100, max_value=100))
def test_integers_in_range(value):
    if -10 <= value <= 10:
        assert check.integer(value, "priority", low=-10, high=10) == value
    else:
        with pytest.raises(InvalidInput, match="priority"):
            check.integer(value, "priority", low=-10, high=10)
