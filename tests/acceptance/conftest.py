"""What the multi-process acceptance tests share: a store their processes can all reach.

Their PostgreSQL is a private server for the session (started on first use, on a free port,
with room for 200 connections; see tests/_private_postgres.py) rather than the shared one: twenty
worker processes with their pools, heartbeat connections and listeners, beside the other tests
that xdist runs at the same time, would take more connections than the shared server allows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests import _services
from tests.conftest import BACKENDS, unavailable

if TYPE_CHECKING:
    from tests._private_postgres import PrivatePostgres

KINDS = [k for k in BACKENDS if k != "memory"]  # processes cannot share memory://


@pytest.fixture(scope="session")
def acceptance_postgres() -> Iterator[PrivatePostgres]:
    """A private PostgreSQL server for this session's acceptance tests."""
    from tests import _private_postgres

    try:
        server = _private_postgres.start()
    except _private_postgres.CannotStart as exc:
        unavailable("private postgres", str(exc))
    yield server
    server.stop()


@pytest.fixture
def served_url_postgres(acceptance_postgres: PrivatePostgres) -> str:
    """A fresh schema on the private server (it is removed with the server)."""
    return acceptance_postgres.url(schema=_services.namespace())


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store that separate processes share: SQLite in a temp dir, else a fresh namespace."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    value: str = request.getfixturevalue("served_url_" + request.param.replace("-", "_"))
    return value
