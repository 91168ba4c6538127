"""Idempotent actions above the seam, held against every backend of the ``store`` fixture.

A side effect is counted in a ledger the library never sees; every test checks the ledger, not
only what the calls returned.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Literal

import pytest

import agentlease as al
from agentlease import (
    DuplicateInFlight,
    IdempotencyConflict,
    IdempotencySettings,
    MissingIdentity,
    NotApplied,
    NotJSON,
    ReplayedFailure,
    ReservationLost,
)
from agentlease._policy.keys import derive_key, fingerprint, legacy_fingerprint
from agentlease._records import KeyHold
from tests._outage import Outage
from tests.conftest import Store

SHORT = 0.4  # an in-flight lease meant to run out
PAST = 0.7  # a sleep that outlives SHORT


class Declined(Exception):
    """A permanent failure of the fake payment tool."""


@pytest.fixture
def keys(store: Store) -> Iterator[al.Idempotency]:
    k = (
        al.Idempotency(store.backend())
        if store.kind == "memory"
        else al.Idempotency.connect(store.url)
    )
    yield k
    if store.kind != "memory":
        k.close()


def keys_with(store: Store, **settings: float) -> al.Idempotency:
    s = IdempotencySettings(**settings)  # type: ignore[arg-type]
    if store.kind == "memory":
        return al.Idempotency(store.backend(), settings=s)
    return al.Idempotency.connect(store.url, settings=s)


def test_a_second_call_replays_the_original_result(keys: al.Idempotency) -> None:
    ledger: list[str] = []

    @al.idempotent(tool="send_email", store=keys, step="welcome")
    def send(to: str, subject: str = "hi") -> dict[str, object]:
        ledger.append(al.current_key())
        return {"id": f"msg-{len(ledger)}", "to": to}

    with al.idempotency_scope(task_id="order-1"):
        first = send.outcome("ana@example.com")
        again = send.outcome("ana@example.com", subject="hi")
        other = send.outcome("bob@example.com")
    assert first.replayed is False
    assert again.replayed is True
    assert again.value == first.value == {"id": "msg-1", "to": "ana@example.com"}
    assert again.key == first.key == ledger[0]
    assert first.key == derive_key(
        "order-1", "welcome", "send_email", {"to": "ana@example.com", "subject": "hi"}
    )
    assert other.value == {"id": "msg-2", "to": "bob@example.com"}
    assert len(ledger) == 2


def test_the_async_face_replays_too(store: Store) -> None:
    calls: list[int] = []

    async def main() -> None:
        backend = store.backend().open_async() if store.kind == "memory" else None
        keys = (
            al.AsyncIdempotency(backend)
            if backend is not None
            else al.AsyncIdempotency.connect(store.url)
        )
        try:

            @al.idempotent(tool="open_ticket", store=keys, step="t1")
            async def open_ticket(title: str) -> list[str]:
                calls.append(1)
                await asyncio.sleep(0)
                return [title, al.current_key()]

            with al.idempotency_scope(task_id="case-9"):
                a = await open_ticket.outcome("printer on fire")
                b = await open_ticket.outcome("printer on fire")
                async with keys.action("note", {"n": 1}, step="s") as act:
                    if not act.replayed:
                        calls.append(2)
                        act.result = {"noted": True}
                async with keys.action("note", {"n": 1}, step="s") as again:
                    assert again.replayed
            assert a.replayed is False
            assert b.replayed is True
            assert b.value == ["printer on fire", a.key]
            assert again.result == {"noted": True}
        finally:
            if backend is None:
                await keys.close()

    asyncio.run(main())
    assert calls == [1, 2]


def test_a_permanent_failure_is_stored_and_raised_again(keys: al.Idempotency) -> None:
    ledger: list[int] = []

    @al.idempotent(tool="charge", store=keys, step="pay", fail_on=(Declined,))
    def charge(cents: int) -> None:
        ledger.append(cents)
        raise Declined(f"card declined for {cents}")

    with al.idempotency_scope(task_id="order-2"):
        for _ in range(3):
            with pytest.raises(Declined, match="card declined for 500"):
                charge(500)

        @al.idempotent(tool="charge", store=keys, step="pay")  # does not know Declined
        def charge_elsewhere(cents: int) -> None:
            ledger.append(-1)

        with pytest.raises(ReplayedFailure) as info:
            charge_elsewhere(500)
    assert info.value.error_type.endswith("Declined")
    assert info.value.error_message == "card declined for 500"
    assert ledger == [500]


def test_a_failure_known_not_to_have_applied_releases_the_key(keys: al.Idempotency) -> None:
    ledger: list[str] = []

    @al.idempotent(tool="post", store=keys, step="p", release_on=(ConnectionRefusedError,))
    def post(body: str) -> str:
        ledger.append(body)
        if len(ledger) == 1:
            raise ConnectionRefusedError("nobody listening")
        if len(ledger) == 2:
            raise NotApplied("rate limited before sending")
        return "posted"

    with al.idempotency_scope(task_id="thread-3", step="reply"):
        with pytest.raises(ConnectionRefusedError):
            post("hello")
        with pytest.raises(NotApplied):
            post("hello")
        assert post("hello") == "posted"
        assert post.outcome("hello").replayed
    assert ledger == ["hello", "hello", "hello"]


def test_an_ambiguous_failure_stays_in_flight_until_its_lease_runs_out(store: Store) -> None:
    keys = keys_with(store, hold_for=SHORT)
    ledger: list[int] = []

    @al.idempotent(tool="wire", store=keys, step="w")
    def wire(amount: int) -> str:
        ledger.append(amount)
        if len(ledger) == 1:
            raise TimeoutError("bank did not answer")  # did the wire go out? unknown
        return "sent"

    try:
        with al.idempotency_scope(task_id="payout-4"):
            with pytest.raises(TimeoutError):
                wire(100)
            with pytest.raises(DuplicateInFlight) as info:
                wire(100)  # not released: the first call may still land
            assert 0 < info.value.retry_after <= SHORT + 0.05
            assert info.value.holder
            time.sleep(PAST)
            out = wire.outcome(100)  # taken over, with the same key for the bank to dedupe
            assert out.replayed is False
            record = keys.get(out.key)
            assert record is not None
            assert record.fence == 2
            assert record.state == "done"
    finally:
        if store.kind != "memory":
            keys.close()
    assert ledger == [100, 100]


def test_the_same_key_with_other_arguments_is_a_conflict(keys: al.Idempotency) -> None:
    ledger: list[object] = []
    upstream = "req-7f3a9c"  # an Idempotency-Key sent by an upstream client

    def act(args: dict[str, object]) -> al.Outcome[object]:
        def run() -> object:
            ledger.append(args)
            return len(ledger)

        return keys.call(run, tool="refund", args=args, key=upstream)

    assert act({"order": 1, "cents": 100}).value == 1
    assert act({"cents": 100.0, "order": 1}).replayed  # the same arguments, spelled differently
    with pytest.raises(IdempotencyConflict) as info:
        act({"order": 1, "cents": 999})
    assert info.value.stored_fingerprint == fingerprint({"order": 1, "cents": 100}, "refund")
    assert info.value.given_fingerprint == fingerprint({"order": 1, "cents": 999}, "refund")
    assert ledger == [{"order": 1, "cents": 100}]


def test_a_concurrent_caller_may_wait_for_the_original(store: Store) -> None:
    # A hold of a second, renewed every third of it: a renewal thread starved for a moment on a
    # loaded machine must not lose the reservation (that is another test's subject).
    keys = keys_with(store, hold_for=1.0)
    ledger: list[str] = []
    started = threading.Event()

    def slow() -> str:
        ledger.append("ran")
        started.set()
        time.sleep(2.5)  # longer than hold_for: renewals keep the reservation
        return "original"

    results: dict[str, object] = {}

    def first() -> None:
        results["first"] = keys.call(slow, tool="t", args={}, step="s", task_id="w-5")

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert started.wait(10)
        with pytest.raises(DuplicateInFlight):
            keys.call(slow, tool="t", args={}, step="s", task_id="w-5")
        waited = keys.call(slow, tool="t", args={}, step="s", task_id="w-5", wait=10.0)
        thread.join(10)
        assert waited.replayed
        assert waited.value == "original"
        assert results["first"] == al.Outcome("original", False, waited.key)
    finally:
        thread.join(10)
        if store.kind != "memory":
            keys.close()
    assert ledger == ["ran"]


def test_a_result_that_cannot_be_stored_is_refused_and_never_acted_again(
    keys: al.Idempotency,
) -> None:
    ledger: list[int] = []

    @al.idempotent(tool="create_user", store=keys, step="u")
    def create_user(name: str) -> object:
        ledger.append(1)
        return {"user": name, "tags": {"a", "b"}}  # a set is not JSON

    with al.idempotency_scope(task_id="signup-6"):
        with pytest.raises(NotJSON):
            create_user("ana")
        with pytest.raises(NotJSON):  # replayed: the user exists, acting again would duplicate
            create_user("ana")
    assert ledger == [1]


def test_missing_identity_is_an_error_and_nothing_runs(keys: al.Idempotency) -> None:
    ledger: list[int] = []

    @al.idempotent(tool="t", store=keys)
    def tool(x: int) -> int:
        ledger.append(x)
        return x

    with pytest.raises(MissingIdentity):
        tool(1)  # no task
    with al.idempotency_scope(task_id="t-7"), pytest.raises(MissingIdentity):
        tool(1)  # no step
    with pytest.raises(MissingIdentity):
        al.current_key()
    with pytest.raises(NotJSON), al.idempotency_scope(task_id="t-7", step="s"):
        tool(object())  # type: ignore[arg-type]
    assert ledger == []


def test_a_key_past_its_window_runs_again(store: Store) -> None:
    keys = keys_with(store, window=SHORT)
    ledger: list[int] = []
    try:
        with al.idempotency_scope(task_id="t-8", step="s"):

            @al.idempotent(tool="t", store=keys)
            def tool() -> int:
                ledger.append(1)
                return len(ledger)

            assert tool() == 1
            assert tool() == 1
            time.sleep(PAST)
            assert tool() == 2
    finally:
        if store.kind != "memory":
            keys.close()


def test_a_worker_keys_actions_on_its_task(store: Store) -> None:
    q = store.queue()
    keys = (
        al.Idempotency(store.backend())
        if store.kind == "memory"
        else al.Idempotency.connect(store.url)
    )
    ledger: Counter[str] = Counter()

    @al.idempotent(tool="notify", store=keys, step="n")
    def notify(user: str) -> str:
        ledger[al.current_key()] += 1
        return user

    def handler(ctx: al.JobContext) -> object:
        assert isinstance(ctx.payload, dict)
        return [notify(ctx.payload["user"]), notify(ctx.payload["user"])]

    try:
        enq = q.enqueue("jobs", {"user": "ana"})
        al.Worker(q, "jobs", handler).run(burst=True, handle_signals=False)
        task = q.get(enq.task_id)
        assert task.state == "done"
        assert task.result == ["ana", "ana"]
        key = derive_key(enq.task_id, "n", "notify", {"user": "ana"})
        assert ledger == Counter({key: 1})
    finally:
        if store.kind != "memory":
            keys.close()


# -- an upstream key reused for another action -----------------------------------------------


def test_an_upstream_key_reused_for_another_tool_is_a_conflict_naming_both(
    keys: al.Idempotency,
) -> None:
    ledger: list[str] = []
    upstream = "req-2b81e0"
    args = {"order": 11, "cents": 500}

    def run(tool: str) -> Callable[[], str]:
        def side_effect() -> str:
            ledger.append(tool)
            return f"{tool} done"

        return side_effect

    assert keys.call(run("refund"), tool="refund", args=args, key=upstream).value == "refund done"
    with pytest.raises(IdempotencyConflict) as info:
        keys.call(run("send_email"), tool="send_email", args=args, key=upstream)
    assert info.value.stored_tool == "refund"
    assert info.value.given_tool == "send_email"
    assert "'refund'" in str(info.value)
    assert "'send_email'" in str(info.value)
    with pytest.raises(IdempotencyConflict):  # another step of the same tool
        keys.call(run("refund"), tool="refund", args=args, key=upstream, step="again")
    assert keys.call(run("refund"), tool="refund", args=args, key=upstream).replayed
    assert ledger == ["refund"]


def test_outcomes_stored_before_fingerprints_covered_the_tool(store: Store) -> None:
    """A version 1 fingerprint (arguments only): a derived key, which covers the tool itself,
    still replays; a caller's own key cannot tell the tool, so it is a conflict."""
    keys = keys_with(store)
    backend = keys.backend
    args = {"to": "ana@example.com"}
    derived = derive_key("order-12", "welcome", "send_email", args)
    try:
        for key in (derived, "upstream-legacy-1"):
            hold = backend.reserve_key(key, legacy_fingerprint(args), "old", 30.0, 3600.0)
            assert isinstance(hold, KeyHold)
            backend.complete_key(hold, b'{"id":"m-old"}', 3600.0)
        ran: list[int] = []

        def send() -> str:
            ran.append(1)
            return "new"

        out = keys.call(send, tool="send_email", args=args, step="welcome", task_id="order-12")
        assert out.replayed
        assert out.value == {"id": "m-old"}
        with pytest.raises(IdempotencyConflict) as info:
            keys.call(send, tool="send_email", args=args, key="upstream-legacy-1")
        assert info.value.stored_tool is None
        assert info.value.given_tool == "send_email"
        assert ran == []
    finally:
        if store.kind != "memory":
            keys.close()


# -- begin() as a context manager -------------------------------------------------------------


def test_begin_sets_the_key_and_fence_inside_its_block(keys: al.Idempotency) -> None:
    seen: list[tuple[str, int]] = []
    with al.idempotency_scope(task_id="order-13", step="notify"):
        with keys.begin("notify", {"user": "ana"}) as act:
            assert not act.replayed
            seen.append((al.current_key(), al.current_fence()))
            act.complete({"sent": True})
        with pytest.raises(MissingIdentity):
            al.current_key()
        with keys.begin("notify", {"user": "ana"}) as again:
            assert again.replayed
            assert again.result == {"sent": True}
        # An error escaping the block leaves the reservation in flight, as in call().
        with pytest.raises(TimeoutError), keys.begin("notify", {"user": "bob"}) as act2:  # noqa: PT012
            seen.append((al.current_key(), al.current_fence()))
            raise TimeoutError("the mail server did not answer")
        with pytest.raises(DuplicateInFlight):
            keys.begin("notify", {"user": "bob"})
        # NotApplied releases it: the next attempt acts at once.
        with pytest.raises(NotApplied), keys.begin("notify", {"user": "cy"}):
            raise NotApplied("refused before sending")
        with keys.begin("notify", {"user": "cy"}) as act3:
            assert not act3.replayed
            assert act3.fence == 2
            act3.complete(None)
    assert seen == [(act.key, act.fence), (act2.key, act2.fence)]


def test_the_async_begin_sets_the_key_and_fence_inside_its_block(store: Store) -> None:
    async def main() -> None:
        backend = store.backend().open_async() if store.kind == "memory" else None
        keys = (
            al.AsyncIdempotency(backend)
            if backend is not None
            else al.AsyncIdempotency.connect(store.url)
        )
        try:
            async with await keys.begin(
                "notify", {"user": "ana"}, step="n", task_id="order-14"
            ) as act:
                assert (al.current_key(), al.current_fence()) == (act.key, act.fence)
                await act.complete("sent")
            with pytest.raises(MissingIdentity):
                al.current_fence()
            again = await keys.begin("notify", {"user": "ana"}, step="n", task_id="order-14")
            assert again.replayed
            assert again.result == "sent"
        finally:
            if backend is None:
                await keys.close()

    asyncio.run(main())


# -- outages: the local deadline, and final writes retried -------------------------------------


def test_a_reservation_is_lost_when_hold_for_passes_while_renewals_fail(store: Store) -> None:
    outage = Outage(store.backend(), "extend_key")
    keys = al.Idempotency(outage, settings=IdempotencySettings(hold_for=0.6))  # type: ignore[arg-type]
    try:
        act = keys.begin("charge", {"cents": 700}, step="pay", task_id="order-15")
        act.check()
        outage.down()  # renewals fail; another attempt may take the key over once it runs out
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                act.check()
            except ReservationLost:
                break
            time.sleep(0.02)
        else:
            pytest.fail("check() passed long after hold_for ran out unrenewed")
        outage.up()  # the store answers again: too late, whatever it says
        with pytest.raises(ReservationLost):
            act.check()
        with pytest.raises(ReservationLost):
            act.complete({"charged": True})  # not recorded: someone else may be acting
        record = keys.get(act.key)
        assert record is not None
        assert record.state == "in_flight"
    finally:
        if store.kind != "memory":
            keys.close()


@pytest.mark.parametrize("lose", ["request", "reply"])
@pytest.mark.parametrize("outcome", ["complete", "fail", "release"])
def test_a_short_outage_at_the_final_write_does_not_orphan_the_outcome(
    store: Store, lose: Literal["request", "reply"], outcome: str
) -> None:
    outage = Outage(store.backend(), "complete_key", "fail_key", "release_key", lose=lose)
    keys = al.Idempotency(outage, settings=IdempotencySettings(hold_for=10.0))  # type: ignore[arg-type]
    ledger: list[int] = []

    def act() -> str:
        ledger.append(1)
        outage.fail_next(2)  # the store is away for the outcome's first two tries
        if outcome == "fail":
            raise Declined("card declined")
        if outcome == "release":
            raise NotApplied("refused before sending")
        return f"sent {len(ledger)}"

    def call() -> al.Outcome[str]:
        return keys.call(
            act, tool="pay", args={"cents": 1}, step="s", task_id="order-16", fail_on=(Declined,)
        )

    try:
        if outcome == "complete":
            first = call()
            assert (first.replayed, first.value) == (False, "sent 1")
            again = call()
            assert again.replayed
            assert again.value == "sent 1"
            assert keys.get(again.key).state == "done"  # type: ignore[union-attr]
        elif outcome == "fail":
            for _ in range(2):
                with pytest.raises(Declined, match="card declined"):
                    call()
        else:
            with pytest.raises(NotApplied):
                call()
            outage.up()
            ledger_before = len(ledger)
            with pytest.raises(NotApplied):  # released: the next call acts at once
                call()
            assert len(ledger) == ledger_before + 1
        assert outage.failed
        assert len(ledger) == (2 if outcome == "release" else 1)
    finally:
        if store.kind != "memory":
            keys.close()


def test_the_final_write_gives_up_at_the_local_deadline(store: Store) -> None:
    outage = Outage(store.backend(), "complete_key")
    keys = al.Idempotency(outage, settings=IdempotencySettings(hold_for=0.6))  # type: ignore[arg-type]
    ledger: list[int] = []

    def act() -> str:
        ledger.append(1)
        outage.down()
        return "sent"

    try:
        with pytest.raises(ReservationLost) as info:
            keys.call(act, tool="pay", args={}, step="s", task_id="order-17")
        assert isinstance(info.value.__cause__, al.BackendUnavailable)
        assert len(outage.failed) >= 2  # retried before giving up
        outage.up()
        record = keys.get(derive_key("order-17", "s", "pay", {}))
        assert record is not None
        assert record.state == "in_flight"
    finally:
        if store.kind != "memory":
            keys.close()


def test_the_async_final_write_is_retried_through_a_short_outage(store: Store) -> None:
    async def main() -> None:
        inner = store.backend().open_async() if store.kind == "memory" else None
        outage = Outage(
            inner if inner is not None else al.connect_async(store.url),
            "complete_key",
            lose="reply",
        )
        keys = al.AsyncIdempotency(outage, settings=IdempotencySettings(hold_for=10.0))  # type: ignore[arg-type]
        ledger: list[int] = []

        async def act() -> str:
            ledger.append(1)
            outage.fail_next(2)
            return "sent"

        try:
            first = await keys.call(act, tool="pay", args={}, step="s", task_id="order-18")
            again = await keys.call(act, tool="pay", args={}, step="s", task_id="order-18")
            assert (first.replayed, again.replayed, again.value) == (False, True, "sent")
            assert ledger == [1]
            assert outage.failed
        finally:
            if inner is None:
                await keys.close()

    asyncio.run(main())


def test_a_client_that_only_replays_purges_a_backlog_in_batches(store: Store) -> None:
    short = keys_with(store, window=0.2, purge_every=3600.0)
    for i in range(5):
        short.call(lambda: "sent", tool="t", args={"i": i}, step=f"s{i}", task_id="w")
    expired = [
        short.identity(tool="t", args={"i": i}, step=f"s{i}", task_id="w")[0] for i in range(5)
    ]
    assert all(short.backend.get_key(k) is not None for k in expired)
    keeper = keys_with(store, purge_every=0.05, purge_batch=2)
    keeper.call(lambda: "kept", tool="t", args={}, step="keep", task_id="w")
    time.sleep(0.3)  # the five keys of the short window expire
    for _ in range(4):  # replays only: each purges a batch while a backlog remains
        time.sleep(0.06)
        assert keeper.call(lambda: "again", tool="t", args={}, step="keep", task_id="w").replayed
    backend = keeper.backend
    assert [backend.get_key(k) for k in expired] == [None] * 5
    if store.kind != "redis" and not store.kind.startswith("redis"):
        assert backend.purge_keys(1000) == 0  # nothing past its window was left behind
    for client in (short, keeper):
        if store.kind != "memory":
            client.close()
