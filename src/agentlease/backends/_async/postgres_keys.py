"""The PostgreSQL backend's idempotency keys: a base of the backend class.

Keys live in ``agentlease_keys`` (migration ``0002_keys.sql``). ``reserve_key`` is one call of
``agentlease_reserve_key()``, which answers a replay, a live duplicate or a conflict from an
unlocked read and otherwise inserts, or locks the row and decides; the holder writes are one
``UPDATE`` each, fenced by the token (a refusal reads the key's fence once more to say why);
``purge_keys`` is one ``DELETE`` through the ``purge_at`` index.

Written once for asyncio; ``backends/_sync/postgres_keys.py`` is generated from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, LiteralString

from agentlease._records import KeyHold, KeyRecord, key_record_from_row
from agentlease.backends._postgres_driver import Q
from agentlease.errors import ReservationLost

__all__ = ["PostgresKeys"]

Row = tuple[Any, ...]


def _bytea(value: bytes | None) -> memoryview | None:
    """Bytes to send as ``bytea``: the pool's connections send ``bytes`` as ``json`` (see
    :func:`~agentlease.backends._postgres_driver.configure`), and a memoryview as bytea."""
    return None if value is None else memoryview(value)


class PostgresKeys:
    """The ``*_key`` primitives of the PostgreSQL backend."""

    if TYPE_CHECKING:

        async def _fetch(
            self, query: LiteralString, params: Mapping[str, Any] | None = None
        ) -> list[Row]: ...

        async def _write(self, query: LiteralString, params: Mapping[str, Any]) -> int: ...

    async def reserve_key(
        self, key: str, fingerprint: str, holder: str, hold_for: float, window: float
    ) -> KeyHold | KeyRecord:
        params = {
            "key": key,
            "fingerprint": fingerprint,
            "holder": holder,
            "hold_for": float(hold_for),
            "window": float(window),
        }
        ((token, taken_over, *row, now),) = await self._fetch(Q["key_reserve"], params)
        if token is None:
            return key_record_from_row(row, now)
        return KeyHold(key, token, row[3], row[5], taken_over)

    async def _key_lost(self, hold: KeyHold) -> ReservationLost:
        rows = await self._fetch(Q["key_fence"], {"key": hold.key})
        fence, state = rows[0] if rows else (None, None)
        return ReservationLost(hold.key, hold.fence, fence, state)

    async def extend_key(self, hold: KeyHold, hold_for: float) -> KeyHold:
        params = {"key": hold.key, "token": hold.token, "hold_for": float(hold_for)}
        rows = await self._fetch(Q["key_extend"], params)
        if not rows:
            raise await self._key_lost(hold)
        return KeyHold(hold.key, hold.token, hold.fence, rows[0][0], hold.taken_over)

    async def complete_key(self, hold: KeyHold, result_json: bytes | None, window: float) -> None:
        await self._finish_key(hold, "done", result_json, None, window)

    async def fail_key(self, hold: KeyHold, error_json: bytes, window: float) -> None:
        await self._finish_key(hold, "failed", None, error_json, window)

    async def _finish_key(
        self,
        hold: KeyHold,
        state: str,
        result_json: bytes | None,
        error_json: bytes | None,
        window: float,
    ) -> None:
        params = {
            "key": hold.key,
            "token": hold.token,
            "state": state,
            "result": _bytea(result_json),
            "error": _bytea(error_json),
            "window": float(window),
        }
        if await self._write(Q["key_finish"], params) != 1:
            raise await self._key_lost(hold)

    async def release_key(self, hold: KeyHold) -> None:
        if await self._write(Q["key_release"], {"key": hold.key, "token": hold.token}) != 1:
            raise await self._key_lost(hold)

    async def get_key(self, key: str) -> KeyRecord | None:
        rows = await self._fetch(Q["key_get"], {"key": key})
        if not rows:
            return None
        *row, now = rows[0]
        return key_record_from_row(row, now)

    async def purge_keys(self, limit: int) -> int:
        return await self._write(Q["key_purge"], {"limit": limit})
