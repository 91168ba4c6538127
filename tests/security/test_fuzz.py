"""Fuzzed input to the public API on every store: every input either works or raises a subclass of
:class:`agentlease.AgentLeaseError`, and a refused call changes nothing in the store.

Each property draws the arguments of one call from tests/security/_strategies.py (mostly valid,
so that calls reach the store, and sometimes hostile: deep nesting, huge strings, lone
surrogates, NUL bytes, integers past 2**63 and past the float range, names that collide with the
store's keys and identifiers), reads what the public API shows of the store (a snapshot) before
and after, and checks that a refusal left it equal. Any other exception (a driver's, a
``TypeError``, ``OverflowError``, ``RecursionError``, ``UnicodeEncodeError``) fails the test.

Memory and SQLite get a few dozen examples per property, Redis, Redis Cluster and PostgreSQL
fewer; with AGENTLEASE_DEEP=1 many more. Counters are also checked against a model: what the
store returns is exactly what Python's integers say, within the range every counter keeps to.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import uuid
from collections.abc import Callable, Hashable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentlease as al
from agentlease import AgentLeaseError
from agentlease.backends.memory import MemoryBackend
from tests.conftest import BACKENDS, EMBEDDED
from tests.security import _strategies as s

DEEP = os.environ.get("AGENTLEASE_DEEP") == "1"
FUZZ_BACKENDS = [
    b for b in ("memory", "sqlite", "redis", "redis-cluster", "postgres") if b in BACKENDS
]
MAX = 2**53 - 1

settings.register_profile(
    "agentlease-fuzz",
    deadline=None,
    database=None,  # no .hypothesis directory: a failure prints its example to run it again
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "agentlease-fuzz-deep", settings.get_profile("agentlease-fuzz"), max_examples=400
)


def _examples(kind: str) -> int:
    if kind in EMBEDDED:
        return 400 if DEEP else 30
    return 60 if DEEP else 8


class Fuzz:
    """One store under fuzz: its clients (sync faces) and a few things in it to watch."""

    def __init__(self, kind: str, url: str, memory: MemoryBackend | None) -> None:
        self.kind, self.url, self._memory = kind, url, memory
        self.queue = al.Queue(self._backend())
        self.state = al.SharedState(self._backend())
        self.keys = al.Idempotency(self._backend())
        # Something in the store for a refusal to break: a leased task, a queued one, a record,
        # a counter, a held lock and an idempotency key in flight.
        self.queue.enqueue("fz", {"n": 1}, id="seed-leased", partition="p")
        self.queue.enqueue("fz", [1, "two"], id="seed-queued", priority=3, dedup_key="d")
        (job,) = self.queue.claim("fz", lease_for=300)
        self.lease = job.lease
        self.state.compare_and_set("fz-r", 0, {"status": "draft", "n": 1})
        self.state.add("fz-c", 5)
        self.locked = self.state.locks(["fz-l"], timeout=5, ttl=300).__enter__()
        self.fz_key = self.keys.begin("tool", {"a": 1}, step="s", task_id="fz-task").key
        self.watched = {"fz", "seed-leased", "seed-queued", "fz-r", "fz-c", "fz-l", self.fz_key}

    def _backend(self) -> al.Backend:
        return self._memory if self._memory is not None else al.connect(self.url)

    def close(self) -> None:
        self.locked.__exit__(None, None, None)
        self.keys.close()  # stops the in-flight key's renewals (closing memory releases nothing)
        self.state.close()
        self.queue.close()

    def snapshot(self, *names: object) -> dict[str, object]:
        """What the public API shows of the store: the watched things, and the named ones."""
        shot: dict[str, object] = {
            "fz": _stats(self.queue.stats("fz")),
            "inspect": [
                (i.task_id, i.attempt, i.reclaims, i.failures) for i in self.queue.inspect("fz")
            ],
            "dead": self.queue.dead("fz"),
            "leased": self.queue.get("seed-leased"),
            "queued": self.queue.get("seed-queued"),
            "record": self.state.get("fz-r"),
            "counter": self.state.counter("fz-c"),
            "lock": self.state.lock_holders(["fz-l"]),
            "key": _key(self.keys.get(self.fz_key)),
        }
        for i, name in enumerate(names):
            shot[f"queue {i}"] = _read(lambda n=name: _stats(self.queue.stats(n)))
            shot[f"task {i}"] = _read(lambda n=name: self.queue.get(n))
            shot[f"record {i}"] = _read(lambda n=name: self.state.get(n))
            shot[f"counter {i}"] = _read(lambda n=name: self.state.counter(n))
            shot[f"lock {i}"] = _read(lambda n=name: self.state.lock_holders([n]))
            shot[f"idem {i}"] = _read(lambda n=name: _key(self.keys.get(n)))
        return shot

    def refused_or_works(
        self, call: Callable[[], object], *names: object, aside: bool = True
    ) -> object:
        """Run ``call``: it works, or it raises an AgentLeaseError and changes nothing.

        With ``aside`` (a call that names none of the watched things), a call that works leaves
        them as they were too: a name built to collide with the store's own keys reaches
        nothing else.
        """
        before = self.snapshot(*names)
        try:
            result = call()
        except AgentLeaseError as exc:
            refusal = exc
        else:
            if aside and not any(isinstance(n, str) and n in self.watched for n in names):
                after = self.snapshot()
                assert after == {k: before[k] for k in after}, f"{call} reached the watched"
            return result
        assert str(refusal), f"{type(refusal).__name__} says nothing"
        assert self.snapshot(*names) == before, f"{refusal!r} changed the store"
        return refusal


def _read(read: Callable[[], object]) -> object:
    try:
        return read()
    except AgentLeaseError as exc:
        return type(exc)


def _stats(stats: al.QueueStats) -> object:
    return (stats.counts, stats.hot_partitions)


def _key(record: al.KeyRecord | None) -> object:
    if record is None:
        return None
    return (record.state, record.fingerprint, record.fence, record.holder, record.result_json)


@pytest.fixture(params=FUZZ_BACKENDS)
def fuzz(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fuzz]:
    kind = request.param
    if kind == "memory":
        f = Fuzz(kind, "memory://", MemoryBackend())
    elif kind == "sqlite":
        f = Fuzz(kind, f"sqlite:///{tmp_path / 'fuzz.db'}", None)
    else:
        f = Fuzz(kind, request.getfixturevalue("served_url_" + kind.replace("-", "_")), None)
    try:
        yield f
    finally:
        f.close()


def run(fuzz: Fuzz, strategy: st.SearchStrategy[Any], body: Callable[[Any], None]) -> None:
    """Run ``body`` on examples of ``strategy``, as many as the store's profile allows."""
    profile = "agentlease-fuzz-deep" if DEEP else "agentlease-fuzz"

    @settings(settings.get_profile(profile), max_examples=_examples(fuzz.kind))
    @given(strategy)
    def examples(drawn: Any) -> None:
        body(drawn)

    examples()


def fresh(prefix: str = "n") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- queue ---------------------------------------------------------------------------------------


def test_enqueue(fuzz: Fuzz) -> None:
    drawn = st.fixed_dictionaries(
        {
            "queue": s.names(),
            "payload": s.payloads,
            "id": st.one_of(st.none(), s.names()),
            "priority": s.int_args(),
            "delay": st.one_of(st.just(0.0), s.durations),
            "dedup_key": st.one_of(st.none(), s.names()),
            "partition": st.one_of(st.none(), s.names()),
        }
    )

    def body(kw: dict[str, Any]) -> None:
        queue = kw.pop("queue")
        kw["payload"] = s.real(kw["payload"])
        got = fuzz.refused_or_works(lambda: fuzz.queue.enqueue(queue, **kw), queue, kw["id"])
        if isinstance(got, al.Enqueued) and got.created:
            task = fuzz.queue.get(got.task_id)
            assert task.payload == s.plain(kw["payload"])
            assert (task.queue, task.priority, task.dedup_key) == (
                queue,
                kw["priority"],
                kw["dedup_key"],
            )

    run(fuzz, drawn, body)


def test_enqueue_many_is_all_or_nothing(fuzz: Fuzz) -> None:
    spec = st.builds(
        al.TaskSpec,
        payload=s.payloads,
        id=st.one_of(st.none(), st.none(), s.names()),
        priority=s.int_args(),
        delay=st.one_of(st.just(0.0), s.durations),
        dedup_key=st.one_of(st.none(), s.names()),
        partition=st.one_of(st.none(), s.names()),
    )
    tasks = st.lists(st.one_of(spec, s.payloads), max_size=4)
    drawn = st.tuples(s.names(), st.one_of(tasks, tasks, s.names(), st.just({"k": 1})))

    def body(args: tuple[Any, list[Any]]) -> None:
        queue, items = args
        if isinstance(items, list):
            items = [
                replace(i, payload=s.real(i.payload)) if isinstance(i, al.TaskSpec) else s.real(i)
                for i in items
            ]
        fuzz.refused_or_works(lambda: fuzz.queue.enqueue_many(queue, items), queue)

    run(fuzz, drawn, body)


def test_claim_and_reads(fuzz: Fuzz) -> None:
    drawn = st.tuples(
        st.sampled_from(
            [
                *("claim", "get", "stats", "inspect", "dead", "requeue_dead", "reap"),
                *("claim_as", "register_worker", "unregister_worker"),
            ]
        ),
        s.names(),
        s.int_args(0, 3),
        st.one_of(st.none(), s.durations),
    )

    def body(args: tuple[str, Any, Any, Any]) -> None:
        what, name, n, seconds = args
        q = fuzz.queue
        calls: dict[str, Callable[[], object]] = {
            "claim": lambda: q.claim(name, n, lease_for=seconds),
            "get": lambda: q.get(name),
            "stats": lambda: q.stats(name),
            "inspect": lambda: q.inspect(name, limit=n),
            "dead": lambda: q.dead(name, limit=n),
            "requeue_dead": lambda: q.requeue_dead(name, [name]),
            "reap": lambda: q.reap(name),
            "claim_as": lambda: q.claim("fuzz", n, lease_for=seconds, holder=name),
            "register_worker": lambda: q.register_worker(
                name, {"n": n}, ttl=5.0 if seconds is None else seconds
            ),
            "unregister_worker": lambda: q.unregister_worker(name),
        }
        got = fuzz.refused_or_works(calls[what], name)
        if what in ("claim", "claim_as") and isinstance(got, list):
            for job in got:
                q.release(job.lease)

    run(fuzz, drawn, body)


def test_cancel_and_delete_queue(fuzz: Fuzz) -> None:
    reasons = st.one_of(s.names(), s.nasty_text, st.just("x" * 1001), st.just("stop"))
    drawn = st.tuples(
        st.sampled_from(["cancel", "cancel_fresh", "delete_queue"]),
        s.names(),
        reasons,
        s.int_args(0, 3),
        st.one_of(st.booleans(), s.not_str),
    )

    def body(args: tuple[str, Any, Any, Any, Any]) -> None:
        what, name, reason, n, force = args
        if isinstance(name, str) and name in fuzz.watched:
            return  # it works on them, and they are what every other call is checked against
        q = fuzz.queue
        if what == "cancel_fresh":  # a task that exists, so the reason reaches the store
            name = fresh("c")
            q.enqueue(fresh("cq"), {}, id=name)
        if what != "delete_queue":
            fuzz.refused_or_works(lambda: q.cancel(name, reason), name)
        else:
            fuzz.refused_or_works(lambda: q.delete_queue(name, force=force, batch=n), name)

    run(fuzz, drawn, body)


def test_holder_writes(fuzz: Fuzz) -> None:
    """complete, fail, progress, extend and release with hostile values, and with forged
    leases; a refusal leaves the leased task as it was."""
    forged = st.builds(
        al.Lease,
        task_id=st.one_of(st.just("seed-leased"), s.names()),
        queue=st.one_of(st.just("fz"), s.names()),
        token=st.one_of(st.just(fuzz.lease.token), s.names()),
        attempt=st.one_of(st.just(fuzz.lease.attempt), s.int_args()),
        leased_at=st.just(fuzz.lease.leased_at),
        expires_at=st.just(fuzz.lease.expires_at),
    )
    drawn = st.tuples(
        st.sampled_from(["complete", "fail", "progress", "extend", "release", "complete_many"]),
        forged,
        s.payloads,
        st.one_of(st.none(), s.durations),
    )

    def body(args: tuple[str, al.Lease, Any, Any]) -> None:
        what, lease, value, seconds = args
        value = s.real(value)
        q = fuzz.queue
        real = lease == fuzz.lease
        if (real and what in ("complete", "release", "complete_many")) or what == "fail":
            # A write that ends the lease works on a copy of the seed, to keep the seed leased.
            tid = fresh("t")
            q.enqueue("fz-w", {"x": 1}, id=tid)
            (job,) = q.claim("fz-w", lease_for=300)
            lease = job.lease if real else lease
        calls: dict[str, Callable[[], object]] = {
            "complete": lambda: q.complete(lease, value),
            "fail": lambda: q.fail(lease, _error(value), retry_in=seconds),
            "progress": lambda: q.progress(lease, value, checkpoint=value),
            "extend": lambda: q.extend([lease], lease_for=seconds),
            "release": lambda: q.release(lease),
            "complete_many": lambda: q.complete_many([(lease, value)]),
        }
        fuzz.refused_or_works(calls[what], aside=False)  # the seed's lease may be extended

    run(fuzz, drawn, body)


def _error(value: object) -> BaseException | str:
    return value if isinstance(value, str) else RuntimeError(type(value).__name__)


# -- shared state ----------------------------------------------------------------------------------


def test_records(fuzz: Fuzz) -> None:
    machine = al.StateMachine(
        field="status", transitions={"draft": {"review"}, "review": set()}, initial={"draft"}
    )
    drawn = st.tuples(
        st.sampled_from(["cas", "set_field", "delete", "update"]),
        st.one_of(st.just("fz-r"), s.names()),
        st.one_of(st.just("n"), st.just("status"), s.names()),
        s.payloads,
        s.int_args(0, 3),
        st.one_of(st.none(), s.int_args(0, 10)),
        st.booleans(),
    )

    def body(args: tuple[str, Any, Any, Any, Any, Any, bool]) -> None:
        what, key, field, value, version, fence, guarded = args
        value = s.real(value)
        st_ = fuzz.state
        m = machine if guarded else None
        record: Any = {field: value} if isinstance(field, Hashable) else [(field, value)]
        calls: dict[str, Callable[[], object]] = {
            "cas": lambda: st_.compare_and_set(key, version, record, machine=m, fence=fence),
            "set_field": lambda: st_.set_field(
                key, field, value, expected_version=version, machine=m, fence=fence
            ),
            "delete": lambda: st_.delete(key, version, fence=fence),
            "update": lambda: st_.update(key, lambda r: record, attempts=2, machine=m),
        }
        got = fuzz.refused_or_works(calls[what], key)
        if what == "set_field" and isinstance(got, int):
            assert st_.get(key).value[field] == s.plain(value)

    run(fuzz, drawn, body)


def test_counters_match_a_model(fuzz: Fuzz) -> None:
    """Every counter step on a fresh counter, in order: the store answers exactly what Python's
    integers say, within the counters' range, or refuses and keeps the value."""
    step = st.tuples(
        st.sampled_from(["add", "reserve", "take", "release", "hold", "counter"]),
        s.int_args(-3, 3),
        s.int_args(-5, 5),
    )
    drawn = st.tuples(st.one_of(st.just(None), s.names()), st.lists(step, max_size=6))

    def body(args: tuple[Any, list[tuple[str, Any, Any]]]) -> None:
        name, steps = args
        name = fresh("c") if name is None else name
        start = _read(lambda: fuzz.state.counter(name))  # a drawn name may be in use already
        model = start if isinstance(start, int) else 0
        for what, n, bound in steps:
            expected = _model(what, model, n, bound)
            got = fuzz.refused_or_works(_counter_step(fuzz.state, what, name, n, bound), name)
            if isinstance(got, AgentLeaseError):
                # refused: only what the model refuses, or a name no counter may have
                assert expected is None or isinstance(got, al.InvalidName), (what, n, bound, got)
            else:
                assert got == expected, (what, model, n, bound, got)
                model = expected if what != "hold" else model  # a hold gives its units back

    run(fuzz, drawn, body)


def _counter_step(
    state: al.SharedState, what: str, name: Any, n: Any, bound: Any
) -> Callable[[], int]:
    calls: dict[str, Callable[[], int]] = {
        "add": lambda: state.add(name, n),
        "reserve": lambda: state.reserve(name, n, limit=bound),
        "take": lambda: state.take(name, n, minimum=bound),
        "release": lambda: state.release(name, n),
        "hold": lambda: _held(state, name, n, bound),
        "counter": lambda: state.counter(name),
    }
    return calls[what]


def _held(state: al.SharedState, name: str, n: int, limit: int) -> int:
    with state.hold(name, n, limit=limit, ttl=30) as held:
        assert held.value is not None
        return held.value


def _model(what: str, value: int, n: object, bound: object) -> int | None:
    """What a counter step returns on ``value``, or ``None`` if it is refused."""

    def amount(x: object, low: int = -MAX) -> bool:
        return type(x) is int and low <= x <= MAX

    if what == "counter":
        return value
    if what == "add":
        return value + n if amount(n) and abs(value + n) <= MAX else None  # type: ignore[operator]
    if not amount(n, 1):
        return None
    assert isinstance(n, int)
    if what == "release":
        return value - n if value - n >= 0 else None
    if not amount(bound):
        return None
    assert isinstance(bound, int)
    if what in ("reserve", "hold"):
        return value + n if value + n <= bound else None
    return value - n if value - n >= bound else None  # take


def test_locks(fuzz: Fuzz) -> None:
    drawn = st.tuples(
        st.sampled_from(["locks", "holders", "release", "sweep"]),
        st.one_of(st.lists(st.one_of(st.just("fz-l"), s.names()), max_size=3), s.names()),
        st.one_of(st.just(0.05), s.durations),
        st.one_of(st.just(5.0), s.durations),
        st.one_of(st.just("someone"), s.names()),
    )

    def body(args: tuple[str, list[Any], Any, Any, Any]) -> None:
        what, names, timeout, ttl, owner = args
        st_ = fuzz.state

        def locks() -> object:
            with st_.locks(names, timeout=timeout, ttl=ttl) as held:
                return held.tokens

        calls: dict[str, Callable[[], object]] = {
            "locks": locks,
            "holders": lambda: st_.lock_holders(names),
            "release": lambda: st_.release_locks(names, owner),
            "sweep": lambda: st_.sweep_locks(ttl),
        }
        fuzz.refused_or_works(calls[what], *(names if isinstance(names, list) else [names]))

    run(fuzz, drawn, body)


# -- retry budgets, breakers, spend budgets --------------------------------------------------------


def test_budgets_and_breakers(fuzz: Fuzz) -> None:
    ratios = st.one_of(st.floats(0, 2), st.sampled_from(s.EDGE_FLOATS), s.int_args(0, 5))
    drawn = st.tuples(
        st.sampled_from(["budget", "breaker", "spend"]),
        st.one_of(st.just("fz-c"), st.just("fz-r"), s.names()),
        ratios,
        s.int_args(0, 5),
        st.one_of(st.just(5.0), s.durations),
        st.one_of(st.just(0.5), s.durations),
        s.int_args(0, 1_000),
        s.int_args(0, 1_000),
    )

    def body(args: tuple[str, Any, Any, Any, Any, Any, Any, Any]) -> None:
        what, name, ratio, count, cooldown, staleness, limit, amount = args
        st_ = fuzz.state

        def budget() -> object:
            b = al.RetryBudget(st_, scope=name, ratio=ratio, minimum=count, flush_every=2)
            b.record_call()
            b.record_call()
            try:
                b.acquire_retry()
            except al.RetryBudgetExhausted as exc:
                return exc.payload()
            return None

        def breaker() -> object:
            b = al.CircuitBreaker(
                st_, name, threshold=count, cooldown=cooldown, staleness=staleness
            )
            try:
                b.before()
            except al.CircuitOpen as exc:
                return exc.payload()
            b.failure()
            return b.seen

        def spend() -> object:
            b = al.SpendBudget(st_, "usd", limit=limit, scope=name, hold_ttl=cooldown)
            with b.reserve(amount) as hold:
                hold.settle(amount)
            return b.spent()

        calls = {"budget": budget, "breaker": breaker, "spend": spend}
        fuzz.refused_or_works(calls[what], name)

    run(fuzz, drawn, body)


# -- idempotency -----------------------------------------------------------------------------------


def test_idempotency_keys(fuzz: Fuzz) -> None:
    drawn = st.tuples(
        s.names(),
        s.payloads,
        st.one_of(st.none(), s.names()),
        st.one_of(st.just("task"), s.names()),
        st.one_of(st.none(), st.none(), st.just("fz-key"), s.names(), st.just(fuzz.fz_key)),
        st.one_of(st.none(), st.floats(0, 0.1), s.not_durations),  # not a wait that lasts
        s.payloads,
    )

    def body(args: tuple[Any, ...]) -> None:
        tool, call_args, step, task_id, key, wait, result = args
        call_args, result = s.real(call_args), s.real(result)

        def call() -> object:
            act = fuzz.keys.begin(tool, call_args, step=step, task_id=task_id, key=key, wait=wait)
            if act.replayed:
                return act
            try:
                act.complete(result)
            except al.PayloadError:
                # The side effect happened: a result that cannot be stored is stored as a
                # permanent failure (documented), so that the action never runs again.
                record = fuzz.keys.get(act.key)
                assert record is not None
                assert record.state == "failed"
            return act

        def identity() -> object:
            return fuzz.keys.identity(tool, call_args, step=step, task_id=task_id, key=key)

        fuzz.refused_or_works(identity, key)
        fuzz.refused_or_works(call, key)
        fuzz.refused_or_works(lambda: fuzz.keys.purge(wait), key)

    run(fuzz, drawn, body)


# -- URLs, settings and values without a store ---------------------------------------------------


def test_urls(tmp_path: Path) -> None:
    drawn = st.one_of(
        st.tuples(
            s.schemes, s.hosts, st.sampled_from(["", "/0", "/db", "/x.db", "/%00"]), s.options
        )
        .filter(lambda t: t[0].lower() not in ("redis", "rediss", "postgresql", "postgres") or t[1])
        .map(lambda t: f"{t[0]}://{t[1]}{t[2]}{t[3]}"),
        st.tuples(s.nasty_text, s.options).map(
            lambda t: f"sqlite:///{tmp_path}/{t[0].replace('/', '_')}.db{t[1]}"
        ),
        s.nasty_text,
        s.not_str,
    )

    @settings(settings.get_profile("agentlease-fuzz"), max_examples=300 if DEEP else 60)
    @given(drawn, st.booleans())
    def examples(url: Any, asynchronous: bool) -> None:
        try:
            backend = al.connect_async(url) if asynchronous else al.connect(url)
        except AgentLeaseError as exc:
            refusal = exc
        else:
            _close(backend)
            return
        assert str(refusal)

    examples()


def _close(backend: object) -> None:
    closed = backend.close()  # type: ignore[attr-defined]
    if inspect.isawaitable(closed):
        asyncio.run(closed)  # type: ignore[arg-type]


def test_settings_and_durations() -> None:
    fields = {
        al.QueueSettings: [
            "lease_for",
            "max_lease",
            "progress_timeout",
            "max_reclaims",
            "max_payload_bytes",
        ],
        al.IdempotencySettings: [
            "window",
            "hold_for",
            "max_result_bytes",
            "purge_every",
            "purge_batch",
        ],
        al.WorkerSettings: [
            "concurrency",
            "prefetch",
            "poll_interval",
            "shutdown_grace",
            "heartbeat_interval",
        ],
    }
    drawn = st.tuples(
        st.sampled_from(sorted(fields, key=lambda c: c.__name__)),
        st.data(),
        st.one_of(s.durations, s.int_args(0, 100)),
    )

    @settings(settings.get_profile("agentlease-fuzz"), max_examples=200 if DEEP else 40)
    @given(drawn)
    def examples(args: tuple[Any, st.DataObject, Any]) -> None:
        cls, data, value = args
        field = data.draw(st.sampled_from(fields[cls]))
        with contextlib.suppress(AgentLeaseError):
            cls(**{field: value})

    examples()


def test_state_machines() -> None:
    states = st.one_of(  # hashable, to be keys of the transitions
        st.sampled_from(["draft", "review", *s.STORE_WORDS, *s.SPECIAL_NAMES]),
        s.nasty_text,
        st.integers(),
        st.none(),
        st.tuples(st.text(max_size=2)),
    )
    collections = st.one_of(st.sets(st.sampled_from(["draft", "review"])), s.names(), s.not_str)
    drawn = st.tuples(
        st.one_of(st.just("status"), s.names()),
        st.one_of(st.dictionaries(states, collections, max_size=3), s.not_str),
        st.one_of(st.just(()), collections),
        states,
    )

    @settings(settings.get_profile("agentlease-fuzz"), max_examples=300 if DEEP else 60)
    @given(drawn)
    def examples(args: tuple[Any, Any, Any, Any]) -> None:
        field, transitions, initial, target = args
        try:
            machine = al.StateMachine(field=field, transitions=transitions, initial=initial)
            machine.sources(target)
        except AgentLeaseError as exc:
            refusal = exc
        else:
            return
        assert str(refusal)

    examples()


def test_deep_and_huge_payloads_are_typed_refusals() -> None:
    queue = al.Queue(MemoryBackend())
    queue.enqueue("q", s.nested(200))
    for depth in (1000, 100_000):
        with pytest.raises(al.NotJSON, match="JSON"):
            queue.enqueue("q", s.nested(depth))
    with pytest.raises(al.PayloadTooLarge):
        queue.enqueue("q", "x" * (1 << 20))
    with pytest.raises(al.NotJSON):
        queue.enqueue("q", {"k": "\ud800"})
    with pytest.raises(al.NotJSON):
        queue.enqueue("q", 2**64)
    assert queue.stats("q").counts == {"queued": 1}


def test_mutated_plans_are_refused_with_plan_refused_and_change_nothing() -> None:
    """Random edits of a sealed plan's text (a character changed, dropped or inserted, a slice
    cut out) are refused with PlanRefused, never another exception, and write nothing; a plan
    whose text is unchanged acts (the MAC covers the content, not the bytes' layout)."""
    state = al.SharedState(MemoryBackend(), space="fuzz")
    state.compare_and_set("order", 0, {"status": "paid", "amount": 40})
    with state.plan(step="refund", expires_in=3600) as plan:
        state.get("order")
        state.counter("refunds")
        plan.set_field("order", "status", "refunded")
        plan.add("refunds", 1)
    sealed = plan.seal()
    edits = st.one_of(
        st.tuples(st.just("set"), st.integers(0, len(sealed) - 1), st.characters()),
        st.tuples(st.just("drop"), st.integers(0, len(sealed) - 1), st.just("")),
        st.tuples(st.just("insert"), st.integers(0, len(sealed)), st.text(min_size=1, max_size=8)),
        st.tuples(st.just("cut"), st.integers(0, len(sealed) - 1), st.integers(1, 64).map(str)),
    )

    @settings(settings.get_profile("agentlease-fuzz"), max_examples=400 if DEEP else 80)
    @given(st.lists(edits, min_size=1, max_size=4))
    def prop(steps: list[tuple[str, int, str]]) -> None:
        text = sealed
        for how, where, what in steps:
            at = min(where, len(text))
            if how == "set":
                text = text[:at] + what + text[at + 1 :]
            elif how == "drop":
                text = text[:at] + text[at + 1 :]
            elif how == "insert":
                text = text[:at] + what + text[at:]
            else:
                text = text[:at] + text[at + int(what) :]
        if text == sealed:
            return
        before = (state.get("order"), state.counter_version("refunds"))
        try:
            outcome = state.act(text, approved_by="fuzz")
        except al.PlanRefused:
            pass
        else:  # an edit that kept the JSON's content (whitespace, key order) is the same plan
            assert orjson.loads(text) == orjson.loads(sealed), (text, outcome)
            return
        assert (state.get("order"), state.counter_version("refunds")) == before

    prop()
