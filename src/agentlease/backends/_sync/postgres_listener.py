# Generated from agentlease/backends/_async/postgres_listener.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""LISTEN/NOTIFY for idle workers: return early when work may have arrived in a queue.

Each backend object owns at most one listening connection, opened on the first wait and kept
outside the pool (a pooled connection would carry its LISTENs to other users). Writers notify
the queue's channel (:func:`~agentlease.backends._postgres_driver.channel`) in the same
statement that makes work ready, so the notification is delivered only if that work committed.

A wait is a hint, never a guarantee: on any failure of the listening connection (a restart, a
network cut) the connection is dropped and the wait sleeps out its timeout, so an idle worker
polls at its usual pace instead of spinning, and the next wait reconnects and listens again.

Written once for asyncio; ``backends/_sync/postgres_listener.py`` is generated from it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psycopg
from psycopg import Connection, sql

from agentlease.backends import _postgres_driver as pg
from agentlease.backends._postgres_url import PostgresSettings

__all__ = ["Listener"]


class Listener:
    """One LISTEN connection, shared by every wait of one backend object.

    Args:
        settings: the server and schema; channels are derived from the schema and queue.
    """

    def __init__(self, settings: PostgresSettings) -> None:
        self._settings = settings
        self._conn: Connection[Any] | None = None
        self._listening: set[str] = set()
        self._arrived: set[str] = set()  # channels notified and not yet consumed by a wait
        self._lock = pg.sync_lock()
        self._closed = False

    def wait(self, queue: str, timeout: float) -> None:
        """Return when ``queue`` is notified, or after ``timeout`` seconds; never raises for a
        store failure (the caller polls anyway)."""
        name = pg.channel(self._settings.schema, queue)
        deadline = time.monotonic() + timeout
        while True:
            if name in self._arrived:
                self._arrived.discard(name)
                return
            if time.monotonic() >= deadline:
                return
            with self._lock:
                left = deadline - time.monotonic()
                if name in self._arrived or left <= 0:
                    continue
                if not self._closed:
                    try:
                        conn = self._listen(name)
                        # stop_after=1: one notification (for any queue) ends this read, so
                        # that a wait for another queue, queued on the lock, sees its own at once.
                        for note in conn.notifies(timeout=left, stop_after=1):
                            self._arrived.add(note.channel)
                        continue
                    except psycopg.Error:
                        self._drop()
            pg.sync_sleep(max(0.0, deadline - time.monotonic()))
            return

    def _listen(self, name: str) -> Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed:
            self._listening.clear()
            conn = Connection.connect(
                self._settings.conninfo,
                **self._settings.connect_kwargs(),
            )
            self._conn = conn
        if name not in self._listening:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(name)))
            self._listening.add(name)
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._listening.clear()
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def close(self) -> None:
        """Close the listening connection; later waits only sleep."""
        self._closed = True
        with self._lock:
            self._drop()
