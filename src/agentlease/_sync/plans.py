# Generated from agentlease/_async/plans.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""Approval gates that refuse a stale plan.

Written once for asyncio; the synchronous face is generated from this file by scripts/unasync.py.

A human approval can land hours after an agent formed its plan, and the world moves meanwhile.
A plan records what it read and declares what it will write; approving it acts only on an
unchanged world::

    with state.plan(step="refund-42") as plan:
        order = state.get("order:42")            # recorded: key and version
        refunded = state.counter("refunds")      # recorded: value's version (no ABA)
        plan.set_field("order:42", "status", "refunded")
        plan.add("refunds", 1)
    sealed = plan.seal()                         # JSON: store it in a task, a checkpoint
    ...
    receipt = state.act(sealed, approved_by="ada")  # another process, hours later

* **Reads.** Inside the block every read through that state object (``get``, ``counter``,
  ``counter_version``) is recorded, in the current task only (a context variable, so concurrent
  asyncio tasks do not mix plans): the first read of a name is kept; a second read that finds
  another version raises :class:`~agentlease.errors.StalePlan` at once. A record write declared
  on a name the plan has not read first reads it, so every record the plan writes is checked.
  Pins (:meth:`Plan.pin`) record the version column of a row of the user's own table, on
  the stores whose database holds it (SQLite, PostgreSQL); elsewhere they are refused at once.
* **Writes** are declared on the plan (encoded and validated as the state's own writes are) and
  applied only by the approval, in the store's one atomic step, after every read was compared
  with its current version. Writes made through the state itself inside the block act at once,
  as ever; they are not part of the plan (and they move what the plan read).
* **The sealed plan** is JSON text: format version, id, step, state space, ``created_at`` and
  ``not_after`` (on the store's clock), ``keep_for``, reads, pins, writes, and ``mac``: an
  HMAC-SHA256 under the store's plan secret over the canonical JSON (sorted keys) of everything
  else. An edited plan, or one sealed by another store, is refused
  (:class:`~agentlease.errors.PlanRefused`) before anything is read; so is anything that is not a
  well-formed plan. The secret itself never leaves the store and this process's memory.
* **Approval** (:meth:`Plan.act`, :meth:`SharedState.act`): approving twice acts once
  (the plan id keys a receipt the store keeps ``keep_for`` seconds); a plan past ``not_after``
  raises :class:`~agentlease.errors.PlanExpired`; a moved read raises StalePlan naming each key
  with the version read and the version now, and nothing is written.
"""

from __future__ import annotations

import hmac
import math
import uuid
from contextvars import ContextVar, Token
from hashlib import sha256
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import orjson

from agentlease import _guards
from agentlease import _validate as check
from agentlease._codec import DEFAULT_MAX_BYTES, JSON, encode
from agentlease._pins import pin_key
from agentlease._policy.transitions import StateMachine
from agentlease._records import PlanRead, PlanReceipt, PlanWrite, RecordWrite, StaleRead
from agentlease.errors import AgentLeaseError, PlanRefused, StalePlan

if TYPE_CHECKING:
    from .state import SharedState

__all__ = ["FORMAT", "Plan", "act_sealed", "current_plan"]

FORMAT = 1
"""The version of the sealed plan's JSON format; a plan of another format is refused."""

DEFAULT_KEEP_FOR = 30 * 86400.0
_MAX_APPROVER = 200
_MAX_STEP = 200
_CURRENT: ContextVar[Plan | None] = ContextVar("agentlease_plan", default=None)
_FLOOR, _CEILING = -check.EXACT_INT, check.EXACT_INT


def current_plan(state: object) -> Plan | None:
    """The plan open in this context on ``state`` (``None``: reads are not recorded)."""
    plan = _CURRENT.get()
    return plan if plan is not None and plan.state is state else None


def _secret(state: SharedState) -> bytes:
    """The store's plan secret, read once per state object (it never changes once made)."""
    if state._plan_secret is None:
        state._plan_secret = state.backend.plan_secret()
    return state._plan_secret


def _mac(secret: bytes, body: dict[str, Any]) -> str:
    canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    return hmac.new(secret, canonical, sha256).hexdigest()


class Plan:
    """A plan: what it read, what it will write; made by :meth:`SharedState.plan`.

    Attributes:
        id: the plan's id (32 hex digits): the key of its receipt, so it acts once.
        step: the step it is for, as given.
    """

    def __init__(
        self, state: SharedState, step: str, expires_in: float | None, keep_for: float
    ) -> None:
        self.state = state
        self.id = uuid.uuid4().hex
        self.step = step
        self._expires_in = expires_in
        self._keep_for = keep_for
        self._reads: dict[tuple[str, str], int] = {}  # (kind, name) -> version, in read order
        self._pins: dict[str, tuple[dict[str, Any], int]] = {}  # pin key -> (its JSON, version)
        self._writes: list[dict[str, Any]] = []
        self._created_at: float | None = None
        self._token: Token[Plan | None] | None = None
        self._sealed: str | None = None

    def __repr__(self) -> str:
        return (
            f"<Plan {self.id} step={self.step!r} reads={len(self._reads) + len(self._pins)}"
            f" writes={len(self._writes)}>"
        )

    def __enter__(self) -> Plan:
        if self._token is not None or self._sealed is not None:
            raise PlanRefused("a plan is entered once", plan_id=self.id)
        self._created_at = self.state.backend.now()
        self._token = _CURRENT.set(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token, self._token = self._token, None
        if token is not None:
            _CURRENT.reset(token)

    # -- what the plan read ---------------------------------------------------------------------

    def _saw(self, kind: Literal["record", "counter"], name: str, version: int) -> None:
        """Record a read (the first of each name is kept); a later read at another version
        means the plan is stale already."""
        self._open()
        first = self._reads.setdefault((kind, name), version)
        if first != version:
            raise StalePlan(self.id, [StaleRead(kind, self.state._key(name), first, version)])

    def _open(self) -> None:
        if self._sealed is not None:
            raise PlanRefused("the plan is sealed: it can no longer change", plan_id=self.id)

    # -- what the plan will write ---------------------------------------------------------------

    def _record(self, key: str, fields: dict[str, bytes], write: RecordWrite) -> None:
        self._open()
        if ("record", key) not in self._reads:
            self.state.get(key)  # a record the plan writes is one it read
        machine = None
        if write.guard_field is not None:
            allowed = [None if b is None else orjson.loads(b) for b in write.allowed_from]
            machine = {"field": write.guard_field, "from": allowed}
        self._writes.append(
            {
                "kind": "record",
                "key": key,
                "fields": {f: orjson.loads(v) for f, v in fields.items()},
                "replace": write.replace,
                "machine": machine,
                "fence": write.fence,
            }
        )

    def compare_and_set(
        self,
        key: str,
        value: dict[str, JSON],
        *,
        machine: StateMachine | None = None,
        fence: int | None = None,
    ) -> None:
        """Declare: replace the whole record with ``value``. Its version is the one the plan
        read (a record not read yet is read now), checked when the plan is acted on."""
        key = _guards.record_key(key)
        fields = self.state._fields(key, value)
        write = self.state._write(
            key, fields, replace=True, expected_version=None, machine=machine, fence=fence
        )
        self._record(key, fields, write)

    def set_field(
        self,
        key: str,
        field: str,
        value: JSON,
        *,
        machine: StateMachine | None = None,
        fence: int | None = None,
    ) -> None:
        """Declare: set one field of the record (read now if the plan has not read it)."""
        key = _guards.record_key(key)
        fields = self.state._fields(key, {_guards.field_name(field): value})
        write = self.state._write(
            key, fields, replace=False, expected_version=None, machine=machine, fence=fence
        )
        self._record(key, fields, write)

    def delete(self, key: str, *, fence: int | None = None) -> None:
        """Declare: empty the record (its version keeps rising, as :meth:`delete` of the
        state)."""
        key = _guards.record_key(key)
        write = self.state._write(
            key, {}, replace=True, expected_version=None, machine=None, fence=fence
        )
        self._record(key, {}, write)

    def _counter(self, name: str, delta: int, low: int, high: int) -> None:
        self._open()
        name = _guards.record_key(name)
        self._writes.append(
            {"kind": "counter", "key": name, "delta": delta, "low": low, "high": high}
        )

    def add(self, name: str, n: int = 1) -> None:
        """Declare: add ``n`` (may be negative) to a counter, as :meth:`SharedState.add`."""
        self._counter(
            name, check.integer(n, "n", low=_FLOOR, high=_CEILING), _FLOOR, _CEILING
        )

    def reserve(self, name: str, n: int = 1, *, limit: int) -> None:
        """Declare: take ``n`` units that may not pass ``limit`` (as ``reserve``)."""
        n = check.integer(n, "n", low=1, high=_CEILING)
        high = check.integer(limit, "limit", low=_FLOOR, high=_CEILING)
        self._counter(name, n, _FLOOR, high)

    def take(self, name: str, n: int = 1, *, minimum: int) -> None:
        """Declare: remove ``n`` from a count that must stay at least ``minimum``."""
        n = check.integer(n, "n", low=1, high=_CEILING)
        low = check.integer(minimum, "minimum", low=_FLOOR, high=_CEILING)
        self._counter(name, -n, low, _CEILING)

    def pin(
        self, table: str, where: dict[str, Any], version: int, *, column: str = "version"
    ) -> None:
        """Record that the row of the user's own ``table`` matching ``where`` was read at
        ``version`` (its integer ``column``; 0: no such row). Only where that table lives in
        the store's own database (SQLite, PostgreSQL).

        Raises:
            PlanRefused: this store cannot check a pin, or a name is not a plain identifier.
        """
        self._open()
        if not self.state.backend.plan_pins:
            raise PlanRefused(
                "this store cannot check a row of your own tables (pins: SQLite and PostgreSQL)",
                plan_id=self.id,
            )
        key = pin_key(table, where, column)
        version = check.integer(version, "version", low=0, high=2**63 - 1)
        first = self._pins.setdefault(key, (orjson.loads(key), version))[1]
        if first != version:
            raise StalePlan(self.id, [StaleRead("pin", key, first, version)])

    # -- sealing and acting ---------------------------------------------------------------------

    def _body(self) -> dict[str, Any]:
        assert self._created_at is not None
        created = self._created_at
        return {
            "format": FORMAT,
            "id": self.id,
            "step": self.step,
            "space": self.state.space,
            "created_at": created,
            "not_after": None if self._expires_in is None else created + self._expires_in,
            "keep_for": self._keep_for,
            "reads": [
                {"kind": kind, "key": name, "version": v} for (kind, name), v in self._reads.items()
            ],
            "pins": [{**pin, "version": v} for pin, v in self._pins.values()],
            "writes": self._writes,
        }

    def seal(self) -> str:
        """The plan as JSON text, with its MAC under the store's secret; after this it cannot
        change. Sealing again returns the same text.

        Raises:
            PayloadTooLarge: the plan is larger than a payload may be.
        """
        if self._sealed is not None:
            return self._sealed
        if self._created_at is None:
            raise PlanRefused("a plan is sealed after its block was entered", plan_id=self.id)
        body = self._body()
        body["mac"] = _mac(_secret(self.state), body)
        self._sealed = encode(body, what=f"plan {self.id!r}", limit=DEFAULT_MAX_BYTES).decode()
        return self._sealed

    def act(self, approved_by: str) -> PlanReceipt:
        """Approve the plan: seal it (if it is not yet) and act on it, as
        :meth:`SharedState.act`."""
        return act_sealed(self.state, self.seal(), approved_by)


# -- the sealed plan, parsed strictly -------------------------------------------------------------


def _refuse(why: str) -> PlanRefused:
    return PlanRefused(why)


def _obj(value: object, keys: set[str], what: str) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) != keys:
        raise _refuse(f"{what} must be an object with exactly {sorted(keys)}")
    return value


def _int(value: object, what: str, low: int = _FLOOR, high: int = _CEILING) -> int:
    if type(value) is not int or not low <= value <= high:
        raise _refuse(f"{what} must be an int in [{low}, {high}]")
    return value


def _opt_int(value: object, what: str, low: int = _FLOOR) -> int | None:
    return None if value is None else _int(value, what, low)


def _num(value: object, what: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
        raise _refuse(f"{what} must be a finite number")
    return float(value)  # type: ignore[arg-type]


def _list(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise _refuse(f"{what} must be a list")
    return value


_WRITE_KEYS = {
    "record": {"kind", "key", "fields", "replace", "machine", "fence"},
    "counter": {"kind", "key", "delta", "low", "high"},
}


class _Parsed:
    __slots__ = ("id", "keep_for", "not_after", "reads", "space", "writes")

    def __init__(
        self,
        plan_id: str,
        space: str | None,
        not_after: float | None,
        keep_for: float,
        reads: list[PlanRead],
        writes: list[PlanWrite],
    ) -> None:
        self.id = plan_id
        self.space = space
        self.not_after = not_after
        self.keep_for = keep_for
        self.reads = reads
        self.writes = writes


def _parse(data: dict[str, Any], qualify: Any, limit: int) -> _Parsed:
    """The plan's body, checked field by field (raises PlanRefused, or an agentlease error of
    a name or value that the caller turns into one)."""
    keys = {"format", "id", "step", "space", "created_at", "not_after", "keep_for"}
    body = _obj(data, keys | {"reads", "pins", "writes"}, "a plan")
    if type(body["format"]) is not int or body["format"] != FORMAT:
        raise _refuse(f"unknown plan format {body['format']!r} (this version reads {FORMAT})")
    plan_id = body["id"]
    if not isinstance(plan_id, str) or len(plan_id) != 32 or plan_id.strip("0123456789abcdef"):
        raise _refuse("the plan's id must be 32 hex digits")
    step = body["step"]
    if not isinstance(step, str) or not 0 < len(step) <= _MAX_STEP:
        raise _refuse(f"the plan's step must be a str of 1 to {_MAX_STEP} characters")
    space = body["space"]
    if space is not None:
        space = _guards.record_key(space)
    _num(body["created_at"], "created_at")
    not_after = None if body["not_after"] is None else _num(body["not_after"], "not_after")
    keep_for = _num(body["keep_for"], "keep_for")
    if keep_for <= 0:
        raise _refuse("keep_for must be positive")
    reads: list[PlanRead] = []
    for item in _list(body["reads"], "reads"):
        read = _obj(item, {"kind", "key", "version"}, "a read")
        kind = read["kind"]
        if kind not in ("record", "counter"):
            raise _refuse(f"a read's kind must be record or counter, not {kind!r}")
        key = qualify(space, read["key"])
        reads.append(PlanRead(kind, key, _int(read["version"], "a read's version", 0)))
    for item in _list(body["pins"], "pins"):
        pin = _obj(item, {"table", "where", "column", "version"}, "a pin")
        key = pin_key(pin["table"], pin["where"], pin["column"])
        reads.append(PlanRead("pin", key, _int(pin["version"], "a pin's version", 0, 2**63 - 1)))
    writes: list[PlanWrite] = []
    for item in _list(body["writes"], "writes"):
        kind = item.get("kind") if isinstance(item, dict) else None
        if kind not in _WRITE_KEYS:
            raise _refuse("a write's kind must be record or counter")
        write = _obj(item, _WRITE_KEYS[kind], "a write")
        key = qualify(space, write["key"])
        if kind == "counter":
            delta = _int(write["delta"], "a counter step's delta")
            low = _opt_int(write["low"], "a counter step's low")
            high = _opt_int(write["high"], "a counter step's high")
            writes.append(PlanWrite("counter", key, delta=delta, low=low, high=high))
            continue
        fields = write["fields"]
        if not isinstance(fields, dict):
            raise _refuse("a record write's fields must be an object")
        encoded = {
            _guards.field_name(f): encode(v, what=f"field {f!r} of {key!r}", limit=limit)
            for f, v in fields.items()
        }
        if type(write["replace"]) is not bool:
            raise _refuse("a record write's replace must be true or false")
        guard: str | None = None
        allowed: tuple[bytes | None, ...] = ()
        if write["machine"] is not None:
            machine = _obj(write["machine"], {"field", "from"}, "a record write's machine")
            guard = _guards.field_name(machine["field"])
            states = _list(machine["from"], "a machine's from")
            if not all(s is None or isinstance(s, str) for s in states):
                raise _refuse("a machine's from states must be str or null")
            allowed = tuple(None if s is None else orjson.dumps(s) for s in states)
        fence = _opt_int(write["fence"], "a record write's fence", 0)
        record = RecordWrite(encoded, write["replace"], None, guard, allowed, fence)
        writes.append(PlanWrite("record", key, record=record))
    return _Parsed(plan_id, space, not_after, keep_for, reads, writes)


def _approver(approved_by: object) -> str:
    if not isinstance(approved_by, str) or not approved_by.strip():
        raise PlanRefused("approved_by must name who approved (a non-empty str)")
    if len(approved_by) > _MAX_APPROVER:
        raise PlanRefused(f"approved_by is longer than {_MAX_APPROVER} characters")
    return approved_by


def _qualified(space: str | None, name: object) -> str:
    name = _guards.record_key(name)
    return name if space is None else f"{space}|{name}"


def act_sealed(
    state: SharedState, plan_json: object, approved_by: object
) -> PlanReceipt:
    """Check a sealed plan (size, JSON, MAC, every field) and act on it on ``state``'s store."""
    who = _approver(approved_by)
    if isinstance(plan_json, bytes):
        try:
            plan_json = plan_json.decode()
        except UnicodeDecodeError:
            raise PlanRefused("a sealed plan is UTF-8 JSON text") from None
    if not isinstance(plan_json, str):
        raise PlanRefused(f"a sealed plan is JSON text, not {type(plan_json).__name__}")
    if len(plan_json) > DEFAULT_MAX_BYTES:
        raise PlanRefused(f"a sealed plan is at most {DEFAULT_MAX_BYTES} bytes")
    try:
        data = orjson.loads(plan_json)
    except orjson.JSONDecodeError:
        raise PlanRefused("not JSON: truncated or not a plan") from None
    if not isinstance(data, dict) or not isinstance(data.get("mac"), str):
        raise PlanRefused("not a sealed plan (no mac)")
    mac = data.pop("mac")
    expected = _mac(_secret(state), data)
    if not hmac.compare_digest(mac.encode("utf-8", "replace"), expected.encode()):
        raise PlanRefused("its MAC does not match: edited in transit or sealed by another store")
    try:
        parsed = _parse(data, _qualified, state._limit)
    except PlanRefused:
        raise
    except AgentLeaseError as exc:  # a name or value refused: the plan is not one we made
        raise PlanRefused(str(exc)) from None
    outcome = state.backend.act_plan(
        parsed.id, parsed.reads, parsed.writes, who, parsed.keep_for, parsed.not_after
    )
    if isinstance(outcome, PlanReceipt):
        return outcome
    raise StalePlan(parsed.id, outcome)
