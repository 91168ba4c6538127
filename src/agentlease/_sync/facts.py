# Generated from agentlease/_async/facts.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""Facts gathered through the store: branches in many processes contribute, one reconciles.

Written once for asyncio; the synchronous face is generated from this file by scripts/unasync.py.

An :class:`FactBoard` keeps the facts of one scope (the root task of the work running now,
by default, so every subagent of a request writes to the same board) in one versioned record of
the shared state: one field per (fact field, source), written in one atomic step each, so
branches writing at once never overwrite each other, and a branch that reports a field again
replaces its own earlier finding. :meth:`FactBoard.reconcile` reads them all and merges them
with :func:`agentlease.reconcile`.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentlease import _guards
from agentlease._codec import JSON
from agentlease._reconcile import Fact, Policy, reconcile
from agentlease.errors import InvalidInput

from .budgets import _scope
from .state import SharedState

__all__ = ["FactBoard"]


class FactBoard:
    """The facts of one scope, shared through the store.

    Args:
        state: the shared state of the store.
        scope: a fixed scope; by default the root task of the work running now.

    Raises:
        InvalidInput: a bad scope name.
    """

    def __init__(self, state: SharedState, *, scope: str | None = None) -> None:
        self.state = state
        self.scope = None if scope is None else _guards.record_key(scope)

    def _key(self) -> str:
        return _guards.record_key(f"facts:{_scope(self.scope, 'a fact board')}")

    def add(self, fact: Fact) -> None:
        """Contribute ``fact`` (replacing this source's earlier finding for its field), in one
        atomic step."""
        if not isinstance(fact, Fact):
            raise InvalidInput(f"a fact board takes Facts, not {type(fact).__name__}")
        self.state.set_field(self._key(), f"{fact.field}@{fact.source}", fact.as_json())

    def facts(self) -> list[Fact]:
        """Every fact contributed so far, by field then source."""
        record = self.state.get(self._key())
        return [Fact.from_json(record.value[name]) for name in sorted(record.value)]

    def reconcile(
        self, policies: Mapping[str, Policy] | None = None, *, default: Policy | None = None
    ) -> dict[str, JSON]:
        """Merge the board's facts (see :func:`agentlease.reconcile`).

        Raises:
            ReconciliationConflict: a field's facts cannot be merged under its policy.
        """
        return reconcile(self.facts(), policies, default=default)
