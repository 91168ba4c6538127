# Generated from agentlease/_async/holds.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""Counter holds: units of a bounded counter taken under a lease, so that a holder that dies
gives them back.

Written once for asyncio; the synchronous face is generated from this file by scripts/unasync.py.

:meth:`SharedState.reserve <agentlease.SharedState.reserve>` takes units for good: a
process that crashes between reserving and releasing leaks them for ever (ten seats, one holder
SIGKILLed: nine seats left, permanently). A hold takes them the same way, against the same limit
(the held units are in the counter's value while the hold lives), but with a TTL on the store's
clock that the client's shared renewer extends every third of it. When the holder stops renewing
(it died, froze, or lost the store) the units go back to the counter ``ttl`` later: every step
that reads or writes that counter first gives back the units of its holds that ran out, so no
reaper has to run. Ending the hold either commits it (the units stay taken, as ``reserve`` would
have left them; or, settling, another number of units stays taken in their place: a spend
reserved with an estimate and settled with the actual amount) or releases it (they go back).
Each hold has a random token: a renewal, release or commit with the token of a hold that ran out
or already ended is refused (:class:`~agentlease.errors.HoldLost`) and changes nothing.

As for lock sets, the holder keeps a local deadline on the monotonic clock (``ttl`` after its last
successful renewal was sent): past it, :meth:`CounterHold.check` and
:meth:`CounterHold.commit` act as if the hold were lost, whatever the store says later.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from agentlease import _clock
from agentlease import _validate as check
from agentlease.errors import HoldLost, InvalidInput

if TYPE_CHECKING:
    from agentlease._renewal import Renewing

    from .state import SharedState

__all__ = ["CounterHold"]


class CounterHold:
    """Units of a bounded counter held under a lease; use as
    ``with state.hold("seats", 2, limit=10, ttl=30) as held`` (see
    :meth:`SharedState.hold <agentlease.SharedState.hold>`).

    Attributes:
        name: the counter.
        units: how many units are held.
        limit: the counter's maximum, shared with ``reserve``.
        ttl: seconds the hold outlives its holder's last renewal.
        token: the hold's random token (the store refuses any other).
        value: the counter's value just after the hold was taken (``None`` before).
    """

    def __init__(
        self, state: SharedState, name: str, units: int, limit: int, ttl: float
    ) -> None:
        self.name = name
        self.units = units
        self.limit = limit
        self.ttl = ttl
        self.token = os.urandom(16).hex()
        self.value: int | None = None
        self._state = state
        self._renewal: Renewing | None = None
        self._deadline = 0.0  # _clock.monotonic() past which the hold counts as lost
        self._ended: Literal["committed", "released", "lost"] | None = None

    def _lost(self, detail: str) -> HoldLost:
        self._ended = "lost"
        return HoldLost(self.name, self.units, detail)

    def _renew(self) -> None:
        """Extend the hold in the store (the shared renewer calls this every third of the TTL)."""
        sent = _clock.monotonic()
        if not self._state.backend.extend_hold(self.name, self.token, self.ttl):
            raise HoldLost(self.name, self.units, "a renewal found it run out or ended")
        self._deadline = sent + self.ttl

    def _stop_renewing(self) -> HoldLost | None:
        """Stop the renewals; the refusal that stopped them earlier, if one did."""
        renewal, self._renewal = self._renewal, None
        if renewal is None:
            return None
        try:
            self._state._renewals.close(renewal)
        except HoldLost as error:
            self._ended = "lost"
            return error
        return None

    def check(self) -> None:
        """Raise :class:`~agentlease.errors.HoldLost` if a renewal found the hold gone, or if
        its local deadline passed without a renewal: stop using what the units stood for.
        A committed or released hold passes."""
        if self._renewal is not None and self._renewal.lost is not None:
            raise self._renewal.lost
        if self._ended == "lost":
            raise HoldLost(self.name, self.units, "it ran out")
        if self._ended is None and _clock.monotonic() >= self._deadline:
            raise HoldLost(self.name, self.units, "its TTL passed here without a renewal")

    def commit(self, units: int | None = None) -> None:
        """Keep the units taken for good, as :meth:`~SharedState.reserve` would have (give
        them back later with :meth:`~SharedState.release`), and stop renewing.

        Args:
            units: settle instead: keep this many units taken in place of those held (more or
                fewer), in the same atomic step, so the counter moves by ``units - held``. No
                limit is checked: the hold reserved the room, and the actual amount is what it
                is. ``None`` keeps the units held.

        Raises:
            HoldLost: the hold ran out (in the store, or past its local deadline) or already
                ended; nothing was taken, and the units are back in the counter.
            InvalidInput: ``units`` is not an int from 0 to the counters' range; nothing
                changed and the hold is still held.
        """
        if units is not None:
            units = check.integer(units, "units", low=0, high=check.EXACT_INT)
        if self._ended is not None:
            raise HoldLost(self.name, self.units, f"it was already {self._ended}")
        lost = self._stop_renewing()
        if lost is not None:
            raise lost
        backend = self._state.backend
        if _clock.monotonic() >= self._deadline:
            self._ended = "lost"
            backend.release_hold(self.name, self.token)  # give the units back now
            raise HoldLost(self.name, self.units, "its TTL passed here without a renewal")
        self._ended = "committed"  # if the call fails, the hold runs out: never released twice
        if not backend.commit_hold(self.name, self.token, units):
            raise self._lost("it ran out before the commit")

    def release(self) -> None:
        """Give the units back now and stop renewing (leaving the block does it too).

        Raises:
            HoldLost: the hold had already run out (its units were given back then) or ended.
        """
        if self._ended is not None:
            raise HoldLost(self.name, self.units, f"it was already {self._ended}")
        lost = self._stop_renewing()
        self._ended = "released"
        released = self._state.backend.release_hold(self.name, self.token)
        if lost is not None:
            raise lost
        if not released:
            raise self._lost("it ran out before the release")

    def __enter__(self) -> CounterHold:
        if self.value is not None:
            raise InvalidInput(f"the hold on counter {self.name!r} was entered already")
        sent = _clock.monotonic()
        backend = self._state.backend
        self.value = backend.hold_counter(
            self.name, self.token, self.units, self.limit, self.ttl
        )
        self._deadline = sent + self.ttl
        self._renewal = self._state._renewals.open(self, self.ttl, sent=sent)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._ended is not None:
            return  # committed or released in the block (or found lost there)
        lost = self._stop_renewing()
        self._ended = "released"
        released = self._state.backend.release_hold(self.name, self.token)
        if exc is not None:
            return  # the body's own error says more than a lost hold would
        if lost is not None:
            raise lost
        if not released:
            raise self._lost("it ran out before release (renewals failed?)")
