"""Telling a Redis TLS failure that retrying cannot fix from an outage.

:func:`tls_reason` reads the ``ssl`` error that redis-py wraps in its own ConnectionError: a
server certificate that could not be verified or does not name the host, a TLS alert from the
server (a client certificate required or refused), a TLS file that cannot be read or used.
:func:`~agentlease.backends._redis_url.translate` makes each a
:class:`~agentlease.errors.TLSRefused`, and the link never sends such a call again.

A server that requires a client certificate says so only after the handshake (TLS 1.3), and the
connection it then closes may look to the client like any broken connection (its alert lost to
a reset, or a write that meets the closed socket first). When a TLS connection breaks that way,
:func:`tls_refusal` asks the server once more, with a handshake and nothing sent, and waits at
most a second (or the connect timeout) for its verdict: an alert is a refusal, silence is not.
"""

from __future__ import annotations

import socket
import ssl
from asyncio import to_thread
from typing import Any

from agentlease.errors import TLSRefused

__all__ = [
    "async_tls_refusal",
    "connection_settings",
    "sync_tls_refusal",
    "tls_reason",
    "tls_refusal",
]


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling (redis-py wraps the
    ``ssl`` error it met in its own ConnectionError)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 10:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
_NAME_MISMATCH = (62, 64)


def tls_reason(exc: BaseException, *, tls: bool = True) -> str | None:
    """Why a TLS handshake failed for good, if ``exc`` (or what it wraps) says so, else None.

    With ``tls`` (a ``rediss://`` URL), a file that cannot be read is one of the TLS files.
    """
    for link in _chain(exc):
        if tls and isinstance(link, FileNotFoundError | PermissionError | IsADirectoryError):
            return f"a TLS file (ssl_ca_certs, ssl_certfile or ssl_keyfile) cannot be read: {link}"
        if not isinstance(link, ssl.SSLError):
            continue
        # OpenSSL's words: the attributes the ssl module sets (an error made by hand has none).
        reason = str(getattr(link, "reason", None) or "").lower().replace("_", " ")
        # load_cert_chain on a file that is not PEM: library SSL, no reason, "PEM lib" in words.
        if getattr(link, "library", None) in ("PEM", "X509") or "PEM lib" in str(link):
            return (
                "the TLS files (ssl_ca_certs, ssl_certfile, ssl_keyfile) cannot be used: "
                f"{reason or link}"
            )
        if isinstance(link, ssl.SSLCertVerificationError):
            said = getattr(link, "verify_message", None) or str(link)
            code = getattr(link, "verify_code", None)
            if code in _NAME_MISMATCH or "mismatch" in said.lower():
                return (
                    f"the host name does not match the server's certificate ({said}): connect by "
                    "a name or address the certificate lists"
                )
            return (
                f"the server's certificate could not be verified ({said}): ssl_ca_certs must "
                "name the CA that signed it"
            )
        if "alert" in reason:
            if "certificate required" in reason:
                return "the server requires a client certificate: give ssl_certfile and ssl_keyfile"
            return f"the server refused the TLS handshake ({reason}): check the client certificate"
    return None


def _broken_after_handshake(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection that broke the way one does when the server ends it right
    after the handshake (what a refused client certificate looks like from the client)."""
    return any(
        isinstance(link, ssl.SSLEOFError | ConnectionResetError | BrokenPipeError)
        for link in _chain(exc)
    )


def connection_settings(client: Any) -> dict[str, Any]:
    """What ``client`` (any of redis-py's four) connects with: host, port and ``ssl_*``
    settings (a cluster's first startup node). Empty if this redis-py keeps them elsewhere."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        return dict(getattr(pool, "connection_kwargs", {}))
    nodes = getattr(client, "nodes_manager", None)
    settings = dict(getattr(nodes, "connection_kwargs", None) or {})
    startup = list((getattr(nodes, "startup_nodes", None) or {}).values())
    if not settings or not startup:
        return {}
    return {**settings, "host": startup[0].host, "port": startup[0].port}


def tls_refusal(settings: dict[str, Any], exc: BaseException, url: str) -> TLSRefused | None:
    """After ``exc`` on a TLS connection made with ``settings`` (redis-py's keyword arguments:
    host, port, ``ssl_*``) that broke as one the server refused would: one handshake with those
    settings, nothing sent, and a wait of at most a second for the server's verdict. A TLS
    alert (a client certificate required or refused) is returned as :class:`TLSRefused`;
    silence, a reply or another error mean it was not that, and give None.

    Blocking; ``async_tls_refusal`` runs it in a thread.
    """
    tls = settings.get("ssl") or "ssl_cert_reqs" in settings  # a client's, or a pool's
    if not tls or not _broken_after_handshake(exc):
        return None  # not TLS, or not broken that way: no I/O
    host = str(settings.get("host") or "localhost")
    wait = min(1.0, float(settings.get("socket_connect_timeout") or 1.0))
    try:
        # Only the server's verdict on this client matters here, not the client's on the server
        # (the connection that broke has checked it already): the probe verifies nothing.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if settings.get("ssl_certfile"):
            context.load_cert_chain(settings["ssl_certfile"], settings.get("ssl_keyfile"))
        with (
            socket.create_connection((host, int(settings.get("port") or 6379)), wait) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            tls.recv(1)
    except (OSError, ValueError) as probe:
        why = tls_reason(probe)
        return None if why is None else TLSRefused(f"Redis at {url}: TLS refused: {why}")
    return None


def sync_tls_refusal(client: Any, exc: BaseException, url: str) -> TLSRefused | None:
    """:func:`tls_refusal` with the settings of ``client``, for the synchronous face."""
    return tls_refusal(connection_settings(client), exc, url)


async def async_tls_refusal(client: Any, exc: BaseException, url: str) -> TLSRefused | None:
    """:func:`tls_refusal` with the settings of ``client``, in a thread, for the asyncio face."""
    return await to_thread(tls_refusal, connection_settings(client), exc, url)
