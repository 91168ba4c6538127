"""Hypothesis strategies for hostile input to the public API: names, integers, durations, JSON
values and URLs, each mostly valid (so that calls get past the first check and reach the store)
and sometimes built to break something: deep nesting, huge strings, lone surrogates, NUL bytes,
integers past 2**63 and past the float range, and names that collide with the store's own keys
and identifiers.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

# Names a store uses itself (Redis key parts, SQL tables and keywords), and characters that mean
# something to Redis key patterns, hash tags, SQL or a terminal.
STORE_WORDS = [
    "t", "q", "ids", "queues", "layout", "locks", "rec", "ctr", "keys", "h", "x", "owner",
    "expiry", "fence", "freed", "agentlease", "agentlease:layout", "agentlease:ids",
    "agentlease_tasks", "tasks", "public", "pg_catalog", "sqlite_master", "SELECT", "NULL",
    "null", "None", "true", "0", "-1", "1e3", "nan",
]  # fmt: skip
SPECIAL_NAMES = [
    "{x}", "{agentlease}", "a{b}c", "a:b", "a::b", ":a", "a:", "*", "?", "[", "]", "[a-z]", "\\",
    "\n", "a\nb", "\r", "\t", " ", "", "a b", "'", '"', "`", "%", "%s", "%(name)s", "$1", "--",
    "; DROP TABLE agentlease_tasks; --", "' OR '1'='1", "a/b", "../x", "/", ".", "..", "é", "ß",
    "\u202e", "\ufeff", "\x00", "a\x00b", "\ud800", "a\udfffb", "\U0001f600", "a" * 128,
    "a" * 129, "a" * 200, "a" * 201, "a" * 256, "a" * 257, "a" * 500, "a" * 501, "a" * 10_000,
]  # fmt: skip

# Text that includes lone surrogates, NUL and control characters (hypothesis leaves surrogates
# out of text() by default).
nasty_char = st.one_of(
    st.characters(),
    st.sampled_from(["\x00", "\ud800", "\udfff", "\n", "{", "}", ":", "*", "'", '"', "\\"]),
)
nasty_text = st.lists(nasty_char, max_size=20).map("".join)
VALID_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,20}"
valid_names = st.from_regex(VALID_NAME, fullmatch=True)
not_str = st.one_of(
    st.none(), st.integers(), st.floats(), st.booleans(), st.binary(max_size=4),
    st.lists(st.text(max_size=3), max_size=2), st.just(object()),
)  # fmt: skip


def names(*, valid: st.SearchStrategy[str] = valid_names) -> st.SearchStrategy[Any]:
    """A name (queue, task id, record, counter, lock, key): valid half the time."""
    return st.one_of(
        valid,
        valid,
        st.sampled_from(STORE_WORDS),
        st.sampled_from(SPECIAL_NAMES),
        nasty_text,
        not_str,
    )


EDGE_INTS = [
    0, 1, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**53 - 1, 2**53, 2**53 + 1,
    -(2**53) + 1, -(2**53), -(2**53) - 1, 2**62, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1,
    2**64 - 1, 2**64, 10**308, 10**309, -(10**400), 2**1024,
]  # fmt: skip
ints = st.one_of(st.integers(-10, 10), st.sampled_from(EDGE_INTS), st.integers())
EDGE_FLOATS = [
    math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, 1e-300, 1e308, 1.7976931348623157e308,
    0.001, 1.5, 2.0**53, 2.0**63, 1e20,
]  # fmt: skip


def int_args(low: int = -10, high: int = 10) -> st.SearchStrategy[Any]:
    """An argument where an int is expected: small valid ints mostly, then edges and non-ints."""
    return st.one_of(
        st.integers(low, high),
        st.integers(low, high),
        ints,
        st.booleans(),
        st.sampled_from(EDGE_FLOATS),
        st.none(),
        st.sampled_from(["1", "", b"1"]),
    )


not_durations = st.sampled_from(
    [math.nan, math.inf, -math.inf, -1, -0.5, -(2**64), 10**400, True, "1", b"1", [1.0]]
)
durations = st.one_of(
    st.floats(0.05, 5.0),
    st.floats(0.05, 5.0),
    st.sampled_from(EDGE_FLOATS),
    st.sampled_from(EDGE_INTS),
    st.booleans(),
    st.none(),
    st.sampled_from(["1", "nan", b"1"]),
    st.floats(),
)


def nested(depth: int, leaf: object = 1) -> object:
    """A list nested ``depth`` deep (built without recursion)."""
    value: object = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


json_leaves = st.one_of(
    st.none(), st.booleans(), ints, st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(EDGE_FLOATS), nasty_text, st.text(max_size=10),
)  # fmt: skip
json_values = st.recursive(
    json_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=5), nasty_text), inner, max_size=4),
        st.tuples(inner, inner),
    ),
    max_leaves=12,
)
# What is not JSON at all, and what is JSON but too deep or too big for the store.
non_json = st.sampled_from(
    [{1: "int key"}, {None: 1}, {("t",): 1}, {1, 2}, b"bytes", bytearray(b"x"), object(),
     complex(1, 2), frozenset(), range(3), Ellipsis, type]
)  # fmt: skip
payloads = st.one_of(
    json_values,
    json_values,
    non_json,
    st.sampled_from([250, 254, 255, 256, 1000, 100_000]).map(lambda n: Built("nested", n)),
    st.sampled_from([(1 << 20) - 2, (1 << 20) - 1]).map(lambda n: Built("text", n)),
    st.sampled_from([{"k": math.nan}, [math.inf], {"k": [1, {"j": -math.inf}]}]),
)


class Built:
    """A value too big to print, built when a test uses it (hypothesis prints the recipe)."""

    def __init__(self, kind: str, size: int) -> None:
        self.kind, self.size = kind, size

    def __repr__(self) -> str:
        return f"Built({self.kind!r}, {self.size})"

    def build(self) -> object:
        return nested(self.size) if self.kind == "nested" else "x" * self.size


def real(value: object) -> object:
    """``value``, with a :class:`Built` recipe built."""
    return value.build() if isinstance(value, Built) else value


def plain(value: object) -> object:
    """``value`` as JSON gives it back: tuples become lists."""
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


# URLs: schemes the library knows and some it does not; hosts that resolve nowhere slow (only
# loopback or unparseable ones), so that no test waits on DNS or a remote port.
schemes = st.sampled_from(
    ["sqlite", "memory", "redis", "rediss", "postgresql", "postgres", "SQLITE", "http", "", "a b",
     "redis+unix", "\ud800", "file"]
)  # fmt: skip
hosts = st.sampled_from(
    ["", "127.0.0.1", "127.0.0.1:1", "127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1:x", "[::1]:1",
     "[", "]", "user:pw@127.0.0.1:1", "u@", "@", "%00", "%zz", "h\x00", "\ud800", "a" * 300,
     "127.0.0.1:1,127.0.0.1:2", ":1"]
)  # fmt: skip
options = st.sampled_from(
    ["", "?", "?timeout=nan", "?timeout=inf", "?timeout=-1", "?timeout=1e309", "?timeout=x",
     "?synchronous=full", "?synchronous=OFF", "?prefix=", "?prefix={x}", "?prefix=a%00b",
     "?prefix=%ED%A0%80", "?cluster=2", "?cluster=1&cluster=0", "?socket_timeout=nan",
     "?socket_timeout=-1", "?socket_timeout=1e400", "?connect_timeout=0", "?schema=",
     "?schema=a;drop", '?schema="x"', "?schema=pg_catalog", "?schema=abc%0A",
     "?application_name=a%00b", "?sslmode=bogus", "?pool_min=5&pool_max=1",
     "?pool_max=-1", "?pool_max=99999999999999999999", "?migrate=maybe", "?unknown=1", "?=",
     "?&&", "?a", "?%", "?timeout=%00", "#frag", "?ssl_cert_reqs=bogus"]
)  # fmt: skip
