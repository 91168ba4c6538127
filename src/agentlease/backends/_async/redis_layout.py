"""The Redis key layout's version: a store written by a newer agentlease is refused, not used.

The key ``<prefix>:layout`` holds the number of the key layout (drawn in
:mod:`agentlease.backends.lua`) that the data under ``<prefix>`` follows. A client reads it once,
before its first call, with a plain GET (one key, routed to its own slot on a Redis Cluster;
never inside a script on another slot), and remembers the answer: no call after the first pays
a round trip for it.

* Absent: the store is new, or was written before the key existed, by a version whose layout is
  :data:`LAYOUT` 1 (the only one so far). Either way its data follows layout 1, so the client
  writes it (``SET NX``: the first writer wins, a racing client reads what it wrote) and goes
  on; existing users of an older store keep working.
* Not above :data:`LAYOUT`: go on.
* Above :data:`LAYOUT`: a newer agentlease changed the layout, and this one would misread or
  corrupt it. Every call raises :class:`~agentlease.errors.SchemaTooNew`, naming both numbers,
  and writes nothing.

A future layout change raises :data:`LAYOUT` and moves the key's number only once the data is
converted, so that older clients stop at once instead of writing the old layout into it.

Written once for asyncio; ``backends/_sync/redis_layout.py`` is generated from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentlease.backends._async.redis_link import Args, Call, Client, Keys, RedisLink
from agentlease.errors import BackendRefused, SchemaTooNew

__all__ = ["LAYOUT", "CheckedLink"]

LAYOUT = 1
"""The newest key layout this agentlease reads and writes."""


class CheckedLink(RedisLink):
    """A :class:`RedisLink` that checks the store's layout version before its first call.

    Args:
        client: the client (plain or cluster).
        url: how the store is named in errors (no password).
        prefix: the first part of every key; the version lives in ``<prefix>:layout``.
    """

    def __init__(self, client: Client, url: str, prefix: str) -> None:
        super().__init__(client, url)
        self.layout_key = f"{prefix}:layout"
        self._layout_known = False

    async def _check_layout(self) -> None:
        found = await super().command("GET", self.layout_key)
        if found is None and not await super().command("SET", self.layout_key, LAYOUT, "NX"):
            found = await super().command("GET", self.layout_key)  # another client won
        if found is not None:
            try:
                version = int(found)
            except ValueError:
                raise BackendRefused(
                    f"Redis at {self.url}: key {self.layout_key!r} holds {found!r}, not a layout "
                    "version: the prefix is in use by something other than agentlease"
                ) from None
            if version > LAYOUT:
                raise SchemaTooNew(f"Redis at {self.url}", "key layout", version, LAYOUT)
        self._layout_known = True

    async def script(self, name: str, keys: Keys, args: Args, *, retry: bool) -> Any:
        """Run one script (by SHA) and return its reply (see :meth:`RedisLink.script`)."""
        if not self._layout_known:
            await self._check_layout()
        return await super().script(name, keys, args, retry=retry)

    async def command(self, *args: Any) -> Any:
        """Run one plain command (see :meth:`RedisLink.command`)."""
        if not self._layout_known:
            await self._check_layout()
        return await super().command(*args)

    async def many(self, calls: Sequence[Call]) -> list[Any]:
        """Run commands in one pipeline (see :meth:`RedisLink.many`)."""
        if not self._layout_known:
            await self._check_layout()
        return await super().many(calls)
