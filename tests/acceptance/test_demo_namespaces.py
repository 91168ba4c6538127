"""The demo on a shared Redis or PostgreSQL runs in a namespace of its own and removes it
(or keeps it with keep=True); a URL that names its own prefix or schema is used as it is."""

from __future__ import annotations

import pytest

from agentlease._demo.namespace import namespace
from agentlease._demo.scenario import DemoConfig, run_demo
from tests import _services
from tests.conftest import unavailable

pytestmark = pytest.mark.xdist_group("processes")

SMALL = {"workers": 3, "tasks": 10, "kill": 1, "freeze": 0, "lease_for": 1.0}


def _redis_keys(prefix: str) -> int:
    clients = _services.redis_primaries(_services.REDIS_URL)
    try:
        return sum(len(list(c.scan_iter(match=f"*{prefix}*", count=1000))) for c in clients)
    finally:
        for c in clients:
            c.close()


def _schema_exists(schema: str) -> bool:
    import psycopg

    with psycopg.connect(_services.POSTGRES_URL) as conn:
        row = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return row is not None


def _backend(report_backend: object) -> str:
    assert isinstance(report_backend, str)
    return report_backend


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_the_demo_removes_its_namespace_or_keeps_it(kind: str) -> None:
    problem = _services.redis_problem() if kind == "redis" else _services.postgres_problem()
    if problem:
        unavailable(kind, problem)
    base = _services.REDIS_URL if kind == "redis" else _services.POSTGRES_URL
    report = run_demo(DemoConfig(url=base, **SMALL))  # type: ignore[arg-type]
    assert report.ok, report.as_json()
    where = _backend(report.figures["backend"])
    assert where.endswith(", removed)")
    name = where.split("agentlease", 1)[1]
    name = "agentlease" + name.split(" ", 1)[0].split(",", 1)[0]
    if kind == "redis":
        assert _redis_keys(name.rstrip(")")) == 0
    else:
        assert not _schema_exists(name.rstrip(")"))
    kept = run_demo(DemoConfig(url=base, keep=True, **SMALL))  # type: ignore[arg-type]
    assert kept.ok
    assert _backend(kept.figures["backend"]).endswith("kept: --keep)")
    space_url = _backend(kept.figures["backend"]).split(" ", 1)[0]
    option = "prefix=" if kind == "redis" else "schema="
    own = space_url.split(option, 1)[1].split("&", 1)[0]
    try:
        if kind == "redis":
            assert _redis_keys(own) > 0
        else:
            assert _schema_exists(own)
    finally:
        if kind == "redis":
            _services.drop_redis_prefix(_services.REDIS_URL, own)
        else:
            _services.drop_postgres_schema(own)


def test_a_url_that_names_its_namespace_is_used_as_it_is() -> None:
    for url in ("redis://h/0?prefix=mine", "postgresql://u@h/db?schema=mine"):
        space = namespace(url)
        assert space.url == url
        assert space.drop is None
    for url in ("sqlite:///x.db", "memory://"):
        assert namespace(url).url == url
    scoped = namespace("redis://h/0?socket_timeout=2")
    assert "prefix=agentlease-demo-" in scoped.url
    assert "socket_timeout=2" in scoped.url
