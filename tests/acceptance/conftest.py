"""What the multi-process acceptance tests share: a store their processes can all reach."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import BACKENDS

KINDS = [k for k in BACKENDS if k != "memory"]  # processes cannot share memory://


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store that separate processes share: SQLite in a temp dir, else a fresh namespace."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    value: str = request.getfixturevalue("served_url_" + request.param.replace("-", "_"))
    return value
