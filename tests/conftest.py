"""Shared fixtures: the stores every contract test runs against.

``store`` is parametrised over every backend. Backends that need a server are skipped when the
server is unreachable, unless AGENTLEASE_REQUIRE_SERVICES=1, which turns that skip into a failure
(CI sets it). Each test gets a fresh namespace on a shared server and drops it afterwards.

The suite runs on pytest-xdist workers (pyproject.toml's addopts: ``-n 3 --dist loadgroup``):
session fixtures (the private Redis Cluster) start once per worker, on free ports in temporary
directories of their own.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import agentlease as al
from agentlease.backends.memory import MemoryBackend
from tests import _services

if TYPE_CHECKING:
    from tests._private_redis import PrivateRedis

REQUIRE_SERVICES = os.environ.get("AGENTLEASE_REQUIRE_SERVICES") == "1"
EMBEDDED = ["memory", "sqlite"]
# Narrow a run with AGENTLEASE_TEST_BACKENDS=memory,sqlite (default: every backend). When
# services are required, every backend runs whatever the variable says: nothing is left out.
ALL_BACKENDS = [*EMBEDDED, "redis", "redis-cluster", "postgres"]
_NARROWED = os.environ.get("AGENTLEASE_TEST_BACKENDS", ",".join(ALL_BACKENDS)).split(",")
BACKENDS = ALL_BACKENDS if REQUIRE_SERVICES else [b for b in ALL_BACKENDS if b in _NARROWED]


def require(module: str, extra: str) -> Any:
    """The module a test needs, imported; when it is missing, the test module is skipped, or,
    when services are required (CI installs every extra), failed: a missing extra never passes
    for a skip there."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        message = f"{module} is not installed ({extra}): {exc}"
        if REQUIRE_SERVICES:
            pytest.fail(message + " (AGENTLEASE_REQUIRE_SERVICES=1)", pytrace=False)
        pytest.skip(message, allow_module_level=True)


def unavailable(service: str, reason: str) -> None:
    """Skip (or, when services are required, fail) a test whose service cannot be reached."""
    message = f"{service} unavailable: {reason}"
    if REQUIRE_SERVICES:
        pytest.fail(message + " (AGENTLEASE_REQUIRE_SERVICES=1)")
    pytest.skip(message)


@dataclass
class Store:
    """One store under test; opens any number of clients (both faces) on it."""

    kind: str
    url: str
    _memory: MemoryBackend | None = None
    _opened: list[object] = field(default_factory=list)

    def backend(self) -> al.Backend:
        if self._memory is not None:
            return self._memory
        return al.connect(self.url)

    def queue(self, settings: al.QueueSettings | None = None, **kw: object) -> al.Queue:
        q = al.Queue(self.backend(), settings=settings, **kw)  # type: ignore[arg-type]
        self._opened.append(q)
        return q

    def aqueue(self, settings: al.QueueSettings | None = None, **kw: object) -> al.AsyncQueue:
        backend = al.connect_async(self.url) if self._memory is None else self._memory.open_async()
        return al.AsyncQueue(backend, settings=settings, **kw)  # type: ignore[arg-type]

    def close(self) -> None:
        for q in self._opened:
            q.close()  # type: ignore[attr-defined]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Every backend, each a fresh empty store (namespace) of its own."""
    kind = request.param
    if kind == "memory":
        s = Store(kind, "memory://", MemoryBackend())
    elif kind == "sqlite":
        s = Store(kind, f"sqlite:///{tmp_path / 'tasks.db'}")
    else:
        url = request.getfixturevalue("served_url_" + kind.replace("-", "_"))
        s = Store(kind, url)
    yield s
    s.close()


@pytest.fixture
def state(store: Store) -> Iterator[al.SharedState]:
    """A SharedState on ``store`` (on memory, sharing the store's one backend)."""
    s = (
        al.SharedState(store.backend())
        if store.kind == "memory"
        else al.SharedState.connect(store.url)
    )
    yield s
    if store.kind != "memory":
        s.close()


@pytest.fixture
async def astate(store: Store) -> AsyncIterator[al.AsyncSharedState]:
    """An AsyncSharedState on ``store`` (on memory, the async face of the store's one backend)."""
    if store.kind == "memory":
        yield al.AsyncSharedState(store.backend().open_async())
        return
    s = al.AsyncSharedState.connect(store.url)
    yield s
    await s.close()


@pytest.fixture
def served_url_redis() -> Iterator[str]:
    """A fresh key prefix on the shared Redis."""
    problem = _services.redis_problem()
    if problem:
        unavailable("redis", problem)
    prefix = _services.namespace()
    yield _services.with_option(_services.REDIS_URL, "prefix", prefix)
    _services.drop_redis_prefix(_services.REDIS_URL, prefix)


@pytest.fixture(scope="session")
def redis_cluster_base() -> Iterator[str]:
    """A private three-master Redis Cluster for the whole session (started and stopped here)."""
    from tests import _redis_cluster

    try:
        cluster = _redis_cluster.start()
    except _redis_cluster.CannotStart as exc:
        unavailable("redis cluster", str(exc))
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture
def served_url_redis_cluster(redis_cluster_base: str) -> Iterator[str]:
    """A fresh key prefix on the private Redis Cluster."""
    prefix = _services.namespace()
    url = _services.with_option(redis_cluster_base, "prefix", prefix)
    yield url
    _services.drop_redis_prefix(url, prefix)


@pytest.fixture
def served_url_postgres() -> Iterator[str]:
    """A fresh schema on the shared PostgreSQL."""
    problem = _services.postgres_problem()
    if problem:
        unavailable("postgres", problem)
    schema = _services.namespace()
    yield _services.with_option(_services.POSTGRES_URL, "schema", schema)
    _services.drop_postgres_schema(schema)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Callable[..., PrivateRedis]]:
    """Start private ``redis-server`` processes, ``private_redis(**options)``, for a test that
    breaks, pauses or configures its server (stopped at the end of the test)."""
    from tests._private_redis import CannotStart, PrivateRedis

    started: list[PrivateRedis] = []

    def start(**options: str) -> PrivateRedis:
        try:
            server = PrivateRedis(tmp_path / f"redis{len(started)}", options=options).start()
        except CannotStart as exc:
            unavailable("private redis-server", exc.reason)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite database shared by processes of one test."""
    return f"sqlite:///{tmp_path / 'tasks.db'}"
