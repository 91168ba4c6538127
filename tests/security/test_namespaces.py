"""Namespaces isolate: two clients with different Redis prefixes or PostgreSQL schemas on one
server never see or take each other's tasks, idempotency keys, records, counters or locks, even
when every name they use is the same; and a prefix or schema cannot be crafted to reach another.

On Redis the keys of prefix ``P`` all start with ``P:`` or ``{P:`` (a prefix holds no ``:``), so
the ACL key patterns ``~P:*`` and ``~{P:*`` cover exactly one namespace: checked here by listing
every key each client wrote.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase

import pytest

import agentlease as al
from tests import _services
from tests.conftest import REQUIRE_SERVICES, unavailable

KINDS = ["redis", "redis-cluster", "postgres"]


@dataclass
class Pair:
    kind: str
    names: tuple[str, str]  # prefixes or schemas
    urls: tuple[str, str]


@pytest.fixture(params=KINDS)
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    """Two namespaces on one server; the second's name starts with the first's."""
    kind = request.param
    first = _services.namespace()
    names = (first, first + "-2") if kind != "postgres" else (first, first + "_2")
    if kind == "postgres":
        problem = _services.postgres_problem()
        if problem:
            unavailable("postgres", problem)
        base = _services.POSTGRES_URL
        option = "schema"
    else:
        if kind == "redis":
            problem = _services.redis_problem()
            if problem:
                unavailable("redis", problem)
            base = _services.REDIS_URL
        else:
            base = request.getfixturevalue("redis_cluster_base")
        option = "prefix"
    urls = (
        _services.with_option(base, option, names[0]),
        _services.with_option(base, option, names[1]),
    )
    try:
        yield Pair(kind, names, urls)
    finally:
        for name, url in zip(names, urls, strict=True):
            if kind == "postgres":
                _services.drop_postgres_schema(name)
            else:
                _services.drop_redis_prefix(url, name)


def _work(url: str, tag: str) -> dict[str, object]:
    """The same names in every namespace: a task, an idempotent action, a record, a counter and
    a lock. Returns what each step saw, which must not depend on the other namespace."""
    seen: dict[str, object] = {}
    queue = al.Queue.connect(url)
    keys = al.Idempotency.connect(url)
    state = al.SharedState.connect(url)
    try:
        (enqueued,) = queue.enqueue_many(
            "jobs:a", [al.TaskSpec(payload={"from": tag}, id="task-1", dedup_key="d:1")]
        )
        seen["created"] = enqueued.created
        jobs = queue.claim("jobs:a", n=10, lease_for=30)
        seen["claimed"] = [(j.lease.task_id, j.payload) for j in jobs]
        for job in jobs:
            queue.complete(job.lease, {"by": tag})
        with keys.action("send", {"to": "ada"}, step="s", task_id="task-1") as act:
            seen["replayed"] = act.replayed
            if not act.replayed:
                act.result = {"sent": tag}
        seen["version"] = state.compare_and_set("rec:1", 0, {"owner": tag})
        state.reserve("seats", 3, limit=3)
        seen["seats"] = state.counter("seats")
        with state.locks(["lock:1"], timeout=2, ttl=30) as held:
            seen["fence"] = held.tokens["lock:1"]
        seen["stats"] = queue.stats("jobs:a").counts
    finally:
        state.close()
        keys.close()
        queue.close()
    return seen


def test_two_namespaces_never_see_each_other(pair: Pair) -> None:
    first = _work(pair.urls[0], "a")
    second = _work(pair.urls[1], "b")
    # The second namespace starts empty whatever the first holds: its task is new and is its own,
    # its action runs, its record starts at version 0, its counter and lock are untouched.
    assert first["created"] is True
    assert second["created"] is True
    assert first["claimed"] == [("task-1", {"from": "a"})]
    assert second["claimed"] == [("task-1", {"from": "b"})]
    assert first["replayed"] is False
    assert second["replayed"] is False
    assert first["version"] == second["version"] == 1
    assert first["seats"] == second["seats"] == 3
    assert first["fence"] == second["fence"]
    assert first["stats"] == second["stats"] == {"done": 1}


def test_a_lock_held_in_one_namespace_is_free_in_the_other(pair: Pair) -> None:
    one = al.SharedState.connect(pair.urls[0])
    other = al.SharedState.connect(pair.urls[1])
    try:
        with one.locks(["lock:1"], timeout=2, ttl=30):
            with other.locks(["lock:1"], timeout=0.5, ttl=30) as held:  # no LockTimeout
                assert held.tokens["lock:1"] >= 1
            with pytest.raises(al.LockTimeout), one.locks(["lock:1"], timeout=0.2, ttl=30):
                pass
    finally:
        one.close()
        other.close()


def _redis_keys(url: str) -> set[str]:
    found: set[str] = set()
    for client in _services.redis_primaries(url):
        try:
            found |= {k.decode() for k in client.scan_iter(count=1000)}
        finally:
            client.close()
    return found


@pytest.mark.parametrize("pair", ["redis", "redis-cluster"], indirect=True)
def test_each_prefix_owns_exactly_the_keys_its_acl_patterns_cover(pair: Pair) -> None:
    before = _redis_keys(pair.urls[0])
    _work(pair.urls[0], "a")
    mid = _redis_keys(pair.urls[0])
    _work(pair.urls[1], "b")
    after = _redis_keys(pair.urls[0])
    written = {0: mid - before, 1: after - mid}
    for i, name in enumerate(pair.names):
        own = (f"{name}:*", f"{{{name}:*")
        other = pair.names[1 - i]
        others = (f"{other}:*", f"{{{other}:*")
        assert written[i], f"namespace {name} wrote no keys"
        for key in written[i]:
            assert any(fnmatchcase(key, p) for p in own), (name, key)
            assert not any(fnmatchcase(key, p) for p in others), (name, key)


@pytest.mark.parametrize(
    "prefix",
    ["a:b", "a{b}", "{a", "a}", "a*", "a?", "a[b]", "a%20b", "a\nb", ":a", "-a", "", "a" * 65],
)
def test_a_prefix_that_could_reach_another_namespace_is_refused(prefix: str) -> None:
    # ``a:b`` once shared keys with prefix ``a`` and a queue ``b:...`` (``{a:b:c}``); braces
    # would forge a hash tag, glob characters would widen an ACL pattern.
    url = f"redis://u:pw-not-shown@127.0.0.1:1/0?prefix={prefix}"
    with pytest.raises(al.InvalidURL, match=r"prefix|control") as caught:
        al.connect(url)
    assert "pw-not-shown" not in str(caught.value)


@pytest.mark.parametrize(
    "schema",
    [
        "public,evil",
        'a"b',
        "a;drop table x",
        "pg_catalog",
        "pg_temp",
        "Upper",
        "a b",
        "a\tb",
        "a.b",
        "a" * 64,
        "",
        "1a",
    ],
)
def test_a_schema_that_could_reach_another_namespace_is_refused(schema: str) -> None:
    from urllib.parse import quote

    url = f"postgresql://u:pw-not-shown@127.0.0.1:1/db?schema={quote(schema)}"
    with pytest.raises(al.InvalidURL, match=r"schema|control") as caught:
        al.connect(url)
    assert "pw-not-shown" not in str(caught.value)


def test_services_are_required_in_ci() -> None:
    # The isolation tests above skip without a server only when CI does not require them.
    if REQUIRE_SERVICES:
        assert _services.redis_problem() is None
        assert _services.postgres_problem() is None
