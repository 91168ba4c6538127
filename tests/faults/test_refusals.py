"""A store that refuses the client as configured says so from the first call, on both faces,
with a permanent error (BackendRefused), never the transient BackendUnavailable a worker would
retry for ever: a wrong or missing password, an unknown user, an ACL that forbids a command, a
missing database, a schema without tables and ``migrate=false``.

Redis credentials need a private ``redis-server`` (``requirepass`` and ACL users); PostgreSQL's
refusals here need nothing the shared server lacks (its trust authentication still refuses an
unknown role or database). A wrong PostgreSQL password is tested on the private server of
``test_postgres_restart.py``, which has a password-only role.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
import redis
from redis import exceptions as rx
from redis.cluster import RedisCluster

import agentlease as al
from agentlease import (
    AuthenticationFailed,
    BackendRefused,
    BackendUnavailable,
    PermissionDenied,
    SchemaNotMigrated,
)
from tests import _services
from tests._private_redis import CannotStart, PrivateRedis
from tests.conftest import unavailable

FAST = 5.0  # seconds: a refusal is answered at once; generous for a loaded machine


def _first_call_sync(url: str) -> BaseException:
    """The error of the first call of a fresh synchronous client (opening included)."""
    started = time.monotonic()
    try:
        backend = al.connect(url)
        try:
            backend.stats("jobs")
        finally:
            backend.close()
    except BaseException as exc:
        assert time.monotonic() - started < FAST, f"{url}: took too long to refuse"
        return exc
    raise AssertionError(f"{url}: the first call succeeded")


def _first_call_async(url: str) -> BaseException:
    """The error of the first call of a fresh asyncio client."""

    async def call() -> None:
        backend = al.connect_async(url)
        try:
            await backend.stats("jobs")
        finally:
            await backend.close()

    started = time.monotonic()
    try:
        asyncio.run(call())
    except BaseException as exc:
        assert time.monotonic() - started < FAST, f"{url}: took too long to refuse"
        return exc
    raise AssertionError(f"{url}: the first call succeeded")


def _refused(url: str, kind: type[BackendRefused], cause: type[BaseException]) -> None:
    """Both faces refuse ``url`` with ``kind`` (permanent), the driver's error as the cause."""
    for face, first_call in (("sync", _first_call_sync), ("async", _first_call_async)):
        exc = first_call(url)
        assert type(exc) is kind, f"{face} {url}: {exc!r}"
        assert not isinstance(exc, BackendUnavailable)
        assert isinstance(exc.__cause__, cause), f"{face}: cause {exc.__cause__!r}"
        for secret in ("wrong", "s3cret", "pw@"):
            assert secret not in str(exc), f"{face}: the password leaked: {exc}"


# -- Redis ------------------------------------------------------------------------------------


@pytest.fixture
def auth_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A private Redis with a password and three ACL users."""
    try:
        server = PrivateRedis(tmp_path / "redis", options={"requirepass": "s3cret"}).start()
    except CannotStart as exc:
        unavailable("private redis-server", exc.reason)
    admin = redis.Redis(port=server.port, password="s3cret")
    try:
        admin.execute_command("ACL", "SETUSER", "alice", "on", ">pw", "~*", "&*", "+@all")
        admin.execute_command("ACL", "SETUSER", "bob", "on", ">pw", "~*", "+@all", "-evalsha")
        admin.execute_command("ACL", "SETUSER", "carol", "on", ">pw", "~other:*", "+@all")
    finally:
        admin.close()
    yield server
    server.stop()


def test_redis_login_and_acl_refusals_are_permanent(auth_redis: PrivateRedis) -> None:
    base = f"127.0.0.1:{auth_redis.port}/0?prefix=auth"
    good = al.Queue.connect(f"redis://:s3cret@{base}")
    try:
        good.enqueue("jobs", 1)
    finally:
        good.close()
    _refused(f"redis://:wrong@{base}", AuthenticationFailed, rx.AuthenticationError)
    _refused(f"redis://{base}", AuthenticationFailed, rx.AuthenticationError)  # no password
    _refused(f"redis://alice:wrong@{base}", AuthenticationFailed, rx.AuthenticationError)
    _refused(f"redis://nobody:pw@{base}", AuthenticationFailed, rx.AuthenticationError)
    _refused(f"redis://bob:pw@{base}", PermissionDenied, rx.NoPermissionError)  # no EVALSHA
    _refused(f"redis://carol:pw@{base}", PermissionDenied, rx.NoPermissionError)  # no such keys
    alice = al.Queue.connect(f"redis://alice:pw@{base}")
    try:
        assert alice.stats("jobs").counts == {"queued": 1}
    finally:
        alice.close()


def test_redis_cluster_login_and_acl_refusals_are_permanent(redis_cluster_base: str) -> None:
    """A cluster client that reaches no node because every node refused the login says so."""
    user = _services.namespace()
    admin = RedisCluster.from_url(redis_cluster_base.split("?", 1)[0])
    try:
        for name, rules in ((user, ("+@all",)), (f"{user}_x", ("+@all", "-evalsha"))):
            admin.execute_command(
                "ACL", "SETUSER", name, "on", ">pw", "~*", "&*", *rules,
                target_nodes=RedisCluster.ALL_NODES,
            )  # fmt: skip
        host = redis_cluster_base.split("://", 1)[1]
        prefix = f"&prefix={user}"
        _refused(
            f"redis://{user}:wrong@{host}{prefix}", AuthenticationFailed, rx.RedisClusterException
        )
        _refused(
            f"redis://{user}_y:pw@{host}{prefix}", AuthenticationFailed, rx.RedisClusterException
        )
        _refused(f"redis://{user}_x:pw@{host}{prefix}", PermissionDenied, rx.NoPermissionError)
        with al.Queue.connect(f"redis://{user}:pw@{host}{prefix}") as good:
            assert good.queues() == []
    finally:
        admin.execute_command(
            "ACL", "DELUSER", user, f"{user}_x", target_nodes=RedisCluster.ALL_NODES
        )
        admin.close()


# -- PostgreSQL (the shared server) -----------------------------------------------------------


@pytest.fixture
def shared_postgres() -> Iterator[tuple[str, str]]:
    """``(host:port, schema)`` on the shared server, the schema dropped afterwards."""
    problem = _services.postgres_problem()
    if problem:
        unavailable("postgres", problem)
    schema = _services.namespace()
    yield urlsplit(_services.POSTGRES_URL).netloc.rpartition("@")[2], schema
    _services.drop_postgres_schema(schema)


def test_postgres_unknown_role_is_an_authentication_failure(
    shared_postgres: tuple[str, str],
) -> None:
    where, schema = shared_postgres
    url = f"postgresql://no_such_role_{schema}@{where}/test?schema={schema}"
    _refused(url, AuthenticationFailed, psycopg.OperationalError)


def test_postgres_unknown_database_is_refused(shared_postgres: tuple[str, str]) -> None:
    where, schema = shared_postgres
    user = urlsplit(_services.POSTGRES_URL).username
    url = f"postgresql://{user}@{where}/no_such_db_{schema}?schema={schema}"
    _refused(url, BackendRefused, psycopg.OperationalError)


def test_postgres_missing_privilege_is_permission_denied(shared_postgres: tuple[str, str]) -> None:
    """A role that may not create the schema (nor read one it does not own) is refused for
    good, not told to retry."""
    where, schema = shared_postgres
    role = f"{schema}_role"
    with psycopg.connect(_services.POSTGRES_URL, autocommit=True) as conn:
        try:
            conn.execute(f"CREATE ROLE {role} LOGIN".encode())
        except psycopg.errors.InsufficientPrivilege as exc:
            pytest.skip(f"cannot create a role on the shared server: {exc}")
    try:
        database = urlsplit(_services.POSTGRES_URL).path
        _refused(
            f"postgresql://{role}@{where}{database}?schema={schema}",
            PermissionDenied,
            psycopg.errors.InsufficientPrivilege,
        )
    finally:
        with psycopg.connect(_services.POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}".encode())


def test_postgres_schema_without_tables_and_migrate_false_is_refused(
    shared_postgres: tuple[str, str],
) -> None:
    _, schema = shared_postgres
    url = f"{_services.with_option(_services.POSTGRES_URL, 'schema', schema)}&migrate=false"
    for first_call in (_first_call_sync, _first_call_async):
        exc = first_call(url)
        assert type(exc) is SchemaNotMigrated, repr(exc)
        assert "agentlease migrate" in str(exc)
    with psycopg.connect(_services.POSTGRES_URL) as conn:  # nothing was created
        row = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)
        ).fetchone()
    assert row == (0,)
    # Tables dropped under a running client: the same permanent error, on the next call.
    migrated = al.connect(_services.with_option(_services.POSTGRES_URL, "schema", schema))
    try:
        with psycopg.connect(_services.POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {schema}.agentlease_queues CASCADE".encode())
        with pytest.raises(SchemaNotMigrated, match="agentlease migrate"):
            migrated.queues()
    finally:
        migrated.close()


def test_a_worker_refused_by_the_store_exits_at_once_with_the_reason(
    auth_redis: PrivateRedis,
) -> None:
    """Without --burst too: a wrong password must not leave a worker idling silently."""
    url = f"redis://:wrong@127.0.0.1:{auth_redis.port}/0?prefix=auth"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "agentlease", "worker", "json:dumps", "--backend", url, "-q", "q"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 30
    assert proc.returncode == 2, proc.stderr
    assert "authentication failed" in proc.stderr.lower()
    assert "wrong" not in proc.stderr
