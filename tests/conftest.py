"""Shared fixtures: the stores every contract test runs against.

``store`` is parametrised over every backend. Backends that need a server (none yet besides the
embedded ones) are skipped when the server is unreachable, unless AGENTLEASE_REQUIRE_SERVICES=1,
which turns that skip into a failure (CI sets it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import agentlease as al
from agentlease.backends.memory import MemoryBackend

REQUIRE_SERVICES = os.environ.get("AGENTLEASE_REQUIRE_SERVICES") == "1"
EMBEDDED = ["memory", "sqlite"]


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
        return al.AsyncQueue(self.backend().open_async(), settings=settings, **kw)  # type: ignore[arg-type]

    def close(self) -> None:
        for q in self._opened:
            q.close()  # type: ignore[attr-defined]


@pytest.fixture(params=EMBEDDED)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Every backend, each a fresh empty store."""
    kind = request.param
    if kind == "memory":
        s = Store(kind, "memory://", MemoryBackend())
    elif kind == "sqlite":
        s = Store(kind, f"sqlite:///{tmp_path / 'tasks.db'}")
    else:  # pragma: no cover - service-backed backends arrive with their issue
        raise AssertionError(kind)
    yield s
    s.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite database shared by processes of one test."""
    return f"sqlite:///{tmp_path / 'tasks.db'}"
