# Generated from agentlease/backends/_async/redis_link.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""The Redis backend's connection: runs scripts and commands, retries what is safe to repeat,
and turns every driver error into an agentlease error.

Written once for asyncio; ``backends/_sync/redis_link.py`` is generated from it.

redis-py is told to retry nothing, because only the backend knows which calls are safe to send
twice. Within about a second (50, 100, 200 ms apart), a call is sent again when Redis refused it
without running it (LOADING, READONLY, TRYAGAIN, CLUSTERDOWN, BUSY) or the connection could not
be made; when a connection broke or timed out mid-call, the reply may be lost after the store
applied the call, so only calls marked ``retry`` are sent again: reads, extensions, and writes
that carry a request nonce the scripts recognise (a replayed write is answered as applied, never
as a lost lease). A claim is not sent again: a lost reply would lease tasks nobody holds, which
the reaper requeues once their lease runs out. After that the caller gets BackendUnavailable.

A script the server does not know (NOSCRIPT: a restart, a failover, ``SCRIPT FLUSH``) was not
run: the call is sent again whole (EVAL with the script's text), to the node it was meant for,
which runs it and keeps it for the next EVALSHA. Nothing is loaded anywhere else, so on a Redis
Cluster a master that is down costs only the calls to its own queues.

On a plain Redis (not a cluster), scripts go over a connection the link keeps checked out of
redis-py's pool for its own use: packed by hiredis (as redis-py's own serializer does, without
its per-argument checks), sent with the connection's ``send_packed_command`` and read with its
``read_response``, which skips the client's per-command work (a pool checkout and return, the
retry wrapper, metrics hooks): about half of the client's time per call. One caller at a time
uses that connection; a caller that finds it busy (another thread, or another task of the event
loop) goes through the client and the pool as before, so nobody waits for it. A connection that
failed or was interrupted mid-call (a broken socket, a timeout, a cancelled task) is closed and
given back, and the next call takes a fresh one; one the server closed while it sat idle is seen
by polling its socket before the call goes out, and reconnected; a forked child never uses its
parent's. Plain
commands, whose replies redis-py reshapes, and pipelines always go through the client.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from redis import exceptions as rx

from agentlease.backends import _redis_tls, _redis_url
from agentlease.backends.lua import SCRIPTS
from agentlease.errors import BackendError, BackendUnavailable

__all__ = ["Call", "Client", "RedisLink"]

Keys = Sequence[str]
Args = Sequence[Any]
Call = tuple[Any, ...]
"""One command for :meth:`RedisLink.many`: its arguments, as for ``execute_command``."""

RETRY_WINDOW = 1.0  # seconds within which a call may be sent again
BACKOFF = 0.05  # the first pause; it doubles
# Refused without being run: safe to send again whatever the call.
_REFUSED = (rx.BusyLoadingError, rx.ReadOnlyError, rx.TryAgainError, rx.ClusterDownError)
# The reply may be lost after the store applied the call: repeat only calls marked retry.
_BROKEN = (rx.ConnectionError, rx.TimeoutError)
_FATAL = (rx.AuthenticationError, rx.AuthorizationError, rx.MaxConnectionsError)

_ERRORS = _redis_url.DRIVER_ERRORS
_PACK = _redis_url.PACK

Client = _redis_url.redis_sync.Redis | _redis_url.redis_sync.RedisCluster


def _repeatable(exc: Exception, retry: bool, tls: bool = False) -> bool:
    """Whether a call that raised ``exc`` may be sent again (never after a TLS refusal)."""
    if isinstance(exc, _FATAL) or _redis_tls.tls_reason(exc, tls=tls) is not None:
        return False
    if isinstance(exc, _REFUSED) or str(exc).startswith(_redis_url.REFUSED_REPLIES):
        return True
    if isinstance(exc, _BROKEN):
        # redis-py says "... connecting to ..." when the connection was never made.
        return retry or "connecting" in str(exc)
    return False


class RedisLink:
    """A redis-py client and the rules for using it.

    Args:
        client: the client (plain or cluster).
        url: how the store is named in errors (no password).
    """

    def __init__(self, client: Client, url: str) -> None:
        self.client = client
        self.url = url
        self._command: Any = client.execute_command  # untyped in redis-py's sync client
        # Scripts: through the link's own connection on a plain Redis (see the module docstring).
        self._execute: Any = self._command
        self._pool: Any = None
        self._take: tuple[str, ...] = ()
        if _PACK is not None and not isinstance(client, _redis_url.redis_sync.RedisCluster):
            self._pool = client.connection_pool
            self._take = _redis_url.pool_args(self._pool)
            self._execute = self._direct
        self._own: Any = None  # the connection, once taken from the pool
        self._forks = _redis_url.forks()  # in the process that took it
        self._gate = _redis_url.sync_gate()

    def _direct(self, *call: Any) -> Any:
        """Send ``call`` on the link's own connection and return the reply; through the client
        if another caller is using the connection."""
        gate = self._gate
        if not gate.acquire(False):
            return self._command(*call)
        try:
            conn = self._own
            if conn is None or self._forks != _redis_url.forks():
                self._forks = _redis_url.forks()  # a forked child takes its own (the pool resets)
                conn = self._own = self._pool.get_connection(*self._take)
            self._check(conn)
            try:
                conn.send_packed_command([_PACK(call)])  # type: ignore[misc]
                return conn.read_response()
            except rx.ResponseError:
                raise  # the whole reply was read: the connection is fine
            except BaseException:
                self._own = None  # interrupted mid-call: what it would read next is unknown
                self._drop(conn)
                raise
        finally:
            gate.release()

    @staticmethod
    def _check(conn: Any) -> None:
        """Before a call: a connection the server closed while it sat idle (a restart, its
        ``timeout``) is closed, and ``send_packed_command`` connects again, so that a call never
        goes out on a dead socket."""
        stale = _redis_url.closed_while_idle(conn)
        if stale is None:  # not connected (or no socket to see): ask redis-py, as its pool does
            # Its asyncio connections have can_read only from redis-py 8.0 (before:
            # can_read_destructive, which 8.0 deprecates); its sync ones have always had it.
            probe = getattr(conn, "can_read", None) or conn.can_read_destructive
            try:
                stale = probe()
            except (rx.RedisError, OSError):
                stale = True
        if stale:
            conn.disconnect()

    def _drop(self, conn: Any) -> None:
        """Close a connection of the link's and give it back to the pool."""
        try:
            conn.disconnect()
        finally:
            self._pool.release(conn)

    def _recover(
        self,
        exc: Exception,
        send: Callable[[], Any],
        retry: bool,
        whole: Callable[[], Any] | None = None,
    ) -> Any:
        """After ``exc``: ``send()`` again until it succeeds or may not be repeated; ``whole()``
        instead once the server says it does not know the script (it was not run)."""
        started = time.monotonic()
        pause = BACKOFF
        while True:
            if isinstance(exc, rx.NoScriptError) and whole is not None:
                send, whole = whole, None
            else:
                late = time.monotonic() - started + pause > RETRY_WINDOW
                if late or not _repeatable(exc, retry, self.url.startswith("rediss:")):
                    raise self._refusal(exc) from exc
                _redis_url.sync_sleep(pause)
                pause *= 2
            try:
                return send()
            except _ERRORS as again:
                exc = again

    def _refusal(self, exc: Exception) -> BackendError:
        """The agentlease error for ``exc``; on a TLS connection that broke as one the server
        refused would, the server is asked why (see :func:`_redis_tls.tls_refusal`)."""
        error = _redis_url.translate(self.url, exc)
        if isinstance(error, BackendUnavailable):
            refused = _redis_tls.sync_tls_refusal(self.client, exc, self.url)
            if refused is not None:
                return refused
        return error

    def _pipeline(self, calls: Sequence[Call]) -> list[Any]:
        results: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        whole = False  # scripts by SHA first; those the server does not know, then by text
        while pending:
            pipe: Any = self.client.pipeline(transaction=False)
            for i in pending:
                pipe.execute_command(*_expand(calls[i], whole))
            replies = pipe.execute(raise_on_error=False)
            missing = []
            for i, reply in zip(pending, replies, strict=True):
                if isinstance(reply, rx.NoScriptError) and not whole:
                    missing.append(i)
                elif isinstance(reply, _ERRORS):
                    raise reply
                else:
                    results[i] = reply
            whole = True
            pending = missing
        return results

    def script(self, name: str, keys: Keys, args: Args, *, retry: bool) -> Any:
        """Run one script (by SHA) and return its reply."""
        call = ("EVALSHA", SCRIPTS[name].sha, len(keys), *keys, *args)
        try:
            return self._execute(*call)
        except _ERRORS as exc:
            return self._recover(
                exc,
                lambda: self._execute(*call),
                retry,
                lambda: self._execute("EVAL", SCRIPTS[name].text, *call[2:]),
            )

    def command(self, *args: Any) -> Any:
        """Run one plain command (safe to repeat) and return its reply."""
        try:
            return self._command(*args)
        except _ERRORS as exc:
            return self._recover(exc, lambda: self._command(*args), True)

    def many(self, calls: Sequence[Call]) -> list[Any]:
        """Run commands that are all safe to repeat in one pipeline (one round trip per node),
        not as a transaction.

        Script calls are given as ``("EVALSHA", name, keys, args)`` and sent by SHA; those the
        server did not know are sent again with the script's text.
        """
        if not calls:
            return []
        try:
            return self._pipeline(calls)
        except _ERRORS as exc:
            results: list[Any] = self._recover(exc, lambda: self._pipeline(calls), True)
            return results

    def close(self) -> None:
        """Close the client's connections."""
        try:
            conn, self._own = self._own, None
            if conn is not None and self._forks == _redis_url.forks():
                self._pool.release(conn)
            _redis_url.closer(self.client)()
        except _ERRORS as exc:
            raise _redis_url.translate(self.url, exc) from exc


def _expand(call: Call, whole: bool = False) -> Call:
    """A call of :meth:`RedisLink.many` as redis-py takes it: a script by SHA, or by its text
    (``whole``)."""
    if call[0] == "EVALSHA":
        _, name, keys, args = call
        script = SCRIPTS[name]
        if whole:
            return ("EVAL", script.text, len(keys), *keys, *args)
        return ("EVALSHA", script.sha, len(keys), *keys, *args)
    return call
