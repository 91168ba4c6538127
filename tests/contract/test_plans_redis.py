"""Plans on Redis and Redis Cluster: the keys of key layout 3 (state spaces share one hash tag,
plain names keep theirs, counters gain a version), a plan that cannot be one script on a cluster
refused before anything is sent, counters' versions when their holds run out, a resend of an act
after a lost reply, and the layout number: a layout-2 store is taken over, a layout-2 client
refuses a layout-3 store.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

import agentlease as al
from agentlease import PlanRefused, SchemaTooNew
from agentlease._records import PlanRead, PlanReceipt, PlanWrite, RecordWrite, StaleRead
from agentlease.backends._async import redis_layout as async_layout
from agentlease.backends._sync import redis_layout as sync_layout
from agentlease.backends._sync import redis_state

KEEP = 3600.0
PATIENCE = 20.0  # bound of every wait for a hold to run out


@pytest.fixture(params=["redis", "redis-cluster"])
def redis_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("served_url_" + request.param.replace("-", "_"))
    return url


@pytest.fixture
def raw(redis_url: str) -> Iterator[Any]:
    """A plain redis-py client of the same server (or cluster)."""
    base = redis_url.split("?", 1)[0]
    client: Any = (
        RedisCluster.from_url(base) if "cluster=1" in redis_url else redis.Redis.from_url(base)
    )
    yield client
    client.close()


@pytest.fixture
def backend(redis_url: str) -> Iterator[al.Backend]:
    b = al.connect(redis_url)
    yield b
    b.close()


def _prefix(url: str) -> str:
    return url.rsplit("prefix=", 1)[1].split("&", 1)[0]


def _keys(raw: Any, prefix: str) -> set[bytes]:
    if isinstance(raw, RedisCluster):
        return set(raw.scan_iter(match=f"{prefix}:*", count=1000, target_nodes="all"))
    return set(raw.scan_iter(match=f"{prefix}:*", count=1000))


def _unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def _record(key: str, **fields: bytes) -> PlanWrite:
    return PlanWrite("record", key, record=RecordWrite(dict(fields)))


def test_a_space_lives_in_one_hash_tag_and_plain_names_keep_their_keys(
    redis_url: str, raw: Any, backend: al.Backend
) -> None:
    p, space = _prefix(redis_url), _unique("sp")
    plain_rec, plain_ctr = _unique("rec"), _unique("ctr")
    backend.write_record(f"{space}|order:1", RecordWrite({"a": b"1"}))
    backend.add_counter(f"{space}|refunds", 2, None, None)
    backend.hold_counter(f"{space}|refunds", "tok", 1, 10, 30.0)
    backend.write_record(plain_rec, RecordWrite({"a": b"1"}))
    backend.add_counter(plain_ctr, 1, None, None)
    pid = _unique("plan")
    receipt = backend.act_plan(pid, [], [_record(f"{space}|order:1", a=b"2")], "ada", KEEP, None)
    assert isinstance(receipt, PlanReceipt)

    tag = f"{{{p}:sp:{space}}}"
    spaced = [
        f"{p}:rec:{tag}:order:1",
        f"{p}:ctr:{tag}:refunds",
        f"{p}:ctr:h:{tag}:refunds",
        f"{p}:ctr:x:{tag}:refunds",
        f"{p}:ctr:v:{tag}:refunds",
        f"{p}:plan:{tag}:{pid}",
    ]
    plain = [
        f"{p}:rec:{{{plain_rec}}}",  # as layouts 1 and 2 placed them
        f"{p}:ctr:{{{plain_ctr}}}",
        f"{p}:ctr:{{{plain_ctr}}}:v",  # a plain counter's version: beside it, in its tag
    ]
    found = _keys(raw, p)
    for key in spaced + plain:
        assert key.encode() in found, key
    assert len({key_slot(k.encode()) for k in spaced}) == 1
    if isinstance(raw, RedisCluster):  # the server agrees: one slot for the whole space
        slots = {raw.execute_command("CLUSTER KEYSLOT", k) for k in spaced}
        assert slots == {key_slot(spaced[0].encode())}
    assert raw.pttl(f"{p}:plan:{tag}:{pid}") > 0, "Redis expires a receipt after keep_for"
    assert int(raw.get(f"{p}:ctr:v:{tag}:refunds")) == 2  # the addition, then the hold
    rec = backend.get_record(f"{space}|order:1")
    assert rec is not None
    assert rec.value == {"a": 2}


def test_names_on_several_slots_are_refused_on_a_cluster_before_anything_is_sent(
    redis_url: str, raw: Any, backend: al.Backend
) -> None:
    p = _prefix(redis_url)
    a, b = _unique("a"), _unique("b")
    assert key_slot(f"{p}:rec:{{{a}}}".encode()) != key_slot(f"{p}:rec:{{{b}}}".encode())
    pid = _unique("plan")
    writes = [_record(a, n=b"1"), PlanWrite("counter", b, delta=1)]
    before = _keys(raw, p)
    if isinstance(raw, RedisCluster):
        with pytest.raises(PlanRefused, match="one state space") as info:
            backend.act_plan(pid, [PlanRead("record", a, 0)], writes, "ada", KEEP, None)
        assert info.value.plan_id == pid
        assert _keys(raw, p) == before, "nothing written, no receipt kept"
        # Two spaces are two hash tags as well; one plain name (its record and counter) is one.
        two = [_record(f"{_unique('s1')}|x", n=b"1"), _record(f"{_unique('s2')}|x", n=b"1")]
        with pytest.raises(PlanRefused):
            backend.act_plan(_unique("plan"), [], two, "ada", KEEP, None)
        one = [_record(a, n=b"1"), PlanWrite("counter", a, delta=1)]
        assert isinstance(backend.act_plan(pid, [], one, "ada", KEEP, None), PlanReceipt)
        assert backend.get_counter_version(a) == (1, 1)
        return
    # A single Redis: any names make one script.
    receipt = backend.act_plan(pid, [PlanRead("record", a, 0)], writes, "ada", KEEP, None)
    assert isinstance(receipt, PlanReceipt)
    assert receipt.first
    assert receipt.versions == (1, 1)
    assert backend.get_counter_version(b) == (1, 1)


def test_a_hold_running_out_raises_the_version_and_makes_a_plan_stale(
    backend: al.Backend,
) -> None:
    space = _unique("sp")
    c, rec = f"{space}|seats", f"{space}|booking"
    backend.add_counter(c, 3, None, None)
    backend.hold_counter(c, "tok", 2, 10, 0.2)
    value, version = backend.get_counter_version(c)
    assert (value, version) == (5, 2)
    reads = [PlanRead("counter", c, version)]
    deadline = time.monotonic() + PATIENCE
    while backend.get_counter_version(c)[0] != 3:  # the hold ran out and was given back
        assert time.monotonic() < deadline, "the hold never ran out"
        time.sleep(0.05)
    assert backend.get_counter_version(c) == (3, 3), "one give-back, one version"
    outcome = backend.act_plan(_unique("plan"), reads, [_record(rec, a=b"1")], "ada", KEEP, None)
    assert outcome == [StaleRead("counter", c, 2, 3)]
    assert backend.get_record(rec) is None


def test_a_hold_that_runs_out_unseen_is_given_back_inside_the_act(backend: al.Backend) -> None:
    """Nothing reads the counter between the hold's end and the act: the act's own give-back
    moves the version, and the plan is stale."""
    space = _unique("sp")
    c = f"{space}|seats"
    backend.hold_counter(c, "tok", 2, 10, 0.2)
    reads = [PlanRead("counter", c, backend.get_counter_version(c)[1])]
    time.sleep(0.4)  # the hold's own expiry: nothing to wait on but the store's clock
    outcome = backend.act_plan(
        _unique("plan"), reads, [PlanWrite("counter", c, delta=1)], "ada", KEEP, None
    )
    assert outcome == [StaleRead("counter", c, 1, 2)]
    assert backend.get_counter_version(c) == (0, 2)


def test_a_resent_act_is_answered_as_the_first_sending(
    backend: al.Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receipt keeps the acting call's request nonce: a resend (same nonce, as the link
    sends it after a lost reply) learns first=True; anyone else's call first=False."""
    key = f"{_unique('sp')}|r"
    pid = _unique("plan")
    writes = [_record(key, n=b"1")]
    monkeypatch.setattr(redis_state, "_nonce", lambda: "resent-nonce")
    first = backend.act_plan(pid, [PlanRead("record", key, 0)], writes, "ada", KEEP, None)
    resent = backend.act_plan(pid, [PlanRead("record", key, 0)], writes, "ada", KEEP, None)
    assert isinstance(first, PlanReceipt)
    assert isinstance(resent, PlanReceipt)
    assert first.first
    assert resent.first, "a resend of the call that acted"
    assert resent.versions == first.versions == (1,)
    monkeypatch.setattr(redis_state, "_nonce", lambda: "another-caller")
    other = backend.act_plan(pid, [PlanRead("record", key, 0)], writes, "bob", KEEP, None)
    assert isinstance(other, PlanReceipt)
    assert not other.first
    assert other.approved_by == "ada"
    rec = backend.get_record(key)
    assert rec is not None
    assert rec.version == 1, "acted once"


def test_a_layout_2_store_is_taken_over_and_its_counters_read_as_version_0(
    redis_url: str, raw: Any
) -> None:
    p = _prefix(redis_url)
    name = _unique("ctr")
    with closing(al.connect(redis_url)) as b:
        b.add_counter(name, 4, None, None)
    # As a layout-2 client left it: the number 2, and no version beside the counter.
    raw.set(f"{p}:layout", 2)
    raw.delete(f"{p}:ctr:{{{name}}}:v")
    with closing(al.connect(redis_url)) as b:
        assert b.get_counter_version(name) == (4, 0)
        assert raw.get(f"{p}:layout") == b"3"
        b.add_counter(name, 1, None, None)
        assert b.get_counter_version(name) == (5, 1)


def test_a_layout_2_client_refuses_a_layout_3_store(
    redis_url: str, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _prefix(redis_url)
    with closing(al.connect(redis_url)) as b:
        b.add_counter(_unique("ctr"), 1, None, None)
    assert raw.get(f"{p}:layout") == b"3"
    before = _keys(raw, p)
    for module in (sync_layout, async_layout):  # a client of layout 2
        monkeypatch.setattr(module, "LAYOUT", 2)
    with closing(al.connect(redis_url)) as old, pytest.raises(SchemaTooNew) as info:
        old.add_counter(_unique("ctr"), 1, None, None)
    assert (info.value.store_version, info.value.known_version) == (3, 2)
    assert _keys(raw, p) == before
    assert raw.get(f"{p}:layout") == b"3"
