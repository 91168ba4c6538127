"""Seeded faults between an MCP client and ``agentlease mcp proxy``: toxiproxy for tool calls.

A fault is a kind, a probability and an optional limit (``--fault KIND[:PROB[:TIMES]]``).
Calls are numbered in the order they reach the proxy (1, 2, ...); whether fault ``kind``
strikes call ``n`` is a hash of (seed, kind, n) compared with the probability, so a run with
the same seed and the same calls draws the same faults, in any process, on any store. A fault
with a limit stops striking after it has struck that many times.

The kinds (those of :mod:`agentlease.harness.faults`, applied where a client meets the proxy):

``delay``          the call waits (``delay`` seconds) before it is handled
``duplicate``      the request is delivered twice (both copies handled at once; the client
                   gets the first copy's answer): idempotency must make it one side effect
``drop_response``  the call is handled, its side effect done and recorded, and no answer is
                   sent: the client times out (after ``drop_for`` seconds the proxy answers
                   with an error instead, if the client still waits)
``ack_lost``       the call is handled, then answered with an error saying the reply was lost
``reorder``        the answer is held until the answer to a later call has been sent (or
                   ``reorder_for`` seconds pass): needs concurrent calls
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from agentlease.errors import InvalidInput

__all__ = ["KINDS", "Fault", "FaultPlan"]

KINDS = ("delay", "duplicate", "drop_response", "ack_lost", "reorder")


def _unit(*parts: object) -> float:
    """A number in [0, 1) from a hash of ``parts``: the same in every process and on every run."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault to inject.

    Attributes:
        kind: one of :data:`KINDS`.
        probability: the chance it strikes a call, in [0, 1].
        times: the most calls it strikes (``None``: no limit).
    """

    kind: str
    probability: float = 1.0
    times: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidInput(f"unknown fault {self.kind!r}: the kinds are {', '.join(KINDS)}")
        if not 0.0 <= self.probability <= 1.0:
            raise InvalidInput(f"a fault's probability is in [0, 1], not {self.probability!r}")
        if self.times is not None and self.times < 0:
            raise InvalidInput(f"a fault's limit is a count, not {self.times!r}")

    @classmethod
    def parse(cls, spec: str) -> Fault:
        """A fault from ``KIND[:PROB[:TIMES]]`` (``drop_response``, ``delay:0.2``,
        ``drop_response:1:1``).

        Raises:
            InvalidInput: not of that shape.
        """
        kind, *rest = spec.strip().split(":")
        if len(rest) > 2:
            raise InvalidInput(f"a fault is KIND[:PROB[:TIMES]], not {spec!r}")
        try:
            probability = float(rest[0]) if rest else 1.0
            times = int(rest[1]) if len(rest) > 1 else None
        except ValueError:
            raise InvalidInput(f"a fault is KIND[:PROB[:TIMES]], not {spec!r}") from None
        return cls(kind, probability, times)


@dataclass(slots=True, kw_only=True)
class FaultPlan:
    """The faults of one proxy run and the seed that decides them.

    Attributes:
        faults: the faults to inject (at most one per kind: a later one replaces an earlier).
        seed: decides which calls they strike.
        delay: seconds a ``delay`` fault waits.
        drop_for: seconds a ``drop_response`` fault withholds the answer before giving up.
        reorder_for: the longest a ``reorder`` fault holds an answer.
    """

    faults: Iterable[Fault] = ()
    seed: int = 0
    delay: float = 1.0
    drop_for: float = 300.0
    reorder_for: float = 5.0
    _by_kind: dict[str, Fault] = field(init=False, default_factory=dict)
    _struck: dict[str, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._by_kind = {f.kind: f for f in self.faults}
        for name in ("delay", "drop_for", "reorder_for"):
            value = getattr(self, name)
            if not 0.0 <= value <= 86_400.0:
                raise InvalidInput(f"{name} is in seconds, 0 to 86400, not {value!r}")

    def __bool__(self) -> bool:
        return bool(self._by_kind)

    def draw(self, call: int) -> frozenset[str]:
        """The kinds that strike call number ``call`` (counted from 1, in arrival order)."""
        struck = set()
        for kind, fault in self._by_kind.items():
            if fault.times is not None and self._struck.get(kind, 0) >= fault.times:
                continue
            if _unit(self.seed, kind, call) < fault.probability:
                self._struck[kind] = self._struck.get(kind, 0) + 1
                struck.add(kind)
        return frozenset(struck)
