"""TLS for real: private servers that speak only TLS, with certificates made for this module.

Redis: three ``redis-server`` processes with ``--port 0 --tls-port``: one whose certificate names
127.0.0.1 and localhost (client certificates optional), one that requires a client certificate
(``tls-auth-clients yes``) and one whose certificate names another host; and a three-node Redis
Cluster with ``tls-cluster yes``. PostgreSQL: a private server with ``ssl = on`` whose
``pg_hba.conf`` accepts TCP over TLS only (``hostnossl ... reject``) and requires a verified
client certificate naming the role (``clientcert=verify-full``) for the role
``agentlease_client``.

Covered, on the sync and asyncio faces: a queue's enqueue, claim and complete over ``rediss://``
with the CA verified, with mutual TLS, and on a cluster; PostgreSQL with
``sslmode=verify-full``; a wrong CA, a wrong host name, a missing client certificate, one from
another CA and TLS files that cannot be used refused at once with
:class:`~agentlease.errors.TLSRefused` (permanent, a ``BackendRefused``) whose message says why
and shows no password; a worker process and the demo end to end over TLS on
both stores, and a worker given a refused URL exits with status 2 and the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentlease as al
from agentlease import BackendRefused, BackendUnavailable, TLSRefused
from agentlease.backends import _redis_tls
from tests import _private_postgres, _redis_cluster
from tests._private_redis import CannotStart, PrivateRedis
from tests.conftest import unavailable
from tests.security import _certs

ROOT = Path(__file__).resolve().parents[2]
FAST = 5.0  # seconds: a refusal is answered at once (generous for a loaded machine)
SECRET = "tls-s3cret"  # a password in refused URLs, which no message may show


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> _certs.Certs:
    return _certs.make(tmp_path_factory.mktemp("certs"))


def _tls(pair: _certs.Pair, ca: _certs.Pair, auth_clients: str) -> dict[str, str]:
    return {
        "tls-cert-file": str(pair.cert),
        "tls-key-file": str(pair.key),
        "tls-ca-cert-file": str(ca.cert),
        "tls-auth-clients": auth_clients,
    }


@pytest.fixture(scope="module")
def redis_tls(
    certs: _certs.Certs, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, PrivateRedis]]:
    """``verify``: TLS only, client certificates optional; ``mutual``: a client certificate
    required; ``wrong_host``: a certificate for wrong.example only."""
    kinds = {
        "verify": _tls(certs.server, certs.ca, "optional"),
        "mutual": _tls(certs.server, certs.ca, "yes"),
        "wrong_host": _tls(certs.wrong_host, certs.ca, "optional"),
    }
    servers: dict[str, PrivateRedis] = {}
    try:
        for name, tls in kinds.items():
            server = PrivateRedis(tmp_path_factory.mktemp(f"redis-{name}"), tls=tls)
            servers[name] = server.start()
    except CannotStart as exc:
        for server in servers.values():
            server.stop()
        unavailable("private redis-server with TLS", exc.reason)
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop()


HBA = """\
local     all all                               trust
hostssl   all agentlease_client 127.0.0.1/32    trust clientcert=verify-full
hostssl   all all               127.0.0.1/32    trust
hostnossl all all               127.0.0.1/32    reject
"""


@pytest.fixture(scope="module")
def pg_tls(certs: _certs.Certs) -> Iterator[_private_postgres.PrivatePostgres]:
    """A private PostgreSQL that takes TCP clients over TLS only."""
    try:
        server = _private_postgres.start(
            hba=HBA,
            conf=(
                "ssl = on",
                "ssl_cert_file = 'server.crt'",
                "ssl_key_file = 'server.key'",
                "ssl_ca_file = 'ca.crt'",
            ),
            files={
                "server.crt": certs.server.cert,
                "server.key": certs.server.key,
                "ca.crt": certs.ca.cert,
            },
        )
    except _private_postgres.CannotStart as exc:
        unavailable("private postgresql with TLS", str(exc))
    try:
        server.sql("CREATE ROLE agentlease_client LOGIN")
        server.sql("GRANT CREATE ON DATABASE postgres TO agentlease_client")
        yield server
    finally:
        server.stop()


def _rediss(server: PrivateRedis, certs: _certs.Certs, *, client: bool = False, **opts: str) -> str:
    options = {"ssl_ca_certs": str(certs.ca.cert), **opts}
    if client:
        options |= {"ssl_certfile": str(certs.client.cert), "ssl_keyfile": str(certs.client.key)}
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"rediss://127.0.0.1:{server.port}/0?{query}"


def _pg(
    server: _private_postgres.PrivatePostgres,
    ca: _certs.Pair,
    *,
    user: str = "postgres",
    host: str = "127.0.0.1",
    **opts: str,
) -> str:
    options = {"sslmode": "verify-full", "sslrootcert": str(ca.cert), **opts}
    if host != "127.0.0.1":
        options["hostaddr"] = "127.0.0.1"  # reach the server, but check its certificate for host
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"postgresql://{user}@{host}:{server.port}/postgres?{query}"


# -- helpers --------------------------------------------------------------------------------------


def _round_trip_sync(url: str, queue: str) -> None:
    """Enqueue, claim and complete one task on the sync face; the store says it is done."""
    q = al.Queue.connect(url)
    try:
        task_id = q.enqueue(queue, 21).task_id
        [job] = q.claim(queue)
        assert job.lease.task_id == task_id
        q.complete(job.lease, 42)
        task = q.get(task_id)
        assert (task.state, task.result) == ("done", 42)
    finally:
        q.close()


def _round_trip_async(url: str, queue: str) -> None:
    """The same on the asyncio face."""

    async def run() -> None:
        q = al.AsyncQueue.connect(url)
        try:
            task_id = (await q.enqueue(queue, 21)).task_id
            [job] = await q.claim(queue)
            assert job.lease.task_id == task_id
            await q.complete(job.lease, 42)
            task = await q.get(task_id)
            assert (task.state, task.result) == ("done", 42)
        finally:
            await q.close()

    asyncio.run(run())


def _first_error(url: str, face: str) -> BaseException:
    """The error of a fresh client's first call on ``face``; it must come at once."""

    async def call_async() -> None:
        backend = al.connect_async(url)
        try:
            await backend.stats("jobs")
        finally:
            await backend.close()

    def call_sync() -> None:
        backend = al.connect(url)
        try:
            backend.stats("jobs")
        finally:
            backend.close()

    started = time.monotonic()
    try:
        asyncio.run(call_async()) if face == "async" else call_sync()
    except BaseException as exc:
        assert time.monotonic() - started < FAST, f"{face} {url}: took too long to refuse"
        return exc
    raise AssertionError(f"{face} {url}: the first call succeeded")


def _refused(url: str, *why: str) -> None:
    """Both faces refuse ``url`` with TLSRefused, saying each of ``why``, showing no secret."""
    for face in ("sync", "async"):
        exc = _first_error(url, face)
        assert isinstance(exc, TLSRefused), f"{face}: {exc!r}"
        assert isinstance(exc, BackendRefused)
        assert not isinstance(exc, BackendUnavailable)
        assert exc.__cause__ is not None, f"{face}: the driver's error is not kept"
        for words in why:
            assert words in str(exc), f"{face}: {words!r} not in {exc}"
        assert SECRET not in str(exc), f"{face}: the password leaked: {exc}"
        assert "PRIVATE KEY" not in str(exc), f"{face}: {exc}"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    )
    return env


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentlease", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        check=False,
    )


def _worker_end_to_end(url: str, queue: str) -> None:
    """Tasks enqueued over TLS are all run by a worker process (``--burst``: it exits when the
    queue is empty) that reaches the store over TLS."""
    with al.Queue.connect(url) as q:
        ids = [q.enqueue(queue, n).task_id for n in range(4)]
    done = _cli(
        "worker",
        "tests.security._tls_jobs:double",
        "--queue",
        queue,
        "--burst",
        "--lease-for",
        "10",
        "--poll-interval",
        "0.05",
        "--backend",
        url,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    with al.Queue.connect(url) as q:
        tasks = [q.get(task_id) for task_id in ids]
    assert [(t.state, t.result) for t in tasks] == [("done", n * 2) for n in range(4)]


def _demo(url: str) -> None:
    """The demo (the smallest run it takes: two workers, a few tasks, none killed or frozen)
    keeps every invariant over TLS."""
    done = _cli(
        "demo",
        "--backend",
        url,
        "--workers",
        "2",
        "--tasks",
        "6",
        "--kill",
        "0",
        "--freeze",
        "0",
        "--json",
        timeout=120,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    report = json.loads(done.stdout)
    assert report["invariants_ok"] is True, report
    assert report["completed"] == 6, report


# -- Redis ----------------------------------------------------------------------------------------


def test_redis_over_tls_with_the_ca_verified(
    redis_tls: dict[str, PrivateRedis], certs: _certs.Certs
) -> None:
    url = _rediss(redis_tls["verify"], certs, prefix="verify")
    _round_trip_sync(url, "sync")
    _round_trip_async(url, "async")


def test_redis_mutual_tls_needs_the_client_certificate(
    redis_tls: dict[str, PrivateRedis], certs: _certs.Certs
) -> None:
    server = redis_tls["mutual"]
    _refused(
        _rediss(server, certs).replace("rediss://", f"rediss://:{SECRET}@"),
        "TLS refused",
        "requires a client certificate",
        "ssl_certfile",
    )
    stranger = _rediss(
        server,
        certs,
        ssl_certfile=str(certs.stranger.cert),
        ssl_keyfile=str(certs.stranger.key),
    )
    _refused(stranger, "TLS refused", "the server refused the TLS handshake", "unknown ca")
    url = _rediss(server, certs, client=True, prefix="mutual")
    _round_trip_sync(url, "sync")
    _round_trip_async(url, "async")


def test_redis_server_certificate_from_another_ca_is_refused(
    redis_tls: dict[str, PrivateRedis], certs: _certs.Certs
) -> None:
    url = _rediss(redis_tls["verify"], certs, ssl_ca_certs=str(certs.other_ca.cert))
    _refused(
        url.replace("rediss://", f"rediss://agent:{SECRET}@"),
        "certificate could not be verified",
        "ssl_ca_certs",
    )


def test_redis_server_certificate_for_another_host_is_refused(
    redis_tls: dict[str, PrivateRedis], certs: _certs.Certs
) -> None:
    url = _rediss(redis_tls["wrong_host"], certs)
    _refused(url, "host name does not match", "127.0.0.1")


def test_a_broken_tls_connection_is_told_from_a_refused_client_certificate(
    redis_tls: dict[str, PrivateRedis], certs: _certs.Certs
) -> None:
    """Under TLS 1.3 a server that requires a client certificate says so after the handshake,
    and the client may see only a broken connection (the server's alert lost to a reset): one
    more handshake, nothing sent, hears the server's alert; a server that accepts the client
    stays silent, and the break is left transient."""
    broken = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
    settings = {
        "host": "127.0.0.1",
        "port": redis_tls["mutual"].port,
        "ssl": True,
        "ssl_ca_certs": str(certs.ca.cert),
        "socket_connect_timeout": 0.2,
    }
    refused = _redis_tls.tls_refusal(settings, broken, "rediss://test")
    assert isinstance(refused, TLSRefused)
    assert "requires a client certificate" in str(refused)
    accepted = {
        **settings,
        "ssl_certfile": str(certs.client.cert),
        "ssl_keyfile": str(certs.client.key),
    }
    assert _redis_tls.tls_refusal(accepted, broken, "rediss://test") is None
    assert _redis_tls.tls_refusal(settings, TimeoutError(), "rediss://test") is None


def test_plain_redis_client_gets_nothing_from_a_tls_only_server(
    redis_tls: dict[str, PrivateRedis],
) -> None:
    """The servers above really are TLS only: a plain client is not served."""
    exc = _first_error(f"redis://127.0.0.1:{redis_tls['verify'].port}/0", "sync")
    assert isinstance(exc, al.BackendError), repr(exc)


def test_redis_cluster_over_tls(certs: _certs.Certs) -> None:
    try:
        cluster = _redis_cluster.start(tls=_tls(certs.server, certs.ca, "yes"))
    except _redis_cluster.CannotStart as exc:
        unavailable("private redis cluster with TLS", exc.reason)
    try:
        node = cluster.nodes[0]
        url = _rediss(node, certs, client=True, cluster="1", prefix="tlscluster")
        _round_trip_sync(url, "sync")
        _round_trip_async(url, "async")
        wrong_ca = _rediss(node, certs, cluster="1", ssl_ca_certs=str(certs.other_ca.cert))
        _refused(wrong_ca, "certificate could not be verified")
        _refused(_rediss(node, certs, cluster="1"), "requires a client certificate")
    finally:
        cluster.stop()


def test_worker_and_demo_over_redis_mutual_tls(
    redis_tls: dict[str, PrivateRedis], certs: _certs.Certs
) -> None:
    server = redis_tls["mutual"]
    _worker_end_to_end(_rediss(server, certs, client=True, prefix="worker"), "work")
    _demo(_rediss(server, certs, client=True, prefix="demo"))


def test_worker_refused_by_tls_exits_with_the_reason(
    redis_tls: dict[str, PrivateRedis], certs: _certs.Certs
) -> None:
    """A worker whose URL lacks the client certificate the server requires stops at once with
    status 2 and says why, instead of waiting for the store for ever."""
    url = _rediss(redis_tls["mutual"], certs)
    done = _cli("worker", "tests.security._tls_jobs:double", "--queue", "work", "--backend", url)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "requires a client certificate" in done.stderr


# -- PostgreSQL -----------------------------------------------------------------------------------


def test_postgres_verify_full_with_the_right_ca(
    pg_tls: _private_postgres.PrivatePostgres, certs: _certs.Certs
) -> None:
    url = _pg(pg_tls, certs.ca, schema="verify")
    _round_trip_sync(url, "sync")
    _round_trip_async(url, "async")


def test_postgres_refuses_plain_connections(pg_tls: _private_postgres.PrivatePostgres) -> None:
    """The server really takes TCP over TLS only: a plain client is refused for good."""
    exc = _first_error(
        f"postgresql://postgres@127.0.0.1:{pg_tls.port}/postgres?sslmode=disable", "sync"
    )
    assert isinstance(exc, BackendRefused), repr(exc)
    assert "no encryption" in str(exc), repr(exc)


def test_postgres_server_certificate_from_another_ca_is_refused(
    pg_tls: _private_postgres.PrivatePostgres, certs: _certs.Certs
) -> None:
    url = _pg(pg_tls, certs.other_ca, password=SECRET)
    _refused(url, "certificate could not be verified", "sslrootcert")


def test_postgres_server_certificate_for_another_host_is_refused(
    pg_tls: _private_postgres.PrivatePostgres, certs: _certs.Certs
) -> None:
    url = _pg(pg_tls, certs.ca, host="wrong.example")
    _refused(url, "host name does not match", "wrong.example")


def test_postgres_mutual_tls_needs_the_client_certificate(
    pg_tls: _private_postgres.PrivatePostgres, certs: _certs.Certs
) -> None:
    _refused(
        _pg(pg_tls, certs.ca, user="agentlease_client"),
        "requires a client certificate",
        "sslcert",
    )
    stranger = _pg(
        pg_tls,
        certs.ca,
        user="agentlease_client",
        sslcert=str(certs.stranger.cert),
        sslkey=str(certs.stranger.key),
    )
    _refused(stranger, "TLS refused", "does not trust the client certificate's CA")
    url = _pg(
        pg_tls,
        certs.ca,
        user="agentlease_client",
        sslcert=str(certs.client.cert),
        sslkey=str(certs.client.key),
        schema="mutual",
    )
    _round_trip_sync(url, "sync")
    _round_trip_async(url, "async")


def test_worker_and_demo_over_postgres_tls(
    pg_tls: _private_postgres.PrivatePostgres, certs: _certs.Certs
) -> None:
    _worker_end_to_end(_pg(pg_tls, certs.ca, schema="worker"), "work")
    _demo(_pg(pg_tls, certs.ca, schema="demo"))


def test_tls_files_that_cannot_be_used_are_refused(
    redis_tls: dict[str, PrivateRedis],
    pg_tls: _private_postgres.PrivatePostgres,
    certs: _certs.Certs,
    tmp_path: Path,
) -> None:
    """A missing CA file, or a client certificate given with another key, fails the same way
    every time: refused at once, not waited for as an outage."""
    missing = str(tmp_path / "missing.crt")
    server = redis_tls["verify"]
    _refused(_rediss(server, certs, ssl_ca_certs=missing), "TLS file", "cannot be read")
    mismatched = _rediss(
        server,
        certs,
        ssl_certfile=str(certs.client.cert),
        ssl_keyfile=str(certs.server.key),
    )
    _refused(mismatched, "cannot be used", "key values mismatch")
    _refused(_pg(pg_tls, certs.ca, sslrootcert=missing), "sslrootcert", "cannot be read")
