"""Chaos: real worker processes on SQLite, Redis and PostgreSQL under a seeded schedule of faults.

Each run starts a private store (a SQLite file; a private ``redis-server`` with ``appendonly yes``
and ``appendfsync always``; a private PostgreSQL) with a loopback TCP proxy in front of the
servers, feeds it tasks while three worker processes (tests/faults/_chaos_child.py, ``Worker``
or ``AsyncWorker``) run them, and drives faults: a worker SIGKILLed (and replaced), a worker
SIGSTOPped past its lease then SIGCONTed, the store restarted, every connection cut, the network
stalled past the lease then resumed. Then the workers drain the queue and are stopped with
SIGTERM, and the run fails on

- a task lost (not ``done`` at the end) or left in another state,
- an accepted completion that is not unique (two accepted for one task, or a stored result that
  no single handler run of the stored attempt produced),
- a worker that exited by itself, or did not exit with status 0 on SIGTERM,
- any traceback in a worker's stderr (an exception that escaped, untyped or not).

Duplicate *executions* are allowed (a frozen zombie may run on after its lease was reaped);
duplicate *accepted completions* are not.

Two seeds per backend by default, one per face (even seeds sync, odd seeds async), each run 10
to 20 seconds (about a minute and a half for the six default runs on two cores);
``AGENTLEASE_DEEP=1`` runs 50 seeds per backend (marked ``deep`` past the second). A failure
prints the seed, the schedule as it happened and the command that runs it again
(``AGENTLEASE_CHAOS_SEED=<seed> python -m pytest tests/faults/test_chaos.py -k <backend>``).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

import pytest

import agentlease as al
from agentlease.errors import AgentLeaseError, BackendUnavailable
from tests import _private_postgres
from tests._private_redis import CannotStart, PrivateRedis
from tests._proxy import Proxy
from tests.conftest import BACKENDS as SELECTED
from tests.conftest import unavailable

# Many real processes (SIGKILL, SIGSTOP) on short leases: the "processes" group runs one test at
# a time on one xdist worker, so they starve neither each other nor the servers' connections.
pytestmark = pytest.mark.xdist_group("processes")

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("_chaos_child.py")
DEEP = os.environ.get("AGENTLEASE_DEEP") == "1"
_PINNED = os.environ.get("AGENTLEASE_CHAOS_SEED")
SEEDS = [int(_PINNED)] if _PINNED else list(range(50 if DEEP else 2))
BACKENDS = [b for b in ("sqlite", "redis", "postgres") if b in SELECTED]  # see conftest
FACES = ["sync", "async"]

LEASE = 2.0  # seconds: each lease (heartbeats every third of it)
HOLD = 1.4 * LEASE  # how long a freeze or a stall lasts: longer than a lease
WORKERS = 3
TASKS = 60
FEED_FOR = 9.0  # seconds over which the tasks are enqueued: work runs through the faults
DRAIN = 90.0  # seconds the workers get to finish everything after the last fault
QUEUE = "chaos"

T = TypeVar("T")

FAULTS = {
    "sqlite": ["kill", "freeze"],
    "redis": ["kill", "freeze", "restart", "cut", "stall"],
    "postgres": ["kill", "freeze", "restart", "cut", "stall"],
}


def face_of(seed: int) -> str:
    return FACES[seed % 2]


def params() -> list[object]:
    return [
        pytest.param(
            backend,
            seed,
            id=f"{backend}-seed{seed}-{face_of(seed)}",
            marks=[pytest.mark.deep] if seed >= 2 else [],
        )
        for backend in BACKENDS
        for seed in SEEDS
    ]


# -- the schedule -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One fault: what, on which worker slot (kill, freeze), and the pause before it."""

    kind: str
    slot: int
    pause: float
    down_for: float = 0.0  # restart: how long the store stays down


def schedule(backend: str, seed: int) -> list[Fault]:
    """Every fault kind of the backend once (SQLite: twice), in a seeded order and rhythm."""
    rand = random.Random(f"{backend}-{seed}")
    kinds = FAULTS[backend] * (2 if backend == "sqlite" else 1)
    kinds += [rand.choice(FAULTS[backend])]
    rand.shuffle(kinds)
    return [
        Fault(
            kind=kind,
            slot=rand.randrange(WORKERS),
            pause=rand.uniform(0.4, 1.2),
            down_for=rand.uniform(0.2, 1.0) if kind == "restart" else 0.0,
        )
        for kind in kinds
    ]


# -- stores --------------------------------------------------------------------------------------


@dataclass
class Target:
    """The store of one run: the workers' URL (through the proxy), the driver's (direct), and
    how to restart it."""

    worker_url: str
    direct_url: str
    restart: Callable[[float], None] | None = None
    proxy: Proxy | None = None


@pytest.fixture(scope="module")
def postgres_server() -> Iterator[_private_postgres.PrivatePostgres]:
    """One private PostgreSQL for the module (each run has its own schema)."""
    try:
        pg = _private_postgres.start()
    except _private_postgres.CannotStart as exc:
        unavailable("private postgres", str(exc))
    try:
        yield pg
    finally:
        pg.stop()


@contextlib.contextmanager
def open_target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Target]:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'chaos.db'}"
        yield Target(url, url)
        return
    if backend == "redis":
        try:
            server = PrivateRedis(
                tmp_path / "redis", options={"appendonly": "yes", "appendfsync": "always"}
            ).start()
        except CannotStart as exc:
            unavailable("private redis-server", exc.reason)

        def restart_redis(down_for: float) -> None:
            server.kill()  # SIGKILL: what was acknowledged is in the append-only file
            time.sleep(down_for)
            server.start()

        proxy = Proxy("127.0.0.1", server.port)
        options = "prefix=chaos&connect_timeout=1&socket_timeout=1"
        try:
            yield Target(
                f"redis://127.0.0.1:{proxy.port}/0?{options}",
                f"{server.url}?{options}",
                restart_redis,
                proxy,
            )
        finally:
            proxy.close()
            server.stop()
        return
    pg: _private_postgres.PrivatePostgres = request.getfixturevalue("postgres_server")
    if not pg._running:
        pg.start()
    schema = f"chaos_{uuid.uuid4().hex[:10]}"
    proxy = Proxy("127.0.0.1", pg.port)

    def restart_postgres(down_for: float) -> None:
        pg.restart(down_for=down_for, mode="fast")

    options = f"schema={schema}&connect_timeout=2&pool_timeout=2"
    try:
        yield Target(
            f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres?{options}",
            pg.url(schema=schema, connect_timeout="2", pool_timeout="2"),
            restart_postgres,
            proxy,
        )
    finally:
        proxy.close()
        if not pg._running:
            pg.start()
        with contextlib.suppress(Exception):
            pg.sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


# -- worker processes ----------------------------------------------------------------------------


@dataclass
class Child:
    """One worker process and what it leaves behind."""

    name: str
    process: subprocess.Popen[bytes]
    stderr: Path
    ledger: Path
    killed: bool = False  # by the schedule (SIGKILL): its exit is expected


@dataclass
class Run:
    backend: str
    seed: int
    face: str
    directory: Path
    target: Target
    started: float = field(default_factory=time.monotonic)
    children: list[Child] = field(default_factory=list)
    slots: list[Child] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    files: list[IO[bytes]] = field(default_factory=list)
    untyped: Counter[str] = field(default_factory=Counter)  # from the driver's own calls

    def note(self, what: str) -> None:
        self.log.append(f"{time.monotonic() - self.started:7.2f}s  {what}")

    def spawn(self) -> Child:
        k = len(self.children)
        err = self.directory / f"w{k}.err"
        ledger = self.directory / f"w{k}.ledger"
        out = err.open("wb")
        self.files.append(out)
        process = subprocess.Popen(
            [
                sys.executable,
                str(CHILD),
                self.target.worker_url,
                QUEUE,
                self.face,
                str(ledger),
                repr(LEASE),
                str(self.seed * 100 + k),
            ],
            cwd=ROOT,
            stdout=out,  # files, not pipes: a chatty worker never blocks on a full pipe
            stderr=out,
        )
        child = Child(f"w{k}", process, err, ledger)
        self.children.append(child)
        self.note(f"started {child.name} (pid {process.pid})")
        return child

    def wait_ready(self, children: list[Child], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for child in children:
            while not (child.ledger.exists() and b" ready" in child.ledger.read_bytes()):
                self.check_alive()
                if time.monotonic() > deadline:
                    raise RunAborted(f"{child.name} was not connected within {timeout:.0f}s")
                time.sleep(0.05)

    def check_alive(self) -> None:
        for child in self.children:
            if not child.killed and child.process.poll() is not None:
                raise WorkerExited(child)

    def close(self) -> None:
        for child in self.children:
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGCONT)
                    child.process.kill()
                child.process.wait(timeout=30)
        for f in self.files:
            f.close()


class RunAborted(Exception):
    """The run cannot go on (its message says why)."""


class WorkerExited(RunAborted):
    def __init__(self, child: Child) -> None:
        super().__init__(f"{child.name} exited by itself with status {child.process.returncode}")
        self.child = child


# -- driving -------------------------------------------------------------------------------------


def retry_store(call: Callable[[], T], untyped: Counter[str], timeout: float = 60.0) -> T:
    """Call the store from the driver until it answers (it may be restarting).

    An exception from outside agentlease's tree is a finding too: it is counted in ``untyped``
    and the call is tried again, so that the run still gets to its checks.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except BackendUnavailable:
            if time.monotonic() > deadline:
                raise
        except AgentLeaseError:
            raise
        except Exception as exc:
            untyped[f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"] += 1
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def feed(run: Run, client: al.Queue, stop: threading.Event, errors: list[BaseException]) -> None:
    """Enqueue the tasks over FEED_FOR seconds, with ids, so a retried enqueue is harmless."""
    rand = random.Random(f"work-{run.seed}")
    try:
        for i in range(TASKS):
            if stop.is_set():
                return
            spec = al.TaskSpec(payload={"work": round(rand.uniform(0.3, 0.9), 3)}, id=f"t{i:03d}")
            retry_store(lambda spec=spec: client.enqueue_many(QUEUE, [spec]), run.untyped)
            stop.wait(FEED_FOR / TASKS)
    except BaseException as exc:
        errors.append(exc)


def apply(run: Run, fault: Fault) -> None:
    target = run.target
    if fault.kind == "kill":
        child = run.slots[fault.slot]
        child.killed = True
        child.process.send_signal(signal.SIGKILL)
        child.process.wait(timeout=30)
        run.note(f"SIGKILL {child.name}")
        run.slots[fault.slot] = run.spawn()
        run.wait_ready([run.slots[fault.slot]])  # connected before the next fault
    elif fault.kind == "freeze":
        child = run.slots[fault.slot]
        child.process.send_signal(signal.SIGSTOP)
        run.note(f"SIGSTOP {child.name} for {HOLD:.1f}s")
        time.sleep(HOLD)
        child.process.send_signal(signal.SIGCONT)
        run.note(f"SIGCONT {child.name}")
    elif fault.kind == "restart":
        assert target.restart is not None
        run.note(f"store down for {fault.down_for:.2f}s")
        target.restart(fault.down_for)
        run.note("store up again")
    elif fault.kind == "cut":
        assert target.proxy is not None
        closed = target.proxy.cut(reset=fault.slot % 2 == 0)
        run.note(f"proxy cut {closed} connections")
    elif fault.kind == "stall":
        assert target.proxy is not None
        target.proxy.stall()
        run.note(f"proxy stalled for {HOLD:.1f}s")
        time.sleep(HOLD)
        target.proxy.resume()
        run.note("proxy resumed")
    else:  # pragma: no cover
        raise AssertionError(fault.kind)


def wait_drained(run: Run, client: al.Queue) -> dict[str, int]:
    deadline = time.monotonic() + DRAIN
    counts: dict[str, int] = {}
    while True:
        run.check_alive()
        left = deadline - time.monotonic()
        try:
            stats = retry_store(lambda: client.stats(QUEUE), run.untyped, timeout=max(0, left))
        except Exception as exc:  # the store did not answer in time (untyped errors are counted)
            run.note(f"stats failed: {exc!r}")
            return counts
        counts = {state: n for state, n in stats.counts.items() if n}
        if counts == {"done": TASKS} or time.monotonic() > deadline:
            return counts
        time.sleep(0.1)


def stop_workers(run: Run) -> list[str]:
    """SIGTERM every live worker; each must exit with status 0 in time."""
    problems = []
    live = [c for c in run.children if c.process.poll() is None]
    for child in live:
        child.process.send_signal(signal.SIGCONT)
        child.process.send_signal(signal.SIGTERM)
    run.note(f"SIGTERM {', '.join(c.name for c in live)}")
    deadline = time.monotonic() + 30  # the grace period is 3s
    for child in live:
        try:
            code = child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait(timeout=30)
            problems.append(f"{child.name} did not exit within 30s of SIGTERM")
            continue
        if code != 0:
            problems.append(f"{child.name} exited with status {code} on SIGTERM")
    return problems


# -- checking ------------------------------------------------------------------------------------


def read_ledger(run: Run) -> list[tuple[str, int, int, str]]:
    rows = []
    for child in run.children:
        if not child.ledger.exists():
            continue
        for line in child.ledger.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4:  # a torn last line of a killed worker is skipped
                rows.append((parts[0], int(parts[1]), int(parts[2]), parts[3]))
    return rows


def check_tasks(
    run: Run, client: al.Queue, rows: list[tuple[str, int, int, str]], *, finished: bool
) -> list[str]:
    """Each task done once, its result from one run of its last attempt, accepted once.

    ``finished``: the run got to its end (otherwise tasks not done yet are not called lost).
    """
    problems = []
    not_done: dict[str, str] = {}
    checks_end = time.monotonic() + 60
    ends: Counter[tuple[str, int]] = Counter()
    end_pid: dict[tuple[str, int], int] = {}
    accepted: defaultdict[str, list[tuple[int, int]]] = defaultdict(list)
    started: defaultdict[str, set[int]] = defaultdict(set)
    for task, attempt, pid, kind in rows:
        if kind == "end":
            ends[task, attempt] += 1
            end_pid[task, attempt] = pid
        elif kind == "accepted":
            accepted[task].append((attempt, pid))
        elif kind == "start":
            started[task].add(attempt)
    for (task, attempt), n in ends.items():
        if n > 1:
            problems.append(f"{task}: attempt {attempt} ran to its end {n} times")
    for i in range(TASKS):
        task_id = f"t{i:03d}"
        try:
            left = max(0.0, checks_end - time.monotonic())
            task = retry_store(lambda task_id=task_id: client.get(task_id), run.untyped, left)
        except BackendUnavailable as exc:
            problems.append(f"the store did not answer the final checks: {exc}")
            break
        except al.UnknownTask:
            not_done[task_id] = f"{task_id}: unknown to the store"  # or not fed yet
            continue
        if task.state != "done":
            not_done[task_id] = (
                f"{task_id}: state {task.state!r} (attempt {task.attempt}, reclaims "
                f"{task.reclaims}, failures {task.failures}, error {task.error!r})"
            )
            continue
        result = task.result
        expected_pid = end_pid.get((task_id, task.attempt))
        if expected_pid is None:
            problems.append(
                f"{task_id}: done with result {result!r} at attempt {task.attempt}, but no "
                f"handler run of that attempt ended (ledger attempts: {sorted(started[task_id])})"
            )
        elif result != {"pid": expected_pid, "attempt": task.attempt}:
            problems.append(
                f"{task_id}: stored result {result!r} at attempt {task.attempt} is not what "
                f"that attempt's run (pid {expected_pid}) returned"
            )
        acks = accepted[task_id]
        if len(acks) > 1:
            problems.append(f"{task_id}: completion accepted {len(acks)} times: {acks}")
        for attempt, pid in acks:
            if attempt != task.attempt:
                problems.append(
                    f"{task_id}: pid {pid} saw its completion of attempt {attempt} accepted, "
                    f"but the store holds attempt {task.attempt}'s"
                )
        later = [a for a in started[task_id] if a > task.attempt]
        if later:
            problems.append(f"{task_id}: attempts {later} ran after attempt {task.attempt} won")
    if not_done and finished:
        shown = list(not_done.values())
        problems.append(
            f"{len(not_done)} task(s) lost (not done after the drain): "
            + "; ".join(shown[:5])
            + (f"; ... and {len(shown) - 5} more" if shown[5:] else "")
        )
    elif not_done:
        problems.append(f"the run stopped early: {len(not_done)} task(s) not done yet")
    return problems


EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:: .*)?$")  # "redis.exceptions.X: message"
_CHAIN = ("Traceback", "The above exception", "During handling", "CHAOS-UNCAUGHT")


def tracebacks(lines: list[str]) -> list[tuple[int, int]]:
    """The (first, last) line numbers of each traceback, chained causes included."""
    found = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith(_CHAIN):
            i += 1
            continue
        end = i
        while end + 1 < len(lines) and (
            not lines[end + 1].strip()
            or lines[end + 1].startswith((" ", *_CHAIN))
            or (EXCEPTION_LINE.match(lines[end + 1]) and lines[end].strip() != "")
        ):
            end += 1
        found.append((i, end))
        i = end + 1
    return found


def is_exception(lines: list[str], i: int) -> bool:
    return bool(EXCEPTION_LINE.match(lines[i])) and not lines[i].startswith(_CHAIN)


def excerpt(lines: list[str], start: int, end: int) -> list[str]:
    """One traceback, shortened: the log lines before it, its frames in agentlease, and for
    each exception of the chain the frame that raised it and the exception."""
    keep = set(range(max(0, start - 2), start + 1))
    for i in range(start, end + 1):
        line = lines[i]
        if line.startswith(_CHAIN):
            keep.add(i)
        elif is_exception(lines, i):
            frame = [k for k in range(i - 3, i) if lines[k].lstrip().startswith('File "')]
            keep |= set(range(frame[-1] if frame else i, i + 1))
        elif line.lstrip().startswith('File "') and "/agentlease/" in line:
            keep |= {i, i + 1}
    shown: list[str] = []
    for i in sorted(k for k in keep if 0 <= k <= end):
        if lines[i].lstrip().startswith(("^", "~")):
            continue  # the carets under a line of code
        if shown and i - 1 not in keep:
            shown.append("  ...")
        shown.append(lines[i])
    return shown


def check_stderr(run: Run) -> list[str]:
    """Any traceback or escaped exception in a worker's stderr, with its exception lines."""
    problems = []
    for child in run.children:
        lines = child.stderr.read_text(errors="replace").splitlines()
        found = tracebacks(lines)
        if not found:
            continue
        causes = sorted(
            {lines[i] for a, b in found for i in range(a, b + 1) if is_exception(lines, i)}
            | {line for line in lines if line.startswith("CHAOS-UNCAUGHT")}
        )
        first = "\n      ".join(excerpt(lines, *found[0]))
        problems.append(
            f"{child.name}{' (killed)' if child.killed else ''}: {len(found)} traceback(s) in "
            f"stderr: {causes}\n    the first:\n      {first}"
        )
    return problems


# -- the test ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)  # the run bounds itself well below this; a hang still ends
@pytest.mark.parametrize(("backend", "seed"), params())
def test_chaos(backend: str, seed: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    face = face_of(seed)
    faults = schedule(backend, seed)
    with open_target(backend, tmp_path, request) as target:
        client = al.Queue.connect(target.direct_url)
        run = Run(backend, seed, face, tmp_path, target)
        problems: list[str] = []
        finished = False
        stop_feed = threading.Event()
        feed_errors: list[BaseException] = []
        feeder = threading.Thread(target=feed, args=(run, client, stop_feed, feed_errors))
        try:
            retry_store(client.queues, run.untyped)  # the schema is there before the workers
            run.slots = [run.spawn() for _ in range(WORKERS)]
            run.wait_ready(run.slots)
            run.note("workers ready; feeding tasks")
            feeder.start()
            for fault in faults:
                time.sleep(fault.pause)
                run.check_alive()
                apply(run, fault)
            run.wait_ready(run.slots)
            feeder.join(timeout=FEED_FOR + 120)
            if feed_errors:
                problems.append(f"feeding failed: {feed_errors[0]!r}")
            run.note("faults over; draining")
            counts = wait_drained(run, client)
            run.note(f"drained: {counts}")
            if counts != {"done": TASKS}:
                problems.append(f"not drained within {DRAIN:.0f}s: {counts}")
            problems += stop_workers(run)
            finished = True
        except RunAborted as exc:
            run.note(str(exc))
            problems.append(str(exc))
        except Exception as exc:  # the driver itself (a store that would not restart, ...)
            run.note(f"the driver failed: {exc!r}")
            problems.append(f"the driver failed: {exc!r}")
        finally:
            stop_feed.set()
            if feeder.is_alive():
                feeder.join(timeout=120)
            run.close()
        problems += check_stderr(run)
        problems += check_tasks(run, client, read_ledger(run), finished=finished)
        problems += [
            f"the driver's own client got an untyped exception {n} time(s): {what}"
            for what, n in run.untyped.items()
        ]
        client.close()
    rows = read_ledger(run)
    runs = sum(1 for r in rows if r[3] == "start")
    print(f"{runs} handler runs for {TASKS} tasks", *run.log, sep="\n")
    if problems:
        header = (
            f"chaos {backend} seed {seed} ({face} workers): {len(problems)} problem(s); "
            f"{runs} handler runs for {TASKS} tasks\n"
            f"again: AGENTLEASE_CHAOS_SEED={seed} python -m pytest "
            f"{Path(__file__).relative_to(ROOT)} "
            f"-k {backend}\n"
        )
        shown = problems[:15] + ([f"... and {len(problems) - 15} more"] if problems[15:] else [])
        pytest.fail(
            header
            + "problems:\n  "
            + "\n  ".join(shown)
            + "\nschedule as it happened:\n  "
            + "\n  ".join(run.log),
            pytrace=False,
        )
