"""The Redis backend's idempotency keys: one hash per key, one Lua script per primitive.

Written once for asyncio; ``backends/_sync/redis_keys.py`` is generated from it.

Each key is the hash ``<prefix>:key:{<key>}``: the key is its own hash tag, so keys spread over
a Redis Cluster and every script touches that one hash, given in ``KEYS``. Times come from
``redis.call('TIME')`` inside the scripts. Every write moves the hash's expiry to its purge time,
so Redis deletes keys past the dedup window itself (``purge_keys`` has nothing to do) and a hash
it has not deleted yet is treated as absent by every script.

Every call is safe to send again after a lost reply: the reservation token is drawn here, so a
resent reserve finds its own token and gets its reservation back; complete, fail and release
carry a request nonce that the key keeps, so a resent one is answered as applied; an extend
repeats harmlessly; a read is a read.
"""

from __future__ import annotations

import os
from typing import Any

from agentlease._records import KeyHold, KeyRecord
from agentlease.backends._async.redis_link import RedisLink
from agentlease.backends.lua import key_hash, key_hold_from, key_record_from
from agentlease.errors import ReservationLost

__all__ = ["RedisKeys"]


def _nonce() -> str:
    """A request nonce: lets a script recognise a retry of a write it already applied."""
    return os.urandom(8).hex()


class RedisKeys:
    """The ``*_key`` primitives of the Redis backend (a base of the backend class)."""

    _link: RedisLink
    _prefix: str

    async def _key_write(self, name: str, hold: KeyHold, args: tuple[object, ...]) -> Any:
        """Run a fenced write on ``hold``'s key and return its reply; raise ReservationLost if
        the reservation is not held."""
        keys = (key_hash(self._prefix, hold.key),)
        reply = await self._link.script(name, keys, (hold.token, *args), retry=True)
        if reply[0] == b"lost":
            state = None if reply[2] is None else reply[2].decode()
            raise ReservationLost(hold.key, hold.fence, reply[1], state)
        return reply

    async def reserve_key(
        self, key: str, fingerprint: str, holder: str, hold_for: float, window: float
    ) -> KeyHold | KeyRecord:
        token = os.urandom(16).hex()
        args = (fingerprint, holder, hold_for, window, token)
        keys = (key_hash(self._prefix, key),)
        reply = await self._link.script("key_reserve", keys, args, retry=True)
        if reply[0] == b"hold":
            return key_hold_from(key, token, reply)
        return key_record_from(key, reply[1:])

    async def extend_key(self, hold: KeyHold, hold_for: float) -> KeyHold:
        reply = await self._key_write("key_extend", hold, (hold_for,))
        return KeyHold(hold.key, hold.token, hold.fence, float(reply[1]), hold.taken_over)

    async def complete_key(self, hold: KeyHold, result_json: bytes | None, window: float) -> None:
        await self._key_write("key_complete", hold, (_nonce(), result_json or b"", window))

    async def fail_key(self, hold: KeyHold, error_json: bytes, window: float) -> None:
        await self._key_write("key_fail", hold, (_nonce(), error_json, window))

    async def release_key(self, hold: KeyHold) -> None:
        await self._key_write("key_release", hold, (_nonce(),))

    async def get_key(self, key: str) -> KeyRecord | None:
        keys = (key_hash(self._prefix, key),)
        reply = await self._link.script("key_get", keys, (), retry=True)
        return None if reply is None else key_record_from(key, reply)

    async def purge_keys(self, limit: int) -> int:
        """Nothing to do: Redis expires every key at its purge time (PEXPIREAT)."""
        return 0
