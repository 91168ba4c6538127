"""The Redis key layout's version: a store written by a newer agentlease is refused, not used.

The key ``<prefix>:layout`` holds the number of the key layout (drawn in
:mod:`agentlease.backends.lua`) that the data under ``<prefix>`` follows. A client reads it once,
before its first call, with a plain GET (one key, routed to its own slot on a Redis Cluster;
never inside a script on another slot), and remembers the answer: no call after the first pays
a round trip for it.

* Absent: the store is new, or was written before the key existed, by a version whose layout is
  1. Either way this client reads it (layouts 2 and 3 read layout 1's data, see below), so it
  writes :data:`LAYOUT` (``SET NX``: the first writer wins, a racing client reads what it wrote)
  and goes on; existing users of an older store keep working.
* 1 or 2: the store was written by an older layout: the client moves the key to
  :data:`LAYOUT` and goes on (neither needs converting, see below).
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

Layout 3 (plans, the approval gates) adds two things. A counter gains a version,
``<prefix>:ctr:{<name>}:v`` beside it in its hash tag, raised by every script that changes the
stored value (``counter_add``, ``hold_take``, ``hold_release``, ``hold_commit``, and the give-back
of expired holds in any counter script), so that a plan can tell a counter that moved and came
back (no ABA). A counter written before layout 3 has no version key: it reads as version 0 with
its value, and its first change makes it 1; nothing is converted. And a name of a *state space*,
``"<space>|<name>"`` (``|`` is never part of a plain name), is placed in the space's hash tag
``{<prefix>:sp:<space>}`` instead of its own, so that the records and counters of one space (and
the receipts of the plans over them) live on one Redis Cluster slot, and a plan over them is one
script; plain names keep the keys they had, so existing records and counters are untouched. The
number moves to 3 as soon as a layout-3 client meets the store because a layout-2 client would
change counters without raising their versions, and a plan acting after it would miss the
change: once it is 3, a layout-2 client that starts refuses the store with SchemaTooNew (one
that was already running keeps going until it restarts, and its counter changes are invisible
to plans: upgrade every client of a store together).

Written once for asyncio; ``backends/_sync/redis_layout.py`` is generated from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentlease.backends._async.redis_link import Args, Call, Client, Keys, RedisLink
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
            if version < LAYOUT:  # layouts 1 and 2: read as they are (see the module docstring)
                await super().command("SET", self.layout_key, LAYOUT)
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
