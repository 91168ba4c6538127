# Generated from agentlease/backends/_async/redis_layout.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""The Redis key layout's version: a store written by a newer agentlease is refused, not used.

The key ``<prefix>:layout`` holds the number of the key layout (drawn in
:mod:`agentlease.backends.lua`) that the data under ``<prefix>`` follows. A client reads it once,
before its first call, with a plain GET (one key, routed to its own slot on a Redis Cluster;
never inside a script on another slot), and remembers the answer: no call after the first pays
a round trip for it.

* Absent: the store is new, or was written before the key existed, by a version whose layout is
  1. Either way this client reads it (layout 2 reads layout 1's data, see below), so it writes
  :data:`LAYOUT` (``SET NX``: the first writer wins, a racing client reads what it wrote) and
  goes on; existing users of an older store keep working.
* 1: the store was written by layout 1: the client moves the key to 2 and goes on.
* :data:`LAYOUT`: go on.
* Above :data:`LAYOUT`: a newer agentlease changed the layout, and this one would misread or
  corrupt it. Every call raises :class:`~agentlease.errors.SchemaTooNew`, naming both numbers,
  and writes nothing.

A future layout change raises :data:`LAYOUT` and moves the key's number only once the data is
converted, so that older clients stop at once instead of writing the old layout into it.

Layout 2 (retention) adds one ZSET per queue, ``{p:q}:f``: its done tasks by finished time,
written by ``complete`` and ``complete_many``, so that a purge of done tasks reads only what it
deletes. Layout 1's data needs no conversion to be read; its done tasks are indexed by a bounded
backfill that the first purges of each queue run (``purge.lua``). The number moves to 2 as soon
as a layout-2 client meets the store because a layout-1 client would keep completing tasks that
no index holds, which no purge would ever find: once it is 2, a layout-1 client that starts
refuses the store (one that was already running keeps going until it restarts: upgrade every
client of a store together, or purge its done tasks of that time by hand).

Written once for asyncio; ``backends/_sync/redis_layout.py`` is generated from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentlease.backends._sync.redis_link import Args, Call, Client, Keys, RedisLink
from agentlease.errors import BackendRefused, SchemaTooNew

__all__ = ["LAYOUT", "CheckedLink"]

LAYOUT = 3
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

    def _check_layout(self) -> None:
        found = super().command("GET", self.layout_key)
        if found is None and not super().command("SET", self.layout_key, LAYOUT, "NX"):
            found = super().command("GET", self.layout_key)  # another client won
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
            if version < LAYOUT:  # layout 1: read as it is (see the module docstring)
                super().command("SET", self.layout_key, LAYOUT)
        self._layout_known = True

    def script(self, name: str, keys: Keys, args: Args, *, retry: bool) -> Any:
        """Run one script (by SHA) and return its reply (see :meth:`RedisLink.script`)."""
        if not self._layout_known:
            self._check_layout()
        return super().script(name, keys, args, retry=retry)

    def command(self, *args: Any) -> Any:
        """Run one plain command (see :meth:`RedisLink.command`)."""
        if not self._layout_known:
            self._check_layout()
        return super().command(*args)

    def many(self, calls: Sequence[Call]) -> list[Any]:
        """Run commands in one pipeline (see :meth:`RedisLink.many`)."""
        if not self._layout_known:
            self._check_layout()
        return super().many(calls)
