"""What the fuzzer (tests/security/test_fuzz.py) found, each pinned by a small deterministic test
on every backend of the ``store`` fixture: the input is refused with a typed error, or handled
exactly, and a refusal changes nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

import agentlease as al
from agentlease import InvalidInput, LimitReached
from tests.conftest import Store, require
from tests.contract.test_counter_holds import frozen, wait_until

MAX = 2**53 - 1  # the largest integer Redis's Lua (doubles) compares exactly


# -- counters: what Lua cannot compare exactly is refused on every store -----------------------


def test_a_limit_past_2_53_cannot_be_passed(state: al.SharedState) -> None:
    # Redis compared 2**53 + 1 with the limit 2**53 as doubles (both 2**53) and took the unit.
    with pytest.raises(InvalidInput, match="between"):
        state.add("c", 2**53)
    with pytest.raises(InvalidInput, match="limit"):
        state.reserve("c", 1, limit=2**53)
    assert state.counter("c") == 0
    assert state.add("c", MAX) == MAX
    with pytest.raises(LimitReached):
        state.reserve("c", 1, limit=MAX)
    with pytest.raises(LimitReached):
        state.add("c", 1)  # no bound given: the range of every counter still holds
    assert state.counter("c") == MAX


def test_the_floor_of_the_range_holds(state: al.SharedState) -> None:
    assert state.add("c", -MAX) == -MAX
    with pytest.raises(LimitReached):
        state.add("c", -1)
    with pytest.raises(LimitReached):
        state.take("c", 1, minimum=-MAX)
    assert state.counter("c") == -MAX
    assert state.add("c", MAX) == 0


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda s: s.add("c", 2**63), "n"),
        (lambda s: s.add("c", -(2**64)), "n"),
        (lambda s: s.reserve("c", 2**62, limit=2**62), "n"),
        (lambda s: s.reserve("c", 1, limit=2**70), "limit"),
        (lambda s: s.reserve("c", 1, limit=True), "limit"),
        (lambda s: s.reserve("c", 1, limit=1.0), "limit"),
        (lambda s: s.take("c", 1, minimum=-(2**53)), "minimum"),
        (lambda s: s.take("c", 1, minimum=None), "minimum"),
        (lambda s: s.release("c", 2**53), "n"),
        (lambda s: s.hold("c", 2**53, limit=MAX), "n"),
        (lambda s: s.hold("c", 1, limit=-(2**63)), "limit"),
        (lambda s: s.set_field("r", "f", 1, expected_version=2**53), "expected_version"),
        (lambda s: s.set_field("r", "f", 1, fence=2**62), "fence"),
    ],
)
def test_integers_outside_the_exact_range_are_refused(
    state: al.SharedState, call: object, what: str
) -> None:
    with pytest.raises(InvalidInput, match=what):
        call(state)  # type: ignore[operator]
    assert state.counter("c") == 0
    assert state.get("r") == al.Versioned({}, 0)


def test_holds_at_the_top_of_the_range_are_exact(state: al.SharedState) -> None:
    with state.hold("c", MAX - 1, limit=MAX, ttl=30) as held:
        assert held.value == MAX - 1
        with pytest.raises(LimitReached):
            state.reserve("c", 2, limit=MAX)
        assert state.reserve("c", 1, limit=MAX) == MAX
    assert state.counter("c") == 1


def test_expired_holds_give_back_exact_units(state: al.SharedState) -> None:
    # Redis summed the units of expired holds in Lua, as doubles, before one DECRBY: two holds
    # of 3 * 2**52 - 9 units in all came back as an even number, one unit off.
    state.add("c", 3)
    first = state.hold("c", 2**52 + 2, limit=MAX, ttl=0.3)
    first.__enter__()
    state.add("c", -(2**52))  # units given back elsewhere while the hold lives
    second = state.hold("c", MAX - 10, limit=MAX, ttl=0.3)
    second.__enter__()
    for hold in (first, second):
        frozen(hold, state)  # its holder stops renewing, as if it died
    assert state.counter("c") == MAX - 5
    wait_until("the holds ran out", lambda: state.counter("c") == 3 - 2**52)


# -- values refused above the seam, whatever the store ------------------------------------------


def test_durations_past_the_float_range_are_refused() -> None:
    # float(10**400) raised OverflowError from the duration check itself.
    queue = al.Queue(al.MemoryBackend())
    state = al.SharedState(queue.backend)
    with pytest.raises(al.InvalidDuration, match="lease_for"):
        queue.claim("q", lease_for=10**400)
    with pytest.raises(al.InvalidDuration, match="lease_for"):
        al.QueueSettings(lease_for=-(10**400))
    with pytest.raises(al.InvalidDuration, match="timeout"):
        state.locks(["a"], timeout=10**400)
    with pytest.raises(al.InvalidDuration, match="delay"):
        queue.enqueue("q", 1, delay=10**400)
    with pytest.raises(al.UnknownQueue):
        queue.stats("q")


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////tmp/agentlease-fuzz\x00.db",  # sqlite3 raised ValueError
        "sqlite:////tmp/agentlease-fuzz\ud800.db",  # and UnicodeEncodeError
        "redis://127.0.0.1:1/0?prefix=a\x00b",
        "postgresql://root:se\ud800cret@127.0.0.1:1/test",
        "memory://\n",
    ],
)
def test_urls_with_characters_no_driver_takes_are_refused(url: str) -> None:
    for connect in (al.connect, al.connect_async):
        with pytest.raises(al.InvalidURL, match="control character or a lone surrogate") as caught:
            connect(url)
        assert "cret" not in str(caught.value)  # the password is never quoted back


def test_forged_leases_are_refused_before_the_store(store: Store) -> None:
    # A lease made by hand reached the stores: attempt=nan broke logging, a list as task id
    # broke the memory store's dict, a lone surrogate in the token broke the drivers.
    queue = store.queue()
    queue.enqueue("q", {"n": 1}, id="t1")
    (job,) = queue.claim("q", lease_for=60)
    before = queue.get("t1")
    forged = [
        replace(job.lease, attempt=float("nan")),
        replace(job.lease, attempt=2**64),
        replace(job.lease, attempt=True),
        replace(job.lease, task_id=["t1"]),
        replace(job.lease, task_id="t1\x00"),
        replace(job.lease, queue="q\ud800"),
        replace(job.lease, token="\ud800"),
        replace(job.lease, token=object()),
        replace(job.lease, token=""),
        replace(job.lease, expires_at=float("inf")),
    ]
    for lease in forged:
        for call in _holder_writes(queue, lease):
            with pytest.raises(InvalidInput, match="lease"):
                call()
    with pytest.raises(InvalidInput, match="Lease"):
        queue.complete(("t1", "q"), None)  # type: ignore[arg-type]
    assert queue.get("t1") == before
    queue.complete(job.lease, {"done": True})  # the real lease still works


def _holder_writes(queue: al.Queue, lease: al.Lease) -> list[Callable[[], object]]:
    return [
        lambda: queue.complete(lease, {"done": True}),
        lambda: queue.fail(lease, "boom", retry_in=None),
        lambda: queue.progress(lease, 1),
        lambda: queue.release(lease),
        lambda: queue.extend([lease]),
        lambda: queue.complete_many([(lease, None)]),
    ]


def test_idempotency_arguments_are_checked(store: Store) -> None:
    keys = (
        al.Idempotency(store.backend())
        if store.kind == "memory"
        else al.Idempotency.connect(store.url)
    )
    try:
        # float("x") raised ValueError; orjson raised TypeError on a lone surrogate; a step
        # that is not a str raised TypeError when the fingerprint cut it.
        for wait in ("1", float("nan"), float("inf"), -1, 10**400, True):
            with pytest.raises(al.InvalidDuration, match="wait"):
                keys.begin("tool", {}, step="s", task_id="t", wait=wait)  # type: ignore[arg-type]
        with pytest.raises(al.InvalidName, match="tool name"):
            keys.begin("to\ud800ol", {}, step="s", task_id="t")
        with pytest.raises(al.InvalidName, match="step id"):
            keys.begin("tool", {}, step="\udfff", key="k-1")
        with pytest.raises(al.MissingIdentity, match="step id"):
            keys.begin("tool", {}, step=0, key="k-1")  # type: ignore[arg-type]
        with pytest.raises(al.InvalidName, match="task id"):
            keys.identity("tool", {}, step="s", task_id="\ud800")
        assert keys.get("k-1") is None
        assert keys.get(keys.identity("tool", {}, step="s", task_id="t")[0]) is None
    finally:
        if store.kind != "memory":
            keys.close()


@pytest.mark.parametrize(
    "url",
    [
        # The schema's pattern ended in "$", which also matches before a final newline.
        "postgresql://root@127.0.0.1:1/test?schema=abc%0A",
        # \d took any Unicode digit as part of a port.
        "postgresql://root@127.0.0.1:\u0661\u0662/test",
    ],
)
def test_postgres_url_parts_are_matched_whole(url: str) -> None:
    require("psycopg", "the postgres extra: the PostgreSQL URL is parsed once its driver loads")
    with pytest.raises(al.InvalidURL):
        al.connect(url)


def test_limits_and_lock_names_are_checked(store: Store) -> None:
    # A limit past 2**63 raised OverflowError from sqlite3; a lone str was locked letter by letter.
    state = al.SharedState(store.backend())
    keys = al.Idempotency(store.backend())
    try:
        for limit in (2**70, 0, -1, "1", None, 1.0):
            with pytest.raises(InvalidInput, match="limit"):
                keys.purge(limit)  # type: ignore[arg-type]
            with pytest.raises(InvalidInput, match="limit"):
                state.sweep_locks(limit)  # type: ignore[arg-type]
        for names in ("abc", b"abc", 7, None):
            with pytest.raises(InvalidInput, match="iterable"):
                state.locks(names, timeout=1)  # type: ignore[arg-type]
            with pytest.raises(InvalidInput, match="iterable"):
                state.lock_holders(names)  # type: ignore[arg-type]
            with pytest.raises(InvalidInput, match="iterable"):
                state.release_locks(names, "me")  # type: ignore[arg-type]
        assert state.lock_holders(["a", "b", "c", "abc"]) == dict.fromkeys(["a", "b", "c", "abc"])
    finally:
        if store.kind != "memory":
            keys.close()
            state.close()


def test_a_field_name_that_is_not_a_str_is_refused(state: al.SharedState) -> None:
    # An unhashable field name raised TypeError while the write was being built.
    for field in ([], {"a": 1}, 7, None, "\ud800", ""):
        with pytest.raises(al.InvalidName, match="field name"):
            state.set_field("r", field, 1)  # type: ignore[arg-type]
    assert state.get("r") == al.Versioned({}, 0)


@pytest.mark.parametrize(
    "kw",
    [
        {"transitions": 5},  # AttributeError
        {"transitions": {"a": None}},  # TypeError
        {"transitions": {"a": set()}, "initial": 5},  # TypeError
        {"transitions": {1: set(), "a": set()}},  # TypeError when sorted for a write
        {"transitions": {"\ud800": set()}},  # orjson's TypeError when encoded for a write
        {"transitions": {("t",): set()}},  # declared, yet never a JSON state
        {"transitions": {"draft": "review", "review": set()}},  # the letters of 'review'
        {"transitions": {"a": {"b"}, "b": set()}, "initial": "a"},  # a lone str as a set
    ],
)
def test_state_machines_take_collections_of_str_states(kw: dict[str, object]) -> None:
    with pytest.raises(InvalidInput, match="state"):
        al.StateMachine(field="status", **kw)  # type: ignore[arg-type]


def test_versioned_update_refuses_what_no_driver_binds(tmp_path: Path) -> None:
    # sqlite3 raised UnicodeEncodeError and OverflowError; a table that was not a str,
    # AttributeError.
    conn = sqlite3.connect(tmp_path / "own.db")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, title TEXT, version INTEGER)")
    conn.execute("INSERT INTO t VALUES (1, 'a', 1)")
    for args in [
        ("t", {"id": 1}, 1, {"title": "\ud800"}),
        ("t", {"id": 2**64}, 1, {"title": "x"}),
        ("t", {"id": 1}, 2**63, {"title": "x"}),
        ("t", {"id": 1}, "1", {"title": "x"}),
        (7, {"id": 1}, 1, {"title": "x"}),
        ("t", [("id", 1)], 1, {"title": "x"}),
    ]:
        with pytest.raises(InvalidInput):
            al.versioned_update(conn, *args)  # type: ignore[arg-type]
    assert conn.execute("SELECT title, version FROM t").fetchall() == [("a", 1)]
    assert al.versioned_update(conn, "t", {"id": 1}, 1, {"title": "b"}) == 2
    conn.close()


@pytest.mark.parametrize(
    "kw",
    [
        {"exclude": 5},  # TypeError
        {"exclude": "x"},  # a lone str was its letters
        {"fail_on": 5},  # TypeError
        {"release_on": "x"},  # accepted, then TypeError from isinstance() after the effect
        {"fail_on": (ValueError, 5)},  # the same
    ],
)
def test_idempotent_options_are_checked_before_anything_runs(kw: dict[str, object]) -> None:
    keys = al.Idempotency(al.MemoryBackend())
    ran: list[object] = []
    decorate = al.idempotent(tool="t", store=keys, step="s", **kw)  # type: ignore[call-overload]
    with pytest.raises(InvalidInput):
        decorate(ran.append)  # refused as it decorates: nothing can run later
    if "exclude" not in kw:
        with pytest.raises(InvalidInput):
            keys.call(lambda: ran.append(2), tool="t", args={}, step="s", task_id="t2", **kw)
    assert ran == []


def test_collections_are_not_taken_letter_by_letter(store: Store) -> None:
    # A str of ids requeued the tasks 'a', 'b' and 'c'; a str or dict of tasks enqueued one task
    # per letter or key; a bare lease or int raised TypeError; front='x' was truthy.
    queue = store.queue()
    queue.enqueue("q", 1, id="t1")
    (job,) = queue.claim("q", lease_for=60)
    before = (queue.stats("q").counts, queue.get("t1"))
    for call in [
        lambda: queue.requeue_dead("q", "abc"),  # type: ignore[arg-type]
        lambda: queue.requeue_dead("q", None, front="yes"),  # type: ignore[arg-type]
        lambda: queue.enqueue_many("q", "xy"),
        lambda: queue.enqueue_many("q", {"k": 1}),  # type: ignore[arg-type]
        lambda: queue.enqueue_many("q", 5),  # type: ignore[arg-type]
        lambda: queue.complete_many([job.lease]),  # type: ignore[list-item]
        lambda: queue.complete_many([(job.lease, None, None)]),  # type: ignore[list-item]
        lambda: queue.extend(job.lease),  # type: ignore[arg-type]
        lambda: queue.release(job.lease, front="x"),  # type: ignore[arg-type]
    ]:
        with pytest.raises(InvalidInput, match=r"list|pairs|True or False"):
            call()
    assert (queue.stats("q").counts, queue.get("t1")) == before
    assert len(queue.enqueue_many("q", (p for p in [1, 2]))) == 2  # any other iterable works


def test_durations_are_at_most_a_hundred_years(store: Store) -> None:
    # ttl=1e308 killed the renewal thread (OverflowError in its wait), which stopped the
    # renewals of every lock, hold and key of the process; PostgreSQL refused such durations
    # with a bare BackendError (timestamp out of range) where the other stores took them.
    longest = 100 * 365.25 * 86_400
    queue = store.queue()
    state = al.SharedState(queue.backend)
    assert queue.enqueue("q", 1, delay=longest).created
    with state.locks(["l"], timeout=1, ttl=longest) as held:
        assert held.tokens == {"l": 1}
    with state.hold("h", 1, limit=5, ttl=longest) as hold:
        hold.commit()
    for call in [
        lambda: queue.enqueue("q", 1, delay=longest * 1.01),
        lambda: queue.claim("q", lease_for=1e308),
        lambda: state.locks(["l"], timeout=1, ttl=1e308),
        lambda: state.hold("h", 1, limit=5, ttl=10**20),
        lambda: al.QueueSettings(max_lease=1e12),
        lambda: al.IdempotencySettings(window=1e12),
    ]:
        with pytest.raises(al.InvalidDuration, match="100 years"):
            call()
    assert queue.stats("q").counts == {"scheduled": 1}
    assert state.counter("h") == 1
