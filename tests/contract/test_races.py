"""Races at the edge of a lease, on every backend of the ``store`` fixture.

Each test drives real threads (and, on SQLite, real processes) against a real clock, so what it
checks is the store's atomicity, not a schedule the test imposes. Times taken from the store
(``leased_at``, ``expires_at``) are never compared with this process's clock; the moment a lease
runs out is estimated from the local clock around the claim, and the writes are spread on both
sides of it so that each round lands some before and some after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest

import agentlease as al
from agentlease import LeaseLost

LIVE = 30.0
SHORT = 0.3
PAST = 0.5


def _sleep_until(moment: float) -> None:
    delay = moment - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _run_threads(targets: list[Callable[[], None]]) -> list[BaseException]:
    """Run each target on its own thread; the exceptions they raised."""
    errors: list[BaseException] = []

    def guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # reported by the test, never swallowed
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(fn,)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a racing thread hung"
    return errors


# -- a holder write against the reaper, right at the expiry instant -------------------------------


class _Round:
    """One round: claim ``per_round`` leases, then write to each around its expiry while two
    reapers reap from just before the expiry until well after it."""

    SPREAD = 0.04  # writes land from SPREAD before the expiry to SPREAD after it

    def __init__(self, write: str, queue: str, writers, reapers, lease_for: float) -> None:
        self.write = write
        self.queue = queue
        self.writers = writers
        self.reapers = reapers
        holder = writers[0]
        holder.enqueue_many(queue, [{"i": i} for i in range(len(writers))])
        before = time.monotonic()
        self.jobs = holder.claim(queue, len(writers), lease_for=lease_for)
        after = time.monotonic()
        assert len(self.jobs) == len(writers)
        self.expiry = (before + after) / 2 + lease_for  # on this machine's clock
        self.reaped: list[al.Reaped] = []
        self.accepted: set[str] = set()
        self.refused: dict[str, LeaseLost] = {}
        self.renewed: dict[str, al.Lease | None] = {}

    def writer(self, i: int) -> None:
        job = self.jobs[i]
        offset = -self.SPREAD + 2 * self.SPREAD * i / (len(self.jobs) - 1)
        _sleep_until(self.expiry + offset)
        client = self.writers[i]
        if self.write == "complete":
            try:
                client.complete(job.lease, {"i": i})
            except LeaseLost as exc:
                self.refused[job.task_id] = exc
            else:
                self.accepted.add(job.task_id)
        else:
            (self.renewed[job.task_id],) = client.extend([job.lease], lease_for=LIVE)

    def reaper(self, k: int) -> None:
        _sleep_until(self.expiry - self.SPREAD - 0.01)
        while time.monotonic() < self.expiry + self.SPREAD + 0.15:
            self.reaped.extend(self.reapers[k].reap(self.queue))
            time.sleep(0.0005)

    def run(self) -> None:
        targets: list[Callable[[], None]] = [
            lambda i=i: self.writer(i) for i in range(len(self.jobs))
        ]
        targets += [lambda k=k: self.reaper(k) for k in range(len(self.reapers))]
        assert _run_threads(targets) == []
        # Anything still leased and expired is reaped now, so "neither" cannot hide.
        self.reaped.extend(self.reapers[0].reap(self.queue))


@pytest.mark.parametrize("write", ["complete", "extend"])
def test_holder_write_races_reaper_at_expiry(store, write):
    """Exactly one of: the write was accepted (and the reaper left the task alone), or the
    reaper requeued the task (and the write was refused). Never both, never neither."""
    rounds, per_round, lease_for = 5, 16, 0.15
    writers = [store.queue() for _ in range(per_round)]
    reapers = [store.queue() for _ in range(2)]
    outcomes: Counter[str] = Counter()

    for r in range(rounds):
        rnd = _Round(write, f"race-{write}-{r}", writers, reapers, lease_for)
        rnd.run()
        times_reaped = Counter(x.task_id for x in rnd.reaped)
        assert all(x.outcome == "requeued" for x in rnd.reaped)
        for i, job in enumerate(rnd.jobs):
            task = reapers[0].get(job.task_id)
            n = times_reaped[job.task_id]
            assert n <= 1, f"{job.task_id} reaped {n} times"
            if write == "complete":
                ok = job.task_id in rnd.accepted
                assert ok != (job.task_id in rnd.refused)
            else:
                ok = rnd.renewed[job.task_id] is not None
            if ok:
                assert n == 0, f"round {r}: {write} accepted AND the task was reaped"
                assert task.reclaims == 0
                if write == "complete":
                    assert (task.state, task.result) == ("done", {"i": i})
                else:
                    renewed = rnd.renewed[job.task_id]
                    assert renewed is not None
                    assert task.state == "leased"
                    assert task.expires_at == pytest.approx(renewed.expires_at, abs=1e-3)
                outcomes["accepted"] += 1
            else:
                assert n == 1, f"round {r}: {write} refused and the task was NOT reaped"
                assert (task.state, task.reclaims, task.attempt) == ("queued", 1, 1)
                assert task.result is None
                if write == "complete":
                    exc = rnd.refused[job.task_id]
                    assert (exc.task_id, exc.attempt, exc.current_attempt) == (job.task_id, 1, 1)
                outcomes["reaped"] += 1

    # Both sides of the race were really exercised.
    assert outcomes["accepted"] > 0, outcomes
    assert outcomes["reaped"] > 0, outcomes


def test_heartbeat_after_reap_changes_nothing(store):
    q = store.queue()
    heartbeat = store.queue()
    task_id = q.enqueue("hb", "x").task_id
    (old,) = q.claim("hb", lease_for=SHORT)
    time.sleep(PAST)
    assert [r.task_id for r in q.reap("hb")] == [task_id]
    before = q.get(task_id)
    assert heartbeat.extend([old.lease], lease_for=LIVE) == [None]
    assert q.get(task_id) == before
    assert before.state == "queued"

    (new,) = q.claim("hb", lease_for=LIVE)
    before = q.get(task_id)
    assert heartbeat.extend([old.lease], lease_for=LIVE) == [None]
    assert q.get(task_id) == before
    assert q.get(task_id).expires_at == pytest.approx(new.lease.expires_at, abs=1e-3)


# -- many reapers at once ------------------------------------------------------------------------


def _check_reaped_once(
    q: al.Queue, queue: str, ids: list[str], reaped: list[str], claimed: list[str]
) -> None:
    times = Counter(reaped)
    assert set(times) == set(ids), (
        f"{len(set(ids) - set(times))} expired leases were never reaped; "
        f"{len(set(times) - set(ids))} unknown ids were"
    )
    doubles = {t: n for t, n in times.items() if n != 1}
    assert doubles == {}, f"reaped more than once: {doubles}"
    assert len(claimed) == len(set(claimed)), "a task was claimed twice"
    assert set(claimed) <= set(ids)
    for task_id in ids:
        task = q.get(task_id)
        assert task.reclaims == 1, f"{task_id}: reclaims {task.reclaims}"
        if task_id in claimed:
            assert (task.state, task.attempt) == ("leased", 2)
        else:
            assert (task.state, task.attempt) == ("queued", 1)
    stats = q.stats(queue)
    assert stats.counts.get("leased", 0) == len(claimed)
    assert stats.counts.get("queued", 0) == len(ids) - len(claimed)
    assert sum(stats.counts.values()) == len(ids), "a task was lost"


def _fill_with_expiring_leases(
    q: al.Queue, queue: str, total: int, *, first: float, last: float, groups: int = 15
) -> list[str]:
    """Enqueue ``total`` tasks and lease them all, in groups whose leases run out at moments
    spread from ``first`` to ``last`` seconds from now: the reapers then meet expiries all
    through the time they run, instead of one reaper taking everything in its first step."""
    ids = [e.task_id for e in q.enqueue_many(queue, [{"i": i} for i in range(total)])]
    start = time.monotonic()
    leased: list[str] = []
    per_group = -(-total // groups)
    for g in range(groups):
        lease_for = first + (last - first) * g / (groups - 1) - (time.monotonic() - start)
        leased += [j.task_id for j in q.claim(queue, per_group, lease_for=lease_for)]
    assert sorted(leased) == sorted(ids)
    return ids


def test_many_reapers_at_once_reap_each_lease_once(store):
    queue, total, threads = "crowd", 150, 8
    events: list[al.Event] = []  # list.append is atomic
    final = store.queue(on_event=events.append)
    ids = _fill_with_expiring_leases(final, queue, total, first=0.25, last=0.55)
    returned: list[str] = []
    claimed: list[str] = []
    clients = [store.queue(on_event=events.append) for _ in range(threads)]
    barrier = threading.Barrier(threads)

    def run(k: int) -> None:
        client = clients[k]
        barrier.wait()
        stop = time.monotonic() + 0.5
        calls = mine = 0
        while time.monotonic() < stop:
            if (k + calls) % 2 or mine >= 5:  # claim some, leave the rest queued
                returned.extend(r.task_id for r in client.reap(queue))
            else:
                jobs = client.claim(queue, 1, lease_for=LIVE)
                mine += len(jobs)
                claimed.extend(j.task_id for j in jobs)
            calls += 1
            time.sleep(0.001)

    time.sleep(0.15)
    assert _run_threads([lambda k=k: run(k) for k in range(threads)]) == []
    time.sleep(0.1)
    returned.extend(r.task_id for r in final.reap(queue))  # any lease that outlived the crowd
    reaped = [e.task_id for e in events if e.name == "reaped"]
    assert set(returned) <= set(reaped)
    assert all(e.fields.get("outcome") == "requeued" for e in events if e.name == "reaped")
    _check_reaped_once(final, queue, ids, reaped, claimed)


def test_concurrent_claims_never_share_a_task(store):
    queue, total, threads = "share", 120, 8
    q = store.queue()
    q.enqueue_many(queue, list(range(total)))
    clients = [store.queue() for _ in range(threads)]
    claimed: list[list[al.Job]] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads)

    def run(k: int) -> None:
        barrier.wait()
        while jobs := clients[k].claim(queue, 2, lease_for=LIVE):
            claimed[k].extend(jobs)

    assert _run_threads([lambda k=k: run(k) for k in range(threads)]) == []
    jobs = [j for batch in claimed for j in batch]
    assert len(jobs) == total
    assert sorted(j.payload for j in jobs) == list(range(total))
    assert len({j.task_id for j in jobs}) == total
    assert len({j.lease.token for j in jobs}) == total
    assert q.stats(queue).counts.get("leased") == total


# -- many reaper processes on one SQLite file ----------------------------------------------------

_PROCESS = textwrap.dedent(
    """
    import json, sys, time
    import agentlease as al

    url, queue, start_at, role = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    events = []
    q = al.Queue.connect(url, on_event=events.append)
    time.sleep(max(0.0, start_at - time.time()))
    claimed, returned = [], []
    stop = time.time() + 0.6
    calls = 0
    while time.time() < stop:
        if role == "reap" or calls % 2 or len(claimed) >= 10:
            returned.extend(r.task_id for r in q.reap(queue))
        else:
            claimed.extend(j.task_id for j in q.claim(queue, 1, lease_for=30.0))
        calls += 1
        time.sleep(0.001)
    q.close()
    reaped = [e.task_id for e in events if e.name == "reaped"]
    json.dump({"reaped": reaped, "returned": returned, "claimed": claimed}, sys.stdout)
    """
)


@pytest.mark.slow
def test_many_reaper_processes_on_sqlite(sqlite_url):
    queue, total, procs = "procs", 150, 6
    q = al.Queue.connect(sqlite_url)
    try:
        start_at = time.time() + 1.5  # every child imported and waiting by then
        # The leases run out while the children run, from 0.1 s to 0.45 s after they start.
        ids = _fill_with_expiring_leases(q, queue, total, first=1.6, last=1.95)
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _PROCESS,
                    sqlite_url,
                    queue,
                    repr(start_at),
                    "reap" if k % 2 else "claim",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for k in range(procs)
        ]
        reaped: list[str] = []
        returned: list[str] = []
        claimed: list[str] = []
        for child in children:
            out, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
            report = json.loads(out)
            reaped += report["reaped"]
            returned += report["returned"]
            claimed += report["claimed"]
        reaped += [r.task_id for r in q.reap(queue)]  # any lease that outlived the children
        assert set(returned) <= set(reaped)
        _check_reaped_once(q, queue, ids, reaped, claimed)
    finally:
        q.close()
