"""A client used after close() gets a typed error from every store and either face, never the
driver's or the executor's own exception (SQLite's asyncio face runs on a thread pool that is
shut down by close)."""

from __future__ import annotations

from pathlib import Path

import pytest

import agentlease as al


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tasks.db'}"
    return str(request.getfixturevalue("served_url_postgres"))


def test_a_closed_sync_client_raises_typed_errors(url: str) -> None:
    q = al.Queue.connect(url)
    q.enqueue("jobs", 1)
    q.close()
    for call in (lambda: q.enqueue("jobs", 2), lambda: q.stats("jobs"), lambda: q.claim("jobs")):
        with pytest.raises(al.BackendError):
            call()
    q.close()  # a second close is harmless


async def test_a_closed_async_client_raises_typed_errors(url: str) -> None:
    q = al.AsyncQueue.connect(url)
    await q.enqueue("jobs", 1)
    await q.close()
    for call in (lambda: q.enqueue("jobs", 2), lambda: q.stats("jobs"), lambda: q.claim("jobs")):
        with pytest.raises(al.BackendError):
            await call()
    await q.close()
