"""Declared state machines: which moves a record's state field may make. Pure, no I/O.

A write that sets the state field is checked in the store, atomically with its version check,
against the states the target may be reached from (a state may always stay where it is). A
record without the field may only take one of the ``initial`` states.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field

import orjson

from agentlease.errors import InvalidInput

__all__ = ["StateMachine"]


@dataclass(frozen=True, slots=True)
class StateMachine:
    """The allowed transitions of one field of a record.

    Args:
        field: the record field that holds the state (a string).
        transitions: each state and the states it may move to.
        initial: the states a record may start in (default: every state that no transition
            leads to).

    Raises:
        InvalidInput: a state is not a str (or has no UTF-8 encoding), a collection of states
            is a lone str or not a collection, a move leads to an undeclared state, or no state
            is initial.

    Example::

        review = StateMachine(
            field="status",
            transitions={"draft": {"review"}, "review": {"draft", "approved"}, "approved": set()},
            initial={"draft"},
        )
    """

    field: str
    transitions: Mapping[str, Iterable[str]]
    initial: Iterable[str] = ()
    _moves: dict[str, frozenset[str]] = dc_field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.field, str) or not self.field:
            raise InvalidInput("a state machine needs the name of its state field")
        if not isinstance(self.transitions, Mapping):
            raise InvalidInput(
                "a state machine's transitions map each state to the states it may move to,"
                f" not {type(self.transitions).__name__}"
            )
        moves = {
            _state(state): frozenset(_states(targets, f"the moves of {state!r}"))
            for state, targets in self.transitions.items()
        }
        known = set(moves)
        for state, targets in moves.items():
            unknown = targets - known
            if unknown:
                raise InvalidInput(
                    f"state {state!r} moves to undeclared states {sorted(unknown)}: declare them"
                )
        initial = frozenset(_states(self.initial, "initial"))
        if not initial:
            reached = set().union(*moves.values()) if moves else set()
            initial = frozenset(known - reached)
        if not initial:
            raise InvalidInput("every state can be reached from another: name the initial ones")
        if initial - known:
            raise InvalidInput(f"initial states {sorted(initial - known)} are not declared")
        object.__setattr__(self, "initial", initial)
        object.__setattr__(self, "_moves", moves)

    def sources(self, target: object) -> tuple[bytes | None, ...]:
        """The stored JSON of every state ``target`` may be written over (``None``: the field
        is absent), for the store to check.

        Raises:
            InvalidInput: ``target`` is not a declared state.
        """
        if not isinstance(target, str) or target not in self._moves:
            raise InvalidInput(
                f"{self.field} = {target!r} is not a declared state: {sorted(self._moves)}"
            )
        froms: list[bytes | None] = [
            orjson.dumps(state)
            for state, targets in sorted(self._moves.items())
            if target in targets or state == target
        ]
        if target in self.initial:
            froms.append(None)
        return tuple(froms)


def _state(state: object) -> str:
    """``state`` if it can be a stored state: a str with a UTF-8 encoding."""
    if not isinstance(state, str):
        raise InvalidInput(f"states are str, not {type(state).__name__} ({state!r})")
    if not state.isascii():
        try:
            state.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate: no JSON for the store to compare
            raise InvalidInput(f"state {state!r} is not valid text: {exc.reason}") from None
    return state


def _states(states: object, what: str) -> list[str]:
    """The states of ``states``, an iterable of states (a lone str would be its letters)."""
    if isinstance(states, str | bytes) or not isinstance(states, Iterable):
        raise InvalidInput(
            f"{what} must be a collection of states (a set), not {type(states).__name__}"
        )
    return [_state(s) for s in states]
