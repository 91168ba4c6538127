"""The memory backend's idempotency keys: a dict of records and a heap by purge time.

Every method is called with the backend's lock held and the store's ``now``, so each one is one
atomic step. The heap is validated when popped (lazy deletion): purging costs O(log n) per key
purged and never looks at live keys.
"""

from __future__ import annotations

import heapq
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentlease._policy.keys import reservable
from agentlease._records import KeyHold, KeyRecord, KeyState
from agentlease.errors import ReservationLost

__all__ = ["KeyTable", "MemoryKeys"]


@dataclass(slots=True)
class _Key:
    state: KeyState
    fingerprint: str
    fence: int
    holder: str
    token: str | None
    expires_at: float | None
    created_at: float
    purge_at: float
    result_json: bytes | None = None
    error_json: bytes | None = None
    finished_at: float | None = None


class KeyTable:
    """Idempotency keys held in memory."""

    def __init__(self) -> None:
        self._keys: dict[str, _Key] = {}
        self._purge: list[tuple[float, str]] = []

    def _live(self, key: str, now: float) -> _Key | None:
        row = self._keys.get(key)
        return None if row is None or row.purge_at <= now else row

    def _set_purge(self, key: str, row: _Key, purge_at: float) -> None:
        row.purge_at = purge_at
        heapq.heappush(self._purge, (purge_at, key))

    def _held(self, hold: KeyHold, now: float) -> _Key:
        row = self._live(hold.key, now)
        if row is None or row.state != "in_flight" or row.token != hold.token:
            raise ReservationLost(
                hold.key,
                hold.fence,
                None if row is None else row.fence,
                None if row is None else row.state,
            )
        return row

    @staticmethod
    def _record(key: str, row: _Key, now: float) -> KeyRecord:
        return KeyRecord(
            key=key,
            state=row.state,
            fingerprint=row.fingerprint,
            fence=row.fence,
            holder=row.holder,
            expires_at=row.expires_at,
            result_json=row.result_json,
            error_json=row.error_json,
            created_at=row.created_at,
            finished_at=row.finished_at,
            purge_at=row.purge_at,
            now=now,
        )

    def reserve(
        self,
        key: str,
        fingerprint: str,
        holder: str,
        hold_for: float,
        window: float,
        now: float,
    ) -> KeyHold | KeyRecord:
        stale = self._keys.get(key)
        row = self._live(key, now)
        expires = now + hold_for
        if row is None:
            token = secrets.token_hex(16)
            fence = 1 if stale is None else stale.fence + 1
            row = _Key("in_flight", fingerprint, fence, holder, token, expires, now, 0.0)
            self._keys[key] = row
            self._set_purge(key, row, expires + window)
            return KeyHold(key, token, fence, expires)
        takeover = reservable(
            state=row.state,
            fingerprint=fingerprint,
            stored_fingerprint=row.fingerprint,
            held=row.token is not None,
            expires_at=row.expires_at,
            purge_at=row.purge_at,
            now=now,
        )
        if not takeover:
            return self._record(key, row, now)
        token = secrets.token_hex(16)
        row.fence += 1
        row.fingerprint = fingerprint
        row.holder = holder
        row.token = token
        row.expires_at = expires
        self._set_purge(key, row, expires + window)
        return KeyHold(key, token, row.fence, expires, taken_over=True)

    def extend(self, hold: KeyHold, hold_for: float, now: float) -> KeyHold:
        row = self._held(hold, now)
        expires = now + hold_for
        # The dedup window follows the in-flight lease: keep the distance reserve set.
        window = row.purge_at - (row.expires_at if row.expires_at is not None else now)
        row.expires_at = expires
        self._set_purge(hold.key, row, max(row.purge_at, expires + window))
        return KeyHold(hold.key, hold.token, hold.fence, expires, hold.taken_over)

    def finish(
        self,
        hold: KeyHold,
        state: KeyState,
        result_json: bytes | None,
        error_json: bytes | None,
        window: float,
        now: float,
    ) -> None:
        row = self._held(hold, now)
        row.state = state
        row.result_json = result_json
        row.error_json = error_json
        row.finished_at = now
        row.token = None
        row.holder = ""
        row.expires_at = None
        self._set_purge(hold.key, row, now + window)

    def release(self, hold: KeyHold, now: float) -> None:
        row = self._held(hold, now)
        row.token = None
        row.holder = ""
        row.expires_at = now

    def get(self, key: str, now: float) -> KeyRecord | None:
        row = self._live(key, now)
        return None if row is None else self._record(key, row, now)

    def purge(self, limit: int, now: float) -> int:
        purged = 0
        while self._purge and self._purge[0][0] <= now and purged < limit:
            purge_at, key = heapq.heappop(self._purge)
            row = self._keys.get(key)
            if row is not None and row.purge_at == purge_at:
                del self._keys[key]
                purged += 1
        return purged


class MemoryKeys:
    """The ``*_key`` primitives of the memory backend (a base of the backend class), each under
    the backend's lock."""

    if TYPE_CHECKING:
        _lock: threading.RLock
        _clock: Callable[[], float]
        _keys: KeyTable

    def reserve_key(
        self, key: str, fingerprint: str, holder: str, hold_for: float, window: float
    ) -> KeyHold | KeyRecord:
        with self._lock:
            return self._keys.reserve(key, fingerprint, holder, hold_for, window, self._clock())

    def extend_key(self, hold: KeyHold, hold_for: float) -> KeyHold:
        with self._lock:
            return self._keys.extend(hold, hold_for, self._clock())

    def complete_key(self, hold: KeyHold, result_json: bytes | None, window: float) -> None:
        with self._lock:
            self._keys.finish(hold, "done", result_json, None, window, self._clock())

    def fail_key(self, hold: KeyHold, error_json: bytes, window: float) -> None:
        with self._lock:
            self._keys.finish(hold, "failed", None, error_json, window, self._clock())

    def release_key(self, hold: KeyHold) -> None:
        with self._lock:
            self._keys.release(hold, self._clock())

    def get_key(self, key: str) -> KeyRecord | None:
        with self._lock:
            return self._keys.get(key, self._clock())

    def purge_keys(self, limit: int) -> int:
        with self._lock:
            return self._keys.purge(limit, self._clock())
