"""The history of a run: every operation as it was invoked and how it ended, faults included.

A history is a list of :class:`Op`, in the order they happened, in the shape Jepsen records: an
operation is *invoked* by a process, then ends ``ok`` (it happened), ``fail`` (it did not) or
``info`` (nobody knows: the reply was lost or timed out, so it may have happened). Faults are
``info`` operations of the ``nemesis`` process, and what the simulated world really did (a side
effect landed, money was spent) is recorded by the ``world`` process, which is never wrong.

The checkers (:mod:`agentlease.harness.checkers`) read only this vocabulary, so they run on
histories recorded elsewhere as well (``History.load``):

============== ========================================== ===============================
``f``          ``value``                                  read by
============== ========================================== ===============================
``step``       ``task``, ``step``: a plan step began      ``effects_traced``
``effect``     ``kind``, ``resource``, ``step``, ``task`` ``created_once``, ``effects_traced``
``transition`` ``key``, ``from``, ``to`` (``order``)      ``monotonic``
``lock``       ``lock``, ``owner``, ``task`` (``ttl``)    ``locks_released``
``unlock``     ``lock``, ``owner``                        ``locks_released``
``budget``     ``scope``, ``limit``                       ``spend_within_budget``
``spend``      ``scope``, ``units``                       ``spend_within_budget``
``fact``       ``scope``, ``field``, ``value``,           ``facts_agree``
               ``branch``, ``step``, ``evidence``
``enqueue``    ``task``                                   ``completions``
``complete``   ``task``, ``attempt``                      ``completions``, ``locks_released``
``dead``       ``task``, ``reason``                       ``completions``, ``locks_released``
``cancel``     ``task``, ``reason``                       ``completions``, ``locks_released``
``fault``      ``kind``, ``site``, ``key``;               (the witness's "because"),
               ``target``, ``seconds`` (crash, freeze)    ``locks_released``
============== ========================================== ===============================

``History.fact`` records an :class:`agentlease.Fact` entering a shared context as a ``fact`` op.

The harness records through this object only (an in-process list under a lock), never through
event delivery that may drop under load, so the history is lossless.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson

from agentlease.errors import InvalidInput
from agentlease.harness._jsonl import dump_lines, load_lines

if TYPE_CHECKING:
    from agentlease._reconcile import Fact

__all__ = ["FORMAT", "VERSION", "Call", "History", "Op", "OpType", "ops_of"]

FORMAT = "agentlease-history"
VERSION = 1

OpType = Literal["invoke", "ok", "fail", "info"]
_TYPES = ("invoke", "ok", "fail", "info")


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a history.

    Attributes:
        index: its position in the history (0, 1, 2, ...).
        time: seconds since the run began, on the run's clock.
        process: who did it (an agent process, ``world``, ``nemesis``, ``store``).
        type: ``invoke``, then ``ok``, ``fail`` or ``info`` (indeterminate).
        f: what was done (see the module's table).
        value: its arguments and outcome (JSON).
    """

    index: int
    time: float
    process: str
    type: OpType
    f: str
    value: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        """One field of the value."""
        return self.value.get(name, default)

    def describe(self) -> str:
        """One line: index, time, process, type, f and value."""
        value = orjson.dumps(self.value, option=orjson.OPT_SORT_KEYS).decode()
        head = f"#{self.index:<4} {self.time:8.3f}s {self.process:<10} {self.type:<6}"
        return f"{head} {self.f} {value}"

    def to_json(self) -> dict[str, Any]:
        """The op as one JSON object (a line of a history file)."""
        return {
            "index": self.index,
            "time": round(self.time, 6),
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "value": self.value,
        }


class Call:
    """An invoked operation, waiting for how it ended."""

    __slots__ = ("_history", "invoked")

    def __init__(self, history: History, invoked: Op) -> None:
        self._history = history
        self.invoked = invoked

    def _end(self, type: OpType, value: dict[str, Any]) -> Op:
        return self._history.record(
            self.invoked.process, type, self.invoked.f, **{**self.invoked.value, **value}
        )

    def ok(self, **value: Any) -> Op:
        """It happened."""
        return self._end("ok", value)

    def fail(self, **value: Any) -> Op:
        """It did not happen."""
        return self._end("fail", value)

    def info(self, **value: Any) -> Op:
        """Nobody knows whether it happened (a lost reply, a timeout)."""
        return self._end("info", value)


class History:
    """An append-only history of one run.

    Args:
        clock: the run's clock; ``time`` of each op is measured from the history's creation.
        meta: what the run was (scenario, seed, store, faults), kept in the file's header.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self._clock = clock
        self._start = clock()
        self._lock = threading.Lock()
        self.ops: list[Op] = []
        self.meta: dict[str, Any] = dict(meta or {})

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def record(self, process: str, type: OpType, f: str, **value: Any) -> Op:
        """Append one op and return it."""
        if type not in _TYPES:
            raise InvalidInput(f"an op's type is one of {', '.join(_TYPES)}, not {type!r}")
        with self._lock:
            op = Op(len(self.ops), self._clock() - self._start, process, type, f, value)
            self.ops.append(op)
        return op

    def invoke(self, process: str, f: str, **value: Any) -> Call:
        """Record that ``process`` began ``f``; end it with the returned call's ok/fail/info."""
        return Call(self, self.record(process, "invoke", f, **value))

    def world(self, f: str, **value: Any) -> Op:
        """Record what the simulated world really did (``ok`` by the ``world`` process)."""
        return self.record("world", "ok", f, **value)

    def fact(self, fact: Fact, *, scope: str | None = None) -> Op:
        """Record that a typed fact entered a shared context (an ok ``fact`` of the ``world``:
        what the ``facts_agree`` checker reads). The branch is the fact's source."""
        return self.world(
            "fact",
            scope=scope,
            field=fact.field,
            value=fact.value,
            branch=fact.source,
            step=fact.step,
            evidence=fact.evidence,
            version=fact.version,
        )

    def fault(self, kind: str, site: str, key: str, **value: Any) -> Op:
        """Record an injected fault (``info`` by the ``nemesis`` process)."""
        return self.record("nemesis", "info", "fault", kind=kind, site=site, key=key, **value)

    def dumps(self) -> bytes:
        """The history as JSON lines: a header, then one op per line."""
        return dump_lines(FORMAT, VERSION, self.meta, (op.to_json() for op in self.ops))

    def dump(self, path: str | Path) -> None:
        """Write the history to a file."""
        Path(path).write_bytes(self.dumps())

    @classmethod
    def loads(cls, data: bytes) -> History:
        """A history from JSON lines written by :meth:`dumps` (or by another tool).

        Raises:
            InvalidInput: not a history of a version this library reads.
        """
        meta, rows = load_lines(data, format=FORMAT, version=VERSION, what="history")
        history = cls(meta=meta)
        for i, row in enumerate(rows):
            if (
                not isinstance(row, dict)
                or row.get("type") not in _TYPES
                or not isinstance(row.get("f"), str)
                or not isinstance(row.get("value", {}), dict)
            ):
                raise InvalidInput(f"history line {i + 2} is not an op: {row!r:.200}")
            history.ops.append(
                Op(
                    i,
                    float(row.get("time", 0.0)),
                    str(row.get("process", "")),
                    row["type"],
                    row["f"],
                    row.get("value", {}),
                )
            )
        return history

    @classmethod
    def load(cls, path: str | Path) -> History:
        """A history from a file written by :meth:`dump`."""
        return cls.loads(Path(path).read_bytes())


def ops_of(ops: Sequence[Op], f: str, type: OpType | None = "ok") -> list[Op]:
    """The ops of one ``f`` (and ``type``, unless ``None``), in order."""
    return [op for op in ops if op.f == f and (type is None or op.type == type)]
