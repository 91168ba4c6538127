"""A model-based test of the leased queue's state machine (memory backend, fake clock).

Hypothesis drives a :class:`agentlease.Queue` on a :class:`agentlease.MemoryBackend` whose clock
only moves when a rule says so, and keeps a small reference model beside it. Every rule predicts
what the store must answer; after every step the whole store is compared with the model.

The model encodes the documented semantics (priority then FIFO, reaped and front-released tasks
ahead of the rest of their priority, due tasks promoted at claim, budgets for reclaims and
failures). Where they leave a choice open (the order among tasks that were all sent to the
front, or among tasks requeued in one step), the model accepts any order and then follows what
the store did.

Run many more examples with ``AGENTLEASE_DEEP=1``.
"""

from __future__ import annotations

import itertools
import os
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import agentlease as al
from agentlease import LeaseLost, QueueSettings, TaskSpec

DEEP = os.environ.get("AGENTLEASE_DEEP") == "1"

QUEUE = "sm"
START = 1_000.0
MAX_LEASE = 6.0
LEASE_CHOICES = (1.0, 2.5)
RESULTS = (None, "ok", {"k": [1, 2.5, None]})
CHECKPOINTS = (None, {"step": 1}, [1, 2, 3])


SPECS = st.builds(
    TaskSpec,
    id=st.none() | st.sampled_from(["t1", "t2", "t3", "t4"]),
    priority=st.integers(0, 2),
    delay=st.sampled_from([0.0, 0.0, 0.5, 1.5]),
    dedup_key=st.none() | st.sampled_from(["a", "b", "c"]),
)
"""Tasks to enqueue (payloads are added, unique, when they are enqueued)."""


class FakeClock:
    """The store's clock; it moves only when the test advances it."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class Fatal(Exception):
    """An error the retry policy never retries."""


@dataclass
class Model:
    """What the store must hold for one task."""

    id: str
    priority: int
    payload: Any
    state: str
    run_at: float
    seq: int
    front: bool = False
    attempt: int = 0
    reclaims: int = 0
    failures: int = 0
    token: str | None = None
    expires_at: float | None = None
    deadline: float = 0.0
    progressed_at: float = 0.0
    result: Any = None
    progress: Any = None
    checkpoint: Any = None
    dead_because: str | None = None


def goes_before(u: Model, j: Model) -> bool:
    """Whether ready task ``u`` must be picked before ready task ``j``.

    Higher priority first; within a priority, tasks sent to the front before the others; tasks
    not sent to the front in sequence order. Front tasks among themselves, and tasks sharing a
    sequence number (requeued in one step), may come in any order.
    """
    if u.priority != j.priority:
        return u.priority > j.priority
    if u.front != j.front:
        return u.front
    if u.front:
        return False
    return u.seq < j.seq


class QueueMachine(RuleBasedStateMachine):
    """A queue client on a fake-clock memory store, with the reference model beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.tasks: dict[str, Model] = {}
        self.by_dedup: dict[str, str] = {}
        self.leases: list[al.Lease] = []  # every lease ever issued, in order
        self.events: list[al.Event] = []
        self.seq = 0
        self.payloads = 0
        self.rand = random.Random(1234)
        self.max_reclaims = 2
        self.max_failures = 3
        self.policy = al.RetryPolicy(max_failures=3)
        self.q: al.Queue | None = None
        self.progress_timeout: float | None = None
        self.reap_front = True

    # -- set-up ---------------------------------------------------------------------------------

    @initialize(
        progress_timeout=st.sampled_from([None, 2.0]),
        reap_front=st.booleans(),
        max_reclaims=st.integers(0, 2),
        max_failures=st.integers(1, 3),
        first=st.lists(SPECS, max_size=6),
    )
    def open_queue(
        self,
        progress_timeout: float | None,
        reap_front: bool,
        max_reclaims: int,
        max_failures: int,
        first: list[TaskSpec],
    ) -> None:
        self.progress_timeout = progress_timeout
        self.reap_front = reap_front
        self.max_reclaims = max_reclaims
        self.max_failures = max_failures
        self.policy = al.RetryPolicy(
            max_failures=max_failures, base=0.5, cap=2.0, non_retryable=(Fatal,)
        )
        backend = al.MemoryBackend(clock=self.clock)
        self.q = al.Queue(
            backend,
            settings=QueueSettings(
                lease_for=1.0,
                max_lease=MAX_LEASE,
                progress_timeout=progress_timeout,
                max_reclaims=max_reclaims,
                reap_front=reap_front,
            ),
            on_event=self.events.append,
        )
        if first:
            self.enqueue_many(first)

    @property
    def queue(self) -> al.Queue:
        assert self.q is not None
        return self.q

    # -- the model's own transitions ------------------------------------------------------------

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _is_current(self, lease: al.Lease) -> bool:
        m = self.tasks[lease.task_id]
        return (
            m.state == "leased"
            and m.token == lease.token
            and m.expires_at is not None
            and self.clock.now < m.expires_at
        )

    def _current(self) -> list[al.Lease]:
        return [lease for lease in self.leases if self._is_current(lease)]

    def _stale(self) -> list[al.Lease]:
        return [lease for lease in self.leases if not self._is_current(lease)]

    def _expiry(self, m: Model, lease_for: float) -> float:
        expiry = min(self.clock.now + lease_for, m.deadline)
        if self.progress_timeout is not None:
            expiry = min(expiry, m.progressed_at + self.progress_timeout)
        return expiry

    def _promote(self) -> None:
        for m in self.tasks.values():
            if m.state in ("scheduled", "failed") and m.run_at <= self.clock.now:
                m.state = "queued"

    def _reap(self) -> set[tuple[str, int, str]]:
        expired = [
            m
            for m in self.tasks.values()
            if m.state == "leased" and m.expires_at is not None and m.expires_at <= self.clock.now
        ]
        out: set[tuple[str, int, str]] = set()
        back = self._next_seq() if expired and not self.reap_front else None
        for m in expired:
            m.reclaims += 1
            m.token = None
            m.expires_at = None
            if m.reclaims > self.max_reclaims:
                event("reap: dead-lettered past max_reclaims")
                m.state = "dead"
                m.dead_because = "reclaims"
                out.add((m.id, m.attempt, "dead"))
                continue
            m.state = "queued"
            if back is None:
                m.front = True
            else:
                m.front = False
                m.seq = back
            out.add((m.id, m.attempt, "requeued"))
        return out

    def _reaped_events(self) -> set[tuple[str, int, str]]:
        got = {
            (e.task_id, e.attempt, str(e.fields["outcome"]))
            for e in self.events
            if e.name == "reaped"
        }
        self.events.clear()
        return got

    def _snapshot(self) -> dict[str, al.Task]:
        return {task_id: self.queue.get(task_id) for task_id in self.tasks}

    def _enqueued(self, specs: list[TaskSpec], outs: list[al.Enqueued]) -> None:
        assert len(outs) == len(specs)
        for spec, out in zip(specs, outs, strict=True):
            existing = (
                spec.id
                if spec.id is not None and spec.id in self.tasks
                else self.by_dedup.get(spec.dedup_key)
                if spec.dedup_key is not None
                else None
            )
            if existing is not None:
                assert out == al.Enqueued(existing, False), (spec, out)
                continue
            assert out.created, (spec, out)
            if spec.id is not None:
                assert out.task_id == spec.id
            assert out.task_id not in self.tasks
            self.tasks[out.task_id] = Model(
                id=out.task_id,
                priority=spec.priority,
                payload=spec.payload,
                state="scheduled" if spec.delay > 0 else "queued",
                run_at=self.clock.now + spec.delay,
                seq=self._next_seq(),
            )
            if spec.dedup_key is not None:
                self.by_dedup[spec.dedup_key] = out.task_id

    # -- producing ------------------------------------------------------------------------------

    def _with_payload(self, spec: TaskSpec) -> TaskSpec:
        self.payloads += 1
        return TaskSpec(
            payload={"n": self.payloads},
            id=spec.id,
            priority=spec.priority,
            delay=spec.delay,
            dedup_key=spec.dedup_key,
        )

    @rule(spec=SPECS)
    def enqueue(self, spec: TaskSpec) -> None:
        spec = self._with_payload(spec)
        out = self.queue.enqueue(
            QUEUE,
            spec.payload,
            id=spec.id,
            priority=spec.priority,
            delay=spec.delay,
            dedup_key=spec.dedup_key,
        )
        self._enqueued([spec], [out])

    @rule(specs=st.lists(SPECS, min_size=1, max_size=3))
    def enqueue_many(self, specs: list[TaskSpec]) -> None:
        specs = [self._with_payload(s) for s in specs]
        self._enqueued(specs, self.queue.enqueue_many(QUEUE, specs))

    # -- consuming ------------------------------------------------------------------------------

    @rule(n=st.integers(1, 4), lease_for=st.sampled_from(LEASE_CHOICES))
    def claim(self, n: int, lease_for: float) -> None:
        self._claim(n, lease_for)

    @rule(lease_for=st.sampled_from(LEASE_CHOICES))
    def claim_one(self, lease_for: float) -> None:
        """Claims drive everything else, so they get a second rule (a heavier weight)."""
        self._claim(1, lease_for)

    def _claim(self, n: int, lease_for: float) -> None:
        now = self.clock.now
        self._promote()
        expected_reaped = self._reap()
        ready = {m.id: m for m in self.tasks.values() if m.state == "queued"}
        self.events.clear()
        jobs = self.queue.claim(QUEUE, n, lease_for=lease_for)
        assert self._reaped_events() == expected_reaped

        ids = [j.task_id for j in jobs]
        assert len(ids) == min(n, len(ready)), "claim left ready tasks behind"
        assert len(set(ids)) == len(ids), "one claim returned a task twice"
        for task_id in ids:
            m = self.tasks.get(task_id)
            assert m is not None, f"claimed unknown task {task_id}"
            assert m.state != "done", "a done task was claimed again"
            assert task_id in ready, f"claimed {task_id} in state {m.state}"
        left = [m for task_id, m in ready.items() if task_id not in ids]
        for task_id in ids:
            for u in left:
                assert not goes_before(u, ready[task_id]), (
                    f"claimed {ready[task_id]} while {u} should have gone first"
                )
        for a, b in itertools.pairwise(ids):
            assert not goes_before(ready[b], ready[a]), "jobs not returned in pick order"
        if any(
            ready[i].front and not u.front and u.priority == ready[i].priority
            for i in ids
            for u in left
        ):
            event("claim: a front task went ahead of an older one")
        if expected_reaped:
            event("claim: reaped on the way")

        for job in jobs:
            m = self.tasks[job.task_id]
            assert job.attempt == m.attempt + 1, "attempt must grow by one at every claim"
            assert all(job.lease.token != old.token for old in self.leases), "token reused"
            assert job.payload == m.payload
            assert job.checkpoint == m.checkpoint
            assert (job.priority, job.failures, job.reclaims) == (
                m.priority,
                m.failures,
                m.reclaims,
            )
            m.state = "leased"
            m.attempt += 1
            m.token = job.lease.token
            m.deadline = now + MAX_LEASE
            m.progressed_at = now
            m.expires_at = self._expiry(m, lease_for)
            assert job.lease.leased_at == now
            assert job.lease.expires_at == pytest.approx(m.expires_at)
            assert job.lease.expires_at > now
            self.leases.append(job.lease)

    @precondition(lambda self: bool(self._current()))
    @rule(data=st.data(), result=st.sampled_from(RESULTS))
    def complete(self, data: st.DataObject, result: Any) -> None:
        lease = data.draw(st.sampled_from(self._current()))
        self.queue.complete(lease, result)
        m = self.tasks[lease.task_id]
        m.state = "done"
        m.result = result
        m.token = None
        m.expires_at = None

    @precondition(lambda self: bool(self._current()))
    @rule(data=st.data(), fatal=st.booleans())
    def fail(self, data: st.DataObject, fatal: bool) -> None:
        lease = data.draw(st.sampled_from(self._current()))
        m = self.tasks[lease.task_id]
        exc: Exception = Fatal("no point retrying") if fatal else ValueError("flaky")
        retry_in = self.policy.retry_in(m.failures, exc, self.rand)
        if fatal or m.failures + 1 >= self.max_failures:
            assert retry_in is None
        task = self.queue.fail(lease, exc, retry_in=retry_in)
        m.failures += 1
        m.token = None
        m.expires_at = None
        if retry_in is None:
            event("fail: dead-lettered" + (" (fatal)" if fatal else " (max failures)"))
            m.state = "dead"
            m.dead_because = "failed"
        else:
            m.state = "failed"
            m.run_at = self.clock.now + retry_in
        assert (task.state, task.failures, task.attempt) == (m.state, m.failures, m.attempt)
        assert task.error == {"type": type(exc).__qualname__, "message": str(exc)}

    @precondition(lambda self: bool(self._current()))
    @rule(data=st.data(), front=st.booleans())
    def release(self, data: st.DataObject, front: bool) -> None:
        lease = data.draw(st.sampled_from(self._current()))
        self.queue.release(lease, front=front)
        m = self.tasks[lease.task_id]
        m.state = "queued"
        m.token = None
        m.expires_at = None
        if front:
            m.front = True
        else:
            m.front = False
            m.seq = self._next_seq()

    @precondition(lambda self: bool(self._current()))
    @rule(
        data=st.data(),
        value=st.sampled_from([None, 10, {"pct": 50}]),
        checkpoint=st.sampled_from(CHECKPOINTS),
        heartbeat=st.booleans(),
        wait=st.sampled_from([0.0, 0.25, 0.5]),
    )
    def progress(
        self, data: st.DataObject, value: Any, checkpoint: Any, heartbeat: bool, wait: float
    ) -> None:
        """Work a little (if the lease allows), record progress, maybe heartbeat right after."""
        lease = data.draw(st.sampled_from(self._current()))
        m = self.tasks[lease.task_id]
        assert m.expires_at is not None
        if self.clock.now + wait < m.expires_at:
            self.clock.now += wait
        self.queue.progress(lease, value, checkpoint=checkpoint)
        m.progressed_at = self.clock.now
        m.progress = value
        if checkpoint is not None:
            m.checkpoint = checkpoint
        if heartbeat:
            lease_for = max(LEASE_CHOICES)
            m.expires_at = self._expiry(m, lease_for)
            (renewed,) = self.queue.extend([lease], lease_for=lease_for)
            assert renewed is not None
            assert renewed.expires_at == pytest.approx(m.expires_at)
            if self.progress_timeout is not None and self.clock.now > renewed.leased_at:
                event("progress: heartbeat after progress moved the progress deadline")

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data(), lease_for=st.sampled_from(LEASE_CHOICES))
    def extend(self, data: st.DataObject, lease_for: float) -> None:
        leases = data.draw(st.lists(st.sampled_from(self.leases), min_size=1, max_size=4))
        expected: list[float | None] = []
        for lease in leases:
            if self._is_current(lease):
                m = self.tasks[lease.task_id]
                m.expires_at = self._expiry(m, lease_for)
                expected.append(m.expires_at)
            else:
                expected.append(None)
        renewed = self.queue.extend(leases, lease_for=lease_for)
        assert len(renewed) == len(leases)
        for lease, new, want in zip(leases, renewed, expected, strict=True):
            if want is None:
                assert new is None, f"a lease no longer held was renewed: {lease}"
            else:
                assert new is not None, f"a held lease was refused: {lease}"
                assert (new.task_id, new.token, new.attempt) == (
                    lease.task_id,
                    lease.token,
                    lease.attempt,
                )
                assert new.expires_at == pytest.approx(want)
                assert new.expires_at <= self.tasks[lease.task_id].deadline

    # -- zombies --------------------------------------------------------------------------------

    def _write(self, op: str, lease: al.Lease) -> None:
        if op == "complete":
            self.queue.complete(lease, "zombie")
        elif op == "fail":
            self.queue.fail(lease, "zombie", retry_in=0.5)
        elif op == "fail_dead":
            self.queue.fail(lease, "zombie", retry_in=None)
        elif op == "release":
            self.queue.release(lease, front=True)
        else:
            self.queue.progress(lease, "zombie", checkpoint="zombie")

    @precondition(lambda self: bool(self._stale()))
    @rule(
        data=st.data(),
        op=st.sampled_from(["complete", "fail", "fail_dead", "release", "progress"]),
    )
    def stale_write(self, data: st.DataObject, op: str) -> None:
        lease = data.draw(st.sampled_from(self._stale()))
        m = self.tasks[lease.task_id]
        before = self._snapshot()
        with pytest.raises(LeaseLost) as info:
            self._write(op, lease)
        exc = info.value
        newer = "newer" if exc.current_attempt != lease.attempt else "same"
        event(f"stale write: task {m.state}, {newer} attempt")
        assert (exc.task_id, exc.attempt) == (lease.task_id, lease.attempt)
        assert (exc.current_attempt, exc.state) == (m.attempt, m.state)
        assert self._snapshot() == before, f"a stale {op} changed the store"

    # -- time and the reaper --------------------------------------------------------------------

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0, 2.75, 7.0]))
    def advance_clock(self, dt: float) -> None:
        self.clock.now += dt

    @rule()
    def reap(self) -> None:
        expected = self._reap()
        reaped = self.queue.reap(QUEUE)
        assert len(reaped) == len(expected), "a lease was reaped twice, or missed"
        assert {(r.task_id, r.attempt, r.outcome) for r in reaped} == expected
        self.events.clear()

    @precondition(lambda self: any(m.state == "dead" for m in self.tasks.values()))
    @rule(data=st.data(), front=st.booleans(), some=st.booleans())
    def requeue_dead(self, data: st.DataObject, front: bool, some: bool) -> None:
        dead = sorted(m.id for m in self.tasks.values() if m.state == "dead")
        chosen = (
            data.draw(st.lists(st.sampled_from(dead), min_size=1, unique=True)) if some else None
        )
        count = self.queue.requeue_dead(QUEUE, chosen, front=front)
        targets = dead if chosen is None else chosen
        assert count == len(targets)
        back = None if front else self._next_seq()
        for task_id in targets:
            m = self.tasks[task_id]
            m.state = "queued"
            m.reclaims = 0
            m.failures = 0
            m.dead_because = None
            m.front = front
            if back is not None:
                m.seq = back

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def store_matches_model(self) -> None:
        if self.q is None:
            return
        for task_id, m in self.tasks.items():
            t = self.queue.get(task_id)
            assert t.id == task_id
            assert t.queue == QUEUE
            assert (t.state, t.attempt, t.reclaims, t.failures) == (
                m.state,
                m.attempt,
                m.reclaims,
                m.failures,
            ), f"{task_id}: store {t} vs model {m}"
            assert (t.priority, t.payload) == (m.priority, m.payload)
            assert t.checkpoint == m.checkpoint
            assert t.progress == m.progress
            if m.state == "leased":
                assert t.expires_at == pytest.approx(m.expires_at)
            if m.state == "done":
                assert t.result == m.result
            else:
                assert t.result is None
            if m.state == "dead":
                assert t.error is not None, "dead-lettered without a reason"

    @invariant()
    def nothing_lost_and_one_state_each(self) -> None:
        if self.q is None or not self.tasks:
            return
        stats = self.queue.stats(QUEUE)
        counts = {s: n for s, n in stats.counts.items() if n}
        assert counts == dict(Counter(m.state for m in self.tasks.values()))
        assert sum(counts.values()) == len(self.tasks)

    @invariant()
    def one_live_lease_per_task(self) -> None:
        if self.q is None or not self.tasks:
            return
        live = self.queue.inspect(QUEUE, limit=10_000)
        ids = [info.task_id for info in live]
        assert len(ids) == len(set(ids)), "a task is held by two live leases"
        expected = {
            m.id: m.attempt
            for m in self.tasks.values()
            if m.state == "leased" and m.expires_at is not None and self.clock.now < m.expires_at
        }
        assert {info.task_id: info.attempt for info in live} == expected
        current = Counter(lease.task_id for lease in self._current())
        assert all(n == 1 for n in current.values())
        assert len({lease.token for lease in self.leases}) == len(self.leases)

    @invariant()
    def dead_only_for_a_reason(self) -> None:
        if self.q is None or not self.tasks:
            return
        dead = {m.id: m for m in self.tasks.values() if m.state == "dead"}
        assert {t.id for t in self.queue.dead(QUEUE, limit=10_000)} == set(dead)
        for m in dead.values():
            if m.dead_because == "reclaims":
                assert m.reclaims == self.max_reclaims + 1
            else:
                assert m.dead_because == "failed"
                assert m.failures >= 1


QueueMachine.TestCase.settings = settings(
    max_examples=2_000 if DEEP else 200,
    stateful_step_count=80 if DEEP else 40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestQueueStateMachine = QueueMachine.TestCase
