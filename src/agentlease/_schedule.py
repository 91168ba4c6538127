"""Schedules: when a periodic task is due, as pure arithmetic on the store's clock.

A :class:`Schedule` names a queue, a payload and a rule (a cron expression or an interval). Its
ticks are points in time that every process computes alike from the rule alone: an interval's
ticks are the whole multiples of ``every`` since the Unix epoch, a cron expression's are the
minutes it matches in its time zone. Ticks are held as integer microseconds since the epoch, so
that two processes never disagree on one by a rounding.

A tick becomes one task whose id and dedup key are derived from the schedule's name, its queue
and the tick (:meth:`Schedule.task_id`, :meth:`Schedule.dedup_key`): the store's atomic enqueue
creates it once however many schedulers fire it. Which due ticks a scheduler fires is the
misfire policy (:meth:`Schedule.due`); no policy ever fires a tick older than ``grace``.

Cron expressions are parsed by ``cronsim`` (the ``cron`` extra), imported on first use: interval
schedules need nothing beyond agentlease.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from agentlease import _validate as check
from agentlease._codec import DEFAULT_MAX_BYTES, JSON, encode
from agentlease.errors import InvalidDuration, InvalidName, InvalidSchedule, MissingDriver

if TYPE_CHECKING:
    from cronsim import CronSim

__all__ = ["MAX_CATCHUP", "Misfire", "Schedule", "Tick", "tick_label"]

Misfire = Literal["latest", "all", "skip"]
MISFIRES = ("latest", "all", "skip")

# The most ticks one pass fires for one schedule under misfire="all" (the most recent ones).
MAX_CATCHUP = 100
# The shortest interval: ticks are microseconds, and a shorter one would be a busy loop.
SHORTEST = 0.001
SECOND = 1_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A schedule's name is part of task ids and dedup keys: no colon, so that both parse back.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Tick:
    """One tick a scheduler fired.

    Attributes:
        schedule: the schedule's name.
        queue: the queue the task went to.
        at: the tick, in seconds since the epoch (the store's clock).
        task_id: the task of this tick.
        created: ``False`` when the task existed already (another scheduler fired it first).
    """

    schedule: str
    queue: str
    at: float
    task_id: str
    created: bool


def tick_label(at_us: int) -> str:
    """The tick as an ISO 8601 UTC time (``2026-12-02T00:55:00Z``; microseconds if it has any)."""
    when = _EPOCH + timedelta(microseconds=at_us)
    spec = "microseconds" if at_us % SECOND else "seconds"
    return when.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def _cronsim() -> type[CronSim]:
    try:
        from cronsim import CronSim
    except ImportError as exc:  # the cron extra is not installed
        missing = MissingDriver("cron", "cron")
        missing.args = ("cron schedules need cronsim: pip install 'agentlease[cron]'",)
        raise missing from exc
    return CronSim


class Schedule:
    """A periodic task: one task on ``queue`` at every tick of a cron expression or interval.

    Every process computes the same ticks, and each tick's task has an id and a dedup key
    derived from the schedule's name, its queue and the tick, so the store creates it once
    however many schedulers fire it (:class:`agentlease.Scheduler`).

    Misfires. A scheduler fires a tick when a pass of its loop sees it due; a tick that no pass
    saw on time (every scheduler was down, or the store was) is *missed*. ``misfire`` says which
    missed ticks still fire, and ``grace`` bounds them all: a tick older than ``grace`` seconds
    never fires, whatever the policy.

    - ``"latest"`` (default): the most recent due tick fires (if no older than ``grace``);
      earlier missed ones are dropped. A schedule runs once after an outage, not once per
      missed tick.
    - ``"all"``: every due tick of the last ``grace`` seconds fires, oldest first (at most
      100 per pass, the most recent ones).
    - ``"skip"``: ticks that came due before the scheduler started are not fired; later ones
      fire as with ``"latest"`` (a tick missed while the store was down is fired when it comes
      back, within ``grace``).

    A tick's task can be created again only once the store has forgotten it, so keep done tasks
    longer than ``grace`` (a retention shorter than ``grace`` could let a late scheduler fire a
    purged tick again).

    Args:
        name: the schedule's name (1 to 64 characters from letters, digits and ``_.-``); it
            names the tick's task, so renaming a schedule starts its ticks afresh.
        queue: the queue the tasks go to.
        cron: a five-field cron expression (minute hour day-of-month month day-of-week),
            evaluated in ``timezone``; needs the ``cron`` extra (``agentlease[cron]``).
        every: an interval in seconds (at least 0.001): ticks at its whole multiples since the
            Unix epoch (``every=3600`` fires on the hour, UTC).
        payload: the JSON payload of every task.
        misfire: ``"latest"``, ``"all"`` or ``"skip"`` (above).
        grace: the latest, in seconds, that a tick may fire after its time.
        timezone: the IANA time zone a cron expression is read in (default UTC).
        start: no tick before this time (seconds since the epoch, store clock).
        end: no tick at or after this time (seconds since the epoch, store clock).

    Raises:
        InvalidName: bad name or queue name.
        InvalidSchedule: neither or both of ``cron`` and ``every``, a bad cron expression,
            misfire policy or time zone, or ``end`` not after ``start``.
        InvalidDuration: ``every`` or ``grace`` is not a positive finite number (or ``every``
            is under 0.001 s).
        NotJSON, PayloadTooLarge: the payload was refused.
        MissingDriver: a cron expression without the ``cron`` extra installed.
    """

    __slots__ = (
        "_cron",
        "_every_us",
        "_zone",
        "cron",
        "end",
        "every",
        "grace",
        "misfire",
        "name",
        "payload",
        "queue",
        "start",
        "timezone",
    )

    def __init__(
        self,
        name: str,
        queue: str,
        *,
        cron: str | None = None,
        every: float | None = None,
        payload: JSON = None,
        misfire: Misfire = "latest",
        grace: float = 60.0,
        timezone: str = "UTC",
        start: float | None = None,
        end: float | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidName(
                f"invalid schedule name {name!r}: 1 to 64 characters from letters, digits and "
                "_.- (not starting with . or -)"
            )
        self.name = name
        self.queue = check.queue_name(queue)
        if (cron is None) == (every is None):
            raise InvalidSchedule(f"schedule {name!r} needs exactly one of cron= and every=")
        if misfire not in MISFIRES:
            raise InvalidSchedule(f"misfire must be one of {', '.join(MISFIRES)}, not {misfire!r}")
        self.misfire: Misfire = misfire
        self.grace = check.duration(grace, "grace")
        self.payload = payload
        encode(payload, limit=DEFAULT_MAX_BYTES)  # refused now, not at the first tick
        self.start = None if start is None else _instant(start, "start")
        self.end = None if end is None else _instant(end, "end")
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise InvalidSchedule(f"schedule {name!r}: end must be after start")
        self.timezone = timezone
        self.cron = cron
        self.every = every
        self._every_us = 0
        self._cron: type[CronSim] | None = None
        self._zone: ZoneInfo | None = None
        if every is not None:
            seconds = check.duration(every, "every")
            if seconds < SHORTEST:
                raise InvalidDuration(f"every must be at least {SHORTEST} s, not {every!r}")
            self.every = seconds
            self._every_us = round(seconds * SECOND)
        else:
            self._zone = _zone(timezone)
            self._cron = _parsed(cron)

    def __repr__(self) -> str:
        rule = f"cron={self.cron!r}" if self.cron is not None else f"every={self.every!r}"
        return f"Schedule({self.name!r}, {self.queue!r}, {rule}, misfire={self.misfire!r})"

    # -- identity of a tick -----------------------------------------------------------------------

    def dedup_key(self, at_us: int) -> str:
        """The dedup key of the tick's task: ``schedule:<name>:<tick in ISO 8601 UTC>``."""
        return f"schedule:{self.name}:{tick_label(at_us)}"

    def task_id(self, at_us: int) -> str:
        """The id of the tick's task: ``schedule:<queue>:<name>:<tick>``, or a digest of it when
        that would be longer than a task id may be."""
        readable = f"schedule:{self.queue}:{self.name}:{tick_label(at_us)}"
        if len(readable) <= 200:
            return readable
        return "schedule:" + hashlib.sha256(readable.encode()).hexdigest()

    # -- ticks ------------------------------------------------------------------------------------

    def due(self, now_us: int, *, fired_through: int | None, started_us: int) -> list[int]:
        """The ticks a pass at ``now_us`` fires, oldest first (microseconds since the epoch).

        Args:
            now_us: the store's clock now.
            fired_through: the latest tick this scheduler knows the store has (fired by it, or
                found there); nothing at or before it is fired again.
            started_us: when the scheduler started (its first pass), for ``misfire="skip"``.
        """
        floor = now_us - round(self.grace * SECOND)
        if fired_through is not None:
            floor = max(floor, fired_through + 1)
        if self.misfire == "skip":
            floor = max(floor, started_us)
        if self.start is not None:
            floor = max(floor, math.ceil(self.start * SECOND))
        top = now_us
        if self.end is not None:
            top = min(top, math.ceil(self.end * SECOND) - 1)
        if top < floor:
            return []
        want = MAX_CATCHUP if self.misfire == "all" else 1
        return sorted(self._back(top, floor, want))

    def next_after(self, now_us: int) -> int | None:
        """The first tick after ``now_us`` (``None``: the schedule has ended)."""
        at = self._after(now_us)
        if self.start is not None:
            first = math.ceil(self.start * SECOND)
            if at < first:
                at = self._after(first - 1)
        if self.end is not None and at >= math.ceil(self.end * SECOND):
            return None
        return at

    def _after(self, at_us: int) -> int:
        """The first tick strictly after ``at_us``."""
        if self._cron is None:
            return (at_us // self._every_us + 1) * self._every_us
        # cronsim yields the matches strictly after its start, which is a whole second here.
        start = datetime.fromtimestamp(at_us // SECOND, self._zone)
        return round(next(self._cron(self._expression, start)).timestamp()) * SECOND

    @property
    def _expression(self) -> str:
        assert self.cron is not None
        return self.cron

    def _back(self, top: int, floor: int, want: int) -> list[int]:
        """Up to ``want`` ticks in ``[floor, top]``, the most recent first."""
        out: list[int] = []
        if self._cron is None:
            at = top // self._every_us * self._every_us
            while at >= floor and len(out) < want:
                out.append(at)
                at -= self._every_us
            return out
        # cronsim's reverse iteration yields the matches strictly before its start.
        start = datetime.fromtimestamp(top // SECOND + 1, self._zone)
        for match in self._cron(self._expression, start, reverse=True):
            at = round(match.timestamp()) * SECOND
            if at < floor or len(out) >= want:
                break
            out.append(at)
        return out


def _instant(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidSchedule(f"{what} must be a finite number of seconds since the epoch")
    if not 0 <= value <= 2**40:
        raise InvalidSchedule(f"{what} is out of range: {value!r}")
    return float(value)


def _zone(name: object) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise InvalidSchedule(f"timezone must be an IANA time zone name, not {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidSchedule(f"unknown time zone {name!r}") from exc


def _parsed(expression: object) -> type[CronSim]:
    """The parser, once ``expression`` has been checked to be a valid five-field expression."""
    if not isinstance(expression, str) or len(expression.split()) != 5:
        raise InvalidSchedule(
            f"cron must be a five-field expression (minute hour day month weekday), "
            f"not {expression!r}"
        )
    parser = _cronsim()
    from cronsim import CronSimError

    try:
        parser(expression, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise InvalidSchedule(f"invalid cron expression {expression!r}: {exc}") from exc
    return parser
