"""PostgreSQL over its Unix socket: libpq's URL forms reach the real server, on both faces."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from urllib.parse import quote, urlsplit

import pytest

import agentlease as al
from tests import _services
from tests.conftest import unavailable


@pytest.fixture
def socket_dir() -> str:
    """The directory of the shared server's Unix socket (asked of the server over TCP)."""
    problem = _services.postgres_problem()
    if problem:
        unavailable("postgres", problem)
    import psycopg

    with psycopg.connect(_services.POSTGRES_URL, connect_timeout=3) as conn:
        row = conn.execute("SHOW unix_socket_directories").fetchone()
    directories = [d.strip() for d in (row[0] if row else "").split(",") if d.strip()]
    found = [d for d in directories if os.path.isdir(d)]
    if not found:
        pytest.skip(f"the shared PostgreSQL has no Unix socket here ({directories})")
    return found[0]


@pytest.fixture
def schema() -> Iterator[str]:
    name = _services.namespace()
    yield name
    _services.drop_postgres_schema(name)


def _forms(directory: str, schema: str) -> list[str]:
    shared = urlsplit(_services.POSTGRES_URL)
    user, database = shared.username or "root", shared.path.lstrip("/") or "test"
    return [
        f"postgresql:///{database}?host={directory}&user={user}&schema={schema}",
        f"postgresql://{user}@{quote(directory, safe='')}/{database}?schema={schema}",
        f"postgres://{user}@{quote(directory, safe='')}:{shared.port or 5432}/{database}"
        f"?schema={schema}",
    ]


def _over_socket(url: str) -> bool:
    """Whether the backend's own connections of ``url`` came in over a Unix socket."""
    backend = al.connect(url)
    try:
        import psycopg

        settings = backend.settings  # type: ignore[attr-defined]
        with psycopg.connect(settings.conninfo, connect_timeout=3) as conn:
            row = conn.execute("SELECT inet_client_addr() IS NULL").fetchone()
        return bool(row and row[0])
    finally:
        backend.close()


def test_socket_urls_work_on_both_faces(socket_dir: str, schema: str) -> None:
    for i, url in enumerate(_forms(socket_dir, schema)):
        assert _over_socket(url), url
        with al.Queue.connect(url) as q:
            q.enqueue("jobs", {"n": i}, id=f"sync-{i}")
            [job] = q.claim("jobs")
            assert job.payload == {"n": i}
            q.complete(job.lease, "ok")

        async def run(url: str = url, i: int = i) -> None:
            async with al.AsyncQueue.connect(url) as q:
                await q.enqueue("jobs", {"n": i}, id=f"async-{i}")
                [job] = await q.claim("jobs")
                assert job.payload == {"n": i}
                await q.complete(job.lease, "ok")

        asyncio.run(run())


def test_the_default_socket_is_an_empty_host(socket_dir: str, schema: str) -> None:
    import psycopg

    shared = urlsplit(_services.POSTGRES_URL)
    user, database = shared.username or "root", shared.path.lstrip("/") or "test"
    url = f"postgresql://{user}@/{database}"
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.Error as exc:
        pytest.skip(f"libpq's default socket is not the server's here: {exc}")
    with al.Queue.connect(f"{url}?schema={schema}") as q:
        q.enqueue("jobs", 1)
        assert q.stats("jobs").counts == {"queued": 1}
    with al.Queue.connect(f"postgresql:///{database}?user={user}&schema={schema}") as q:
        assert q.stats("jobs").counts == {"queued": 1}
