"""Parsing ``redis://`` and ``rediss://`` URLs, and translating driver errors (no server needed)."""

from __future__ import annotations

import asyncio
import ssl

import pytest
from redis import exceptions as rx

import agentlease as al
from agentlease.backends._redis_url import parse, translate
from agentlease.errors import (
    AuthenticationFailed,
    BackendError,
    BackendUnavailable,
    InvalidURL,
    PermissionDenied,
    TLSRefused,
)


def test_defaults() -> None:
    o = parse("redis://localhost")
    assert (o.host, o.port, o.db, o.username, o.password) == ("localhost", 6379, 0, None, None)
    assert (o.prefix, o.cluster, o.tls) == ("agentlease", False, False)
    assert (o.socket_timeout, o.connect_timeout) == (10.0, 3.0)
    assert o.client_kwargs()["db"] == 0
    assert "ssl" not in o.client_kwargs()


def test_everything_given() -> None:
    o = parse(
        "redis://worker:s%40cr%3At@redis.internal:6380/3"
        "?prefix=team-a.jobs&socket_timeout=2.5&connect_timeout=0.5"
    )
    assert (o.host, o.port, o.db) == ("redis.internal", 6380, 3)
    assert (o.username, o.password) == ("worker", "s@cr:t")
    assert o.prefix == "team-a.jobs"
    assert (o.socket_timeout, o.connect_timeout) == (2.5, 0.5)
    kwargs = o.client_kwargs()
    assert kwargs["socket_connect_timeout"] == 0.5
    assert kwargs["password"] == "s@cr:t"


def test_password_only_and_masking() -> None:
    o = parse("redis://:hunter2@127.0.0.1:7000/0")
    assert (o.username, o.password) == (None, "hunter2")
    assert "hunter2" not in o.url
    assert o.url == "redis://:***@127.0.0.1:7000/0"
    assert "secret" not in parse("redis://u:secret@h/1?prefix=p").url


def test_ipv6_host() -> None:
    o = parse("redis://[::1]:6390")
    assert (o.host, o.port) == ("::1", 6390)


def test_tls_options() -> None:
    o = parse(
        "rediss://h:6380?ssl_cert_reqs=none&ssl_ca_certs=/etc/ca.pem"
        "&ssl_certfile=/c.pem&ssl_keyfile=/k.pem&ssl_check_hostname=0"
    )
    assert o.tls
    kwargs = o.client_kwargs()
    assert kwargs["ssl"] is True
    assert kwargs["ssl_cert_reqs"] == "none"
    assert kwargs["ssl_ca_certs"] == "/etc/ca.pem"
    assert (kwargs["ssl_certfile"], kwargs["ssl_keyfile"]) == ("/c.pem", "/k.pem")
    assert kwargs["ssl_check_hostname"] is False
    assert parse("rediss://h").client_kwargs()["ssl"] is True


def test_cluster() -> None:
    o = parse("redis://10.0.0.1:7000/0?cluster=1")
    assert o.cluster
    assert "db" not in o.client_kwargs()
    assert not parse("redis://h?cluster=false").cluster


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("redis://h/x", id="db-not-a-number"),
        pytest.param("redis://h/0/1", id="db-path"),
        pytest.param("redis://h:notaport", id="bad-port"),
        pytest.param("redis://h:70000", id="port-out-of-range"),
        pytest.param("redis://h?nosuch=1", id="unknown-option"),
        pytest.param("redis://h?db=1", id="db-option"),
        pytest.param("redis://h?prefix=a&prefix=b", id="option-twice"),
        pytest.param("redis://h?prefix", id="option-without-value"),
        pytest.param("redis://h?prefix=", id="empty-prefix"),
        pytest.param("redis://h?prefix={x}", id="braces-in-prefix"),
        pytest.param("redis://h?prefix=a%20b", id="space-in-prefix"),
        pytest.param("redis://h?prefix=" + "p" * 65, id="long-prefix"),
        pytest.param("redis://h?prefix=-a", id="prefix-leading-dash"),
        pytest.param("redis://h?cluster=maybe", id="bad-flag"),
        pytest.param("redis://h/2?cluster=1", id="cluster-db"),
        pytest.param("redis://h?socket_timeout=0", id="zero-timeout"),
        pytest.param("redis://h?socket_timeout=-1", id="negative-timeout"),
        pytest.param("redis://h?connect_timeout=nan", id="nan-timeout"),
        pytest.param("redis://h?connect_timeout=soon", id="word-timeout"),
        pytest.param("redis://h?ssl_cert_reqs=none", id="tls-option-without-tls"),
        pytest.param("rediss://h?ssl_cert_reqs=sometimes", id="bad-cert-reqs"),
        pytest.param("rediss://h?ssl_ca_certs=", id="empty-ca"),
        pytest.param("redis://h#frag", id="fragment"),
        pytest.param("redis://user@", id="no-host"),
        pytest.param("redis://h:", id="empty-port"),
        pytest.param("redis://[::1", id="bad-ipv6"),
    ],
)
def test_malformed_urls_are_refused_before_any_io(url: str) -> None:
    with pytest.raises(InvalidURL):
        parse(url)
    with pytest.raises(InvalidURL):
        al.connect(url)
    with pytest.raises(InvalidURL):
        al.connect_async(url)


def test_connect_does_no_io() -> None:
    """Opening a plain client connects lazily: a dead address fails at the first call."""
    backend = al.connect("redis://127.0.0.1:1/0?connect_timeout=0.5")
    try:
        assert backend.url == "redis://127.0.0.1:1/0?connect_timeout=0.5"
        with pytest.raises(BackendUnavailable) as info:
            backend.queues()
        assert isinstance(info.value.__cause__, rx.ConnectionError)
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (rx.ConnectionError("Error 111 connecting"), BackendUnavailable),
        (rx.TimeoutError("Timeout reading from socket"), BackendUnavailable),
        (rx.AuthenticationError("invalid username-password pair"), AuthenticationFailed),
        (rx.ResponseError("WRONGPASS invalid username-password pair"), AuthenticationFailed),
        (rx.ResponseError("NOAUTH Authentication required."), AuthenticationFailed),
        (rx.NoPermissionError("NOPERM this user has no permissions"), PermissionDenied),
        (rx.ConnectionError("max number of clients reached"), BackendUnavailable),
        (
            rx.ReadOnlyError("READONLY You can't write against a read only replica."),
            BackendUnavailable,
        ),
        (rx.BusyLoadingError("LOADING Redis is loading the dataset in memory"), BackendUnavailable),
        (rx.ClusterDownError("CLUSTERDOWN The cluster is down"), BackendUnavailable),
        (rx.TryAgainError("TRYAGAIN"), BackendUnavailable),
        (rx.ResponseError("ERR Error running script"), BackendError),
        # maxmemory reached: like a full disk on PostgreSQL, an outage a worker waits out.
        (rx.OutOfMemoryError("OOM command not allowed"), BackendUnavailable),
        (rx.ResponseError("BUSY Redis is busy running a script."), BackendUnavailable),
        (rx.ResponseError("MISCONF Redis is configured to save RDB snapshots"), BackendUnavailable),
    ],
)
def test_driver_errors_are_translated(error: Exception, kind: type[BackendError]) -> None:
    translated = translate("redis://h:6379/0", error)
    assert type(translated) is kind
    assert "redis://h:6379/0" in str(translated)


def test_an_unreachable_cluster_is_a_typed_error() -> None:
    """redis-py's cluster errors do not derive from RedisError; they are translated too."""
    url = "redis://127.0.0.1:1/0?cluster=1&connect_timeout=0.5"
    with pytest.raises(BackendUnavailable) as info:
        al.connect(url)  # the synchronous cluster client reads the slot map when opened
    assert isinstance(info.value.__cause__, rx.RedisClusterException)

    async def first_call() -> None:
        backend = al.connect_async(url)
        try:
            with pytest.raises(BackendUnavailable):
                await backend.queues()
        finally:
            await backend.close()

    asyncio.run(first_call())


@pytest.mark.parametrize(
    "url",
    [
        "redis://alice:s3cret-pw@127.0.0.1:6379/0?prefix=p",
        "rediss://alice:s3cret-pw@127.0.0.1:6380/1?ssl_cert_reqs=none",
        "redis://:s3cret-pw@127.0.0.1:7000/0?cluster=true",
    ],
)
def test_the_options_repr_never_shows_the_password(url: str) -> None:
    options = parse(url)
    assert options.password == "s3cret-pw"  # kept for connecting
    assert "s3cret-pw" not in repr(options)
    assert "s3cret-pw" not in options.url


def _wrapped(cause: BaseException) -> rx.ConnectionError:
    """A redis-py ConnectionError raised while handling ``cause``, as redis-py raises them."""
    try:
        raise cause
    except BaseException as inner:
        try:
            raise rx.ConnectionError(f"Error 1 connecting to h:6380. {inner}.") from inner
        except rx.ConnectionError as outer:
            return outer


def _verify_error(code: int, message: str) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, f"certificate verify failed: {message}")
    error.verify_code = code
    error.verify_message = message
    return error


def _ssl_error(library: str, reason: str) -> ssl.SSLError:
    error = ssl.SSLError(1, f"[{library}: {reason}]")
    error.library = library
    error.reason = reason
    return error


@pytest.mark.parametrize(
    ("cause", "url", "words"),
    [
        (
            _verify_error(20, "unable to get local issuer certificate"),
            "rediss://h:6380/0",
            "certificate could not be verified (unable to get local issuer certificate)",
        ),
        (
            _verify_error(62, "Hostname mismatch, certificate is not valid for 'h'."),
            "rediss://h:6380/0",
            "host name does not match",
        ),
        (
            _ssl_error("SSL", "TLSV13_ALERT_CERTIFICATE_REQUIRED"),
            "rediss://h:6380/0",
            "requires a client certificate",
        ),
        (
            _ssl_error("SSL", "TLSV1_ALERT_UNKNOWN_CA"),
            "rediss://h:6380/0",
            "refused the TLS handshake (tlsv1 alert unknown ca)",
        ),
        (
            _ssl_error("X509", "KEY_VALUES_MISMATCH"),
            "rediss://h:6380/0",
            "cannot be used: key values mismatch",
        ),
        (FileNotFoundError(2, "No such file or directory"), "rediss://h:6380/0", "cannot be read"),
        (  # load_cert_chain on files that are not PEM: library SSL, no reason
            ssl.SSLError(524297, "[SSL] PEM lib (_ssl.c:3905)"),
            "rediss://h:6380/0",
            "cannot be used",
        ),
    ],
)
def test_tls_failures_are_permanent_and_say_why(cause: BaseException, url: str, words: str) -> None:
    translated = translate(url, _wrapped(cause))
    assert type(translated) is TLSRefused
    assert words in str(translated)


@pytest.mark.parametrize(
    "cause",
    [
        ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),  # ambiguous: probed instead
        ConnectionResetError(104, "Connection reset by peer"),
        FileNotFoundError(2, "No such file or directory"),  # not a TLS file on redis://
    ],
)
def test_other_connection_failures_stay_transient(cause: BaseException) -> None:
    assert type(translate("redis://h:6379/0", _wrapped(cause))) is BackendUnavailable
