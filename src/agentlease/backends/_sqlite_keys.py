"""The SQLite backend's idempotency keys: a base of the backend class.

Keys live in ``agentlease_keys`` (schema version 2, ``sql/sqlite.sql``). ``reserve_key`` answers
a replay, a live duplicate or a conflict from a read without the write lock (the rule is
:func:`~agentlease._policy.keys.reservable`); anything else is one ``BEGIN IMMEDIATE``
transaction: one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING`` that decides
again. A key that the read found absent or past its window is inserted by a statement that
takes only such a row (a new action: no takeover to report); a key that is live by then, or was
live when read, is read again under the write lock first, to tell a takeover. The holder
writes are single statements fenced by the token; ``purge_keys`` deletes through the index on
``purge_at``.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from agentlease._policy.keys import reservable
from agentlease._records import KeyHold, KeyRecord, key_record_from_row
from agentlease.backends._sqlfile import queries
from agentlease.errors import ReservationLost

__all__ = ["SQLiteKeys"]

Q = queries("agentlease.backends.sql", "sqlite.sql")


class SQLiteKeys:
    """The ``*_key`` primitives of the SQLite backend."""

    if TYPE_CHECKING:

        def _step(self, *, write: bool) -> AbstractContextManager[sqlite3.Connection]: ...

    def reserve_key(
        self, key: str, fingerprint: str, holder: str, hold_for: float, window: float
    ) -> KeyHold | KeyRecord:
        # A replay, a live duplicate or a conflict writes nothing: answer those from a read,
        # without the write lock. Anything else is decided again under it.
        with self._step(write=False) as db:
            now = time.time()
            row = db.execute(Q["key_row"], {"key": key}).fetchone()
        if row is not None and not reservable(
            state=row[1],
            fingerprint=fingerprint,
            stored_fingerprint=row[2],
            held=row[4] != "",
            expires_at=row[5],
            purge_at=row[10],
            now=now,
        ):
            return key_record_from_row(row, now)
        with self._step(write=True) as db:  # the write lock is held from the read to the write
            now = time.time()
            expires = now + hold_for
            params = {
                "key": key,
                "fingerprint": fingerprint,
                "holder": holder,
                "now": now,
                "expires_at": expires,
                "purge_at": expires + window,
            }
            if row is None or row[10] <= now:
                # Absent or past its window when read: a new action, unless another attempt
                # came in between. The insert takes only such a row, so no takeover is won here.
                won = db.execute(Q["key_insert"], params).fetchall()  # all: it must finish
                if won:
                    ((token, fence),) = won
                    return KeyHold(key, token, fence, expires, False)
            before = db.execute(Q["key_row"], {"key": key}).fetchone()
            won = db.execute(Q["key_reserve"], params).fetchall()  # all: it must finish
        if not won:
            return key_record_from_row(before, now)
        ((token, fence),) = won
        # A row past its window was absent (a new action); a live one was taken over.
        taken_over = before is not None and before[10] > now
        return KeyHold(key, token, fence, expires, taken_over)

    def _key_write(self, name: str, hold: KeyHold, params: dict[str, Any]) -> tuple[Any, ...]:
        """One fenced key write (a single statement) and the row it returns; ReservationLost if
        the key is not held with this token."""
        with self._step(write=False) as db:
            now = time.time()
            params.update(key=hold.key, token=hold.token, now=now)
            rows = db.execute(Q[name], params).fetchall()  # all: the statement must finish
            if rows:
                return tuple(rows[0])
            row = db.execute(Q["key_fence"], {"key": hold.key, "now": now}).fetchone()
        fence, state = (None, None) if row is None else row
        raise ReservationLost(hold.key, hold.fence, fence, state)

    def extend_key(self, hold: KeyHold, hold_for: float) -> KeyHold:
        (expires,) = self._key_write("key_extend", hold, {"hold_for": hold_for})
        return KeyHold(hold.key, hold.token, hold.fence, expires, hold.taken_over)

    def complete_key(self, hold: KeyHold, result_json: bytes | None, window: float) -> None:
        params = {"state": "done", "result": result_json, "error": None, "window": window}
        self._key_write("key_finish", hold, params)

    def fail_key(self, hold: KeyHold, error_json: bytes, window: float) -> None:
        params = {"state": "failed", "result": None, "error": error_json, "window": window}
        self._key_write("key_finish", hold, params)

    def release_key(self, hold: KeyHold) -> None:
        self._key_write("key_release", hold, {})

    def get_key(self, key: str) -> KeyRecord | None:
        with self._step(write=False) as db:
            now = time.time()
            row = db.execute(Q["key_get"], {"key": key, "now": now}).fetchone()
        return None if row is None else key_record_from_row(row, now)

    def purge_keys(self, limit: int) -> int:
        with self._step(write=False) as db:  # one statement
            return db.execute(Q["key_purge"], {"now": time.time(), "limit": limit}).rowcount
