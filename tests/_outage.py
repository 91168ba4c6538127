"""A store outage for chosen primitives, without a mock: the real backend behind a switch.

:class:`Outage` forwards every attribute to the real backend (sync or asyncio). While it is
``down``, the primitives it names raise :class:`~agentlease.BackendUnavailable` instead, either
before reaching the store (the request was lost: nothing applied) or after it (the reply was
lost: applied). ``fail_next`` takes the store down for the next n calls of those primitives only,
so a test can stage a short outage without timing it.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Literal

from agentlease import BackendUnavailable


class Outage:
    """The real backend ``inner``, with ``primitives`` unavailable while the switch is down.

    Args:
        inner: the backend (sync or asyncio).
        primitives: the primitives the outage affects (others always reach the store).
        lose: ``"request"`` (nothing applied) or ``"reply"`` (applied, then the error).
    """

    def __init__(
        self,
        inner: Any,
        *primitives: str,
        lose: Literal["request", "reply"] = "request",
    ) -> None:
        self._inner = inner
        self._primitives = frozenset(primitives)
        self._lose = lose
        self._lock = threading.Lock()
        self._down = False
        self._left = 0  # calls still to fail, for fail_next
        self.failed: list[str] = []  # the primitives refused, in order

    def down(self) -> None:
        """Refuse the primitives from now on."""
        with self._lock:
            self._down = True

    def up(self) -> None:
        """Let them through again."""
        with self._lock:
            self._down, self._left = False, 0

    def fail_next(self, n: int) -> None:
        """Refuse the next ``n`` calls of the primitives, then let them through."""
        with self._lock:
            self._left = n

    def _refuse(self, name: str) -> bool:
        with self._lock:
            if self._left > 0:
                self._left -= 1
            elif not self._down:
                return False
            self.failed.append(name)
            return True

    def _error(self, name: str) -> BackendUnavailable:
        return BackendUnavailable(f"injected outage: the {self._lose} of {name} was lost")

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in self._primitives:
            return attr
        if inspect.iscoroutinefunction(attr):

            @functools.wraps(attr)
            async def call_async(*args: Any, **kwargs: Any) -> Any:
                refused = self._refuse(name)
                if refused and self._lose == "request":
                    raise self._error(name)
                got = await attr(*args, **kwargs)
                if refused:
                    raise self._error(name)
                return got

            return call_async

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            refused = self._refuse(name)
            if refused and self._lose == "request":
                raise self._error(name)
            got = attr(*args, **kwargs)
            if refused:
                raise self._error(name)
            return got

        return call
