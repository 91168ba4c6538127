"""Typed facts and their reconciliation: parallel branches return facts, code merges them.

Branches of a fan-out that return prose leave the merge to a model, which picks one silently when
two disagree. Here each branch returns :class:`Fact` values (a field, its value, the branch that
found it, the step and the evidence), and :func:`reconcile` merges them with a policy per field:

* :class:`MustAgree` (the default): every branch must have found the same value, else
  :class:`~agentlease.errors.ReconciliationConflict` names the field, both branches, their
  values and their evidence;
* :class:`PreferSource`: the first source of a given order that has a fact wins;
* :class:`LatestByVersion`: the fact with the highest version wins (two different values at the
  same version conflict);
* :class:`Union`: list values are merged, each item once, in order of first appearance.

Values are compared as canonical JSON (sorted keys), so ``{"a": 1, "b": 2}`` agrees with
``{"b": 2, "a": 1}`` and ``1`` does not agree with ``"1"``. Pure code: no store, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson

from agentlease._codec import JSON, encode
from agentlease._guards import field_name
from agentlease._validate import integer
from agentlease.errors import InvalidInput, ReconciliationConflict

__all__ = [
    "Fact",
    "LatestByVersion",
    "MustAgree",
    "Policy",
    "PreferSource",
    "Union",
    "reconcile",
]


def _canonical(value: JSON) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fact:
    """One finding of one branch.

    Attributes:
        field: what it is about (``"order.status"``); the name rules of a record field.
        value: what the branch found (JSON).
        source: the branch (or tool, or agent) that found it.
        step: the step id that produced it, if known.
        evidence: why the branch believes it (a URL, a quote, a row id: JSON).
        version: the version of what it read, for :class:`LatestByVersion`.
    """

    field: str
    value: JSON
    source: str
    step: str | None = None
    evidence: JSON = None
    version: int | None = None

    def __post_init__(self) -> None:
        field_name(self.field)
        field_name(self.source)
        if self.step is not None:
            field_name(self.step)
        if self.version is not None:
            integer(self.version, "version", low=0, high=2**53 - 1)
        encode(self.value, what=f"the value of fact {self.field!r}")
        encode(self.evidence, what=f"the evidence of fact {self.field!r}")

    def as_json(self) -> dict[str, JSON]:
        """The fact as a JSON object (:meth:`from_json` reads it back)."""
        return {
            "field": self.field,
            "value": self.value,
            "source": self.source,
            "step": self.step,
            "evidence": self.evidence,
            "version": self.version,
        }

    @classmethod
    def from_json(cls, data: object) -> Fact:
        """A fact from :meth:`as_json`'s object.

        Raises:
            InvalidInput: not such an object.
        """
        if not isinstance(data, dict) or not {"field", "value", "source"} <= data.keys():
            raise InvalidInput(f"a fact is an object with field, value and source, not {data!r}")
        extra = set(data) - {"field", "value", "source", "step", "evidence", "version"}
        if extra:
            raise InvalidInput(f"a fact has no {sorted(extra)}")
        return cls(**data)


class Policy(Protocol):
    """How the facts of one field become one value."""

    def merge(self, field: str, facts: Sequence[Fact]) -> JSON:
        """The field's value; raises ReconciliationConflict if the facts cannot be merged."""
        ...


def _agree(field: str, facts: Sequence[Fact], why: str) -> JSON:
    first = facts[0]
    seen = _canonical(first.value)
    for other in facts[1:]:
        if _canonical(other.value) != seen:
            raise ReconciliationConflict(field, first, other, why)
    return first.value


@dataclass(frozen=True, slots=True)
class MustAgree:
    """Every branch must have found the same value."""

    def merge(self, field: str, facts: Sequence[Fact]) -> JSON:
        return _agree(field, facts, "the branches must agree")


@dataclass(frozen=True, slots=True)
class PreferSource:
    """The fact of the first source in ``order`` that has one wins; if none of them has one,
    the others must agree."""

    order: tuple[str, ...]

    def __init__(self, *order: str) -> None:
        if not order:
            raise InvalidInput("PreferSource needs at least one source")
        object.__setattr__(self, "order", tuple(field_name(s) for s in order))

    def merge(self, field: str, facts: Sequence[Fact]) -> JSON:
        for source in self.order:
            preferred = [f for f in facts if f.source == source]
            if preferred:
                return _agree(field, preferred, f"source {source!r} reported it twice")
        return _agree(field, facts, f"none of {list(self.order)} reported it")


@dataclass(frozen=True, slots=True)
class LatestByVersion:
    """The fact read at the highest version wins; two different values at that version
    conflict."""

    def merge(self, field: str, facts: Sequence[Fact]) -> JSON:
        unversioned = [f.source for f in facts if f.version is None]
        if unversioned:
            raise InvalidInput(f"field {field!r}: facts from {unversioned} carry no version")
        top = max(f.version or 0 for f in facts)
        return _agree(field, [f for f in facts if f.version == top], f"both read version {top}")


@dataclass(frozen=True, slots=True)
class Union:
    """List values merged: each item once, in order of first appearance."""

    def merge(self, field: str, facts: Sequence[Fact]) -> JSON:
        merged: list[JSON] = []
        seen: set[bytes] = set()
        for fact in facts:
            if not isinstance(fact.value, list):
                raise InvalidInput(
                    f"field {field!r} is merged as a union, but {fact.source!r} found"
                    f" {type(fact.value).__name__}, not a list"
                )
            for item in fact.value:
                key = _canonical(item)
                if key not in seen:
                    seen.add(key)
                    merged.append(item)
        return merged


def reconcile(
    facts: Iterable[Fact],
    policies: Mapping[str, Policy] | None = None,
    *,
    default: Policy | None = None,
) -> dict[str, JSON]:
    """Merge the facts of every field, each field by its policy (``default``: MustAgree).

    Args:
        facts: what the branches found, in the order they reported it.
        policies: field -> policy.
        default: the policy of fields not in ``policies``.

    Returns:
        field -> merged value, for every field some fact is about.

    Raises:
        ReconciliationConflict: a field's facts cannot be merged under its policy (the first
            such field, with both branches and their evidence).
        InvalidInput: something that is not a Fact, or facts a policy cannot read.
    """
    by_field: dict[str, list[Fact]] = {}
    for fact in facts:
        if not isinstance(fact, Fact):
            raise InvalidInput(f"reconcile takes Facts, not {type(fact).__name__}")
        by_field.setdefault(fact.field, []).append(fact)
    rules = dict(policies or {})
    fallback = default if default is not None else MustAgree()
    return {
        field: rules.get(field, fallback).merge(field, found) for field, found in by_field.items()
    }
