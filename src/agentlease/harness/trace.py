"""Traces of a run's model calls and tool calls, and a model stub that replays them.

Record once against the real model, then replay with the plan pinned while the harness injects
faults into the execution::

    recorder = Recorder(meta={"scenario": "refund"})
    ask = recorder.model(call_llm)            # same signature, sync or async
    refund = recorder.tool(issue_refund)
    with recorder.task("order-17"):
        ask(messages)                         # recorded as task "order-17", step "m1"
    recorder.save("refund.trace")

    replay = ReplayModel(Trace.load("refund.trace"))
    replay("order-17")                        # the response recorded at "m1"

A trace file is JSON lines: a header (``format``, ``version`` and the meta), then one
:class:`TraceEvent` per line in the order the calls began.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import inspect
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar, cast

import orjson

from agentlease._codec import JSON
from agentlease.errors import InvalidInput, PlanDiverged
from agentlease.harness._jsonl import dump_lines, load_lines

__all__ = [
    "TRACE_FORMAT",
    "TRACE_VERSION",
    "RecordedError",
    "Recorder",
    "ReplayModel",
    "Trace",
    "TraceEvent",
    "request_of",
]

TRACE_FORMAT = "agentlease-trace"
TRACE_VERSION = 1

P = ParamSpec("P")
R = TypeVar("R")
Kind = Literal["model", "tool"]

# (task, step or None): shared by every recorder, so one scope names the calls of one run.
_SCOPE: ContextVar[tuple[str, str | None] | None] = ContextVar("agentlease_trace", default=None)


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One recorded call.

    Attributes:
        kind: ``"model"`` or ``"tool"``.
        task: the task that made the call (``"main"`` outside any scope).
        step: its step id: the scope's, or ``m1``, ``m2``, ... (``t1``, ... for tools), the
            n-th model (tool) call of the task.
        name: the model's or the tool's name.
        request: the call's arguments, ``{"args": [...], "kwargs": {...}}``.
        response: what it returned (``None`` when it raised).
        error: ``{"type", "message"}`` of what it raised, or ``None``.
        started: seconds from the recorder's creation to the call.
        elapsed: seconds the call took.
    """

    kind: Kind
    task: str
    step: str
    name: str
    request: JSON
    response: JSON
    error: dict[str, str] | None
    started: float
    elapsed: float


class Trace:
    """The recorded calls of a run, in the order they began.

    Args:
        events: the calls.
        meta: what the run was (scenario, model, seed), kept in the file's header.
    """

    def __init__(
        self, events: list[TraceEvent] | None = None, *, meta: dict[str, JSON] | None = None
    ) -> None:
        self.events: list[TraceEvent] = list(events or [])
        self.meta: dict[str, JSON] = dict(meta or {})

    def model_responses(self, task: str) -> list[TraceEvent]:
        """The model calls of ``task``, in call order."""
        return [e for e in self.events if e.kind == "model" and e.task == task]

    def tool_calls(self, task: str | None = None) -> list[TraceEvent]:
        """The tool calls of ``task`` (of every task if ``None``), in call order."""
        return [e for e in self.events if e.kind == "tool" and task in (None, e.task)]

    def tasks(self) -> list[str]:
        """The tasks that made calls, in first-seen order."""
        return list(dict.fromkeys(e.task for e in self.events))

    def dumps(self) -> bytes:
        """The trace as JSON lines: a header, then one event per line."""
        return dump_lines(TRACE_FORMAT, TRACE_VERSION, self.meta, map(asdict, self.events))

    def dump(self, path: str | Path) -> None:
        """Write the trace to a file."""
        Path(path).write_bytes(self.dumps())

    @classmethod
    def loads(cls, data: bytes) -> Trace:
        """A trace from JSON lines written by :meth:`dumps`.

        Raises:
            InvalidInput: not a trace, or a version this library does not read.
        """
        meta, rows = load_lines(data, format=TRACE_FORMAT, version=TRACE_VERSION, what="trace")
        return cls([_event(row, i + 2) for i, row in enumerate(rows)], meta=meta)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """A trace from a file written by :meth:`dump`."""
        return cls.loads(Path(path).read_bytes())


def _event(row: Any, line: int) -> TraceEvent:
    """One event from a decoded line, checked field by field."""
    error = row.get("error") if isinstance(row, dict) else None
    bad_error = error is not None and not (
        isinstance(error, dict) and _strings(error, "type", "message")
    )
    if (
        not isinstance(row, dict)
        or row.get("kind") not in ("model", "tool")
        or not _strings(row, "task", "step", "name")
        or not all(type(row.get(f)) in (int, float) for f in ("started", "elapsed"))
        or bad_error
    ):
        raise InvalidInput(f"trace line {line} is not an event: {row!r:.200}")
    values: dict[str, Any] = {f.name: row.get(f.name) for f in fields(TraceEvent)}
    return TraceEvent(
        **values | {"started": float(row["started"]), "elapsed": float(row["elapsed"])}
    )


def _strings(row: dict[str, Any], *names: str) -> bool:
    return all(isinstance(row.get(name), str) for name in names)


def _jsonable(value: object) -> JSON:
    """``value`` as JSON: tuples become lists, anything JSON cannot hold becomes its repr."""
    if value is None or type(value) in (str, int, bool):
        return cast(JSON, value)
    if type(value) is float:
        return value if math.isfinite(value) else repr(value)
    if type(value) in (list, tuple):
        return [_jsonable(v) for v in cast(list[object], value)]
    if type(value) is dict and all(type(k) is str for k in cast(dict[object, object], value)):
        return {k: _jsonable(v) for k, v in cast(dict[str, object], value).items()}
    return repr(value)


def request_of(*args: object, **kwargs: object) -> JSON:
    """The request a :class:`Recorder` records for a call with these arguments."""
    return {"args": _jsonable(args), "kwargs": _jsonable(kwargs)}


def _canonical(value: object) -> str:
    return orjson.dumps(_jsonable(value), option=orjson.OPT_SORT_KEYS).decode()


def _is_async(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004  # an object whose __call__ is async
    )


@dataclass(slots=True)
class _Pending:
    seq: int
    kind: Kind
    task: str
    step: str
    name: str
    request: JSON
    t0: float


class Recorder:
    """Records the model and tool calls of a run into a live :class:`Trace`.

    Calls are attributed to the task (and step) of the innermost :meth:`task` or :meth:`step`
    scope, a context variable, so concurrent asyncio tasks and ``asyncio.to_thread`` keep
    theirs; a thread started by hand begins outside any scope. Calls outside every scope
    belong to task ``"main"``. Thread-safe.

    Args:
        clock: the run's clock; ``started`` is measured from the recorder's creation.
        meta: what the run was, kept in the trace file's header.
    """

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, meta: dict[str, JSON] | None = None
    ) -> None:
        self._clock = clock
        self._start = clock()
        self._lock = threading.Lock()
        self._seq = 0
        self._seqs: list[int] = []  # the begin order of trace.events, which stays sorted by it
        self._counts: dict[tuple[Kind, str], int] = {}
        self.trace = Trace(meta=meta)

    @contextlib.contextmanager
    def step(self, task: str, step: str | None = None) -> Iterator[None]:
        """Attribute the calls inside to ``task`` and ``step`` (numbered per task if ``None``).

        Raises:
            InvalidInput: ``task`` or ``step`` is not a non-empty string.
        """
        for what, value in (("task", task), ("step", step)):
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidInput(f"a trace {what} is a non-empty string, not {value!r}")
        token = _SCOPE.set((task, step))
        try:
            yield
        finally:
            _SCOPE.reset(token)

    def task(self, task_id: str) -> contextlib.AbstractContextManager[None]:
        """Attribute the calls inside to ``task_id``, their steps numbered in call order."""
        return self.step(task_id)

    def model(self, fn: Callable[P, R], *, name: str | None = None) -> Callable[P, R]:
        """Wrap a model call (sync or async) so each call is recorded as a ``model`` event.

        The wrapper takes the same arguments and returns (or raises) exactly what ``fn`` does;
        arguments and results that are not JSON are recorded by their ``repr``.

        Args:
            fn: the function that calls the model.
            name: the model's name in the trace (``fn.__name__`` by default).
        """
        return self._wrap("model", fn, name)

    def tool(self, fn: Callable[P, R], *, name: str | None = None) -> Callable[P, R]:
        """Wrap a tool (sync or async) so each call is recorded as a ``tool`` event.

        Args:
            fn: the tool.
            name: the tool's name in the trace (``fn.__name__`` by default).
        """
        return self._wrap("tool", fn, name)

    def save(self, path: str | Path) -> None:
        """Write the trace recorded so far to a file."""
        with self._lock:
            data = self.trace.dumps()
        Path(path).write_bytes(data)

    def _wrap(self, kind: Kind, fn: Callable[P, R], name: str | None) -> Callable[P, R]:
        label = name or getattr(fn, "__name__", None) or type(fn).__name__
        if _is_async(fn):
            afn = cast(Callable[P, Awaitable[object]], fn)

            @functools.wraps(fn)
            async def awrapper(*args: P.args, **kwargs: P.kwargs) -> object:
                call = self._begin(kind, label, args, kwargs)
                try:
                    result = await afn(*args, **kwargs)
                except Exception as exc:
                    self._end(call, None, exc)
                    raise
                self._end(call, result, None)
                return result

            return cast(Callable[P, R], awrapper)

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            call = self._begin(kind, label, args, kwargs)
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                self._end(call, None, exc)
                raise
            self._end(call, result, None)
            return result

        return wrapper

    def _begin(
        self, kind: Kind, name: str, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> _Pending:
        task, step = _SCOPE.get() or ("main", None)
        request = request_of(*args, **kwargs)  # now: the caller may mutate its arguments later
        with self._lock:
            self._seq += 1
            n = self._counts[kind, task] = self._counts.get((kind, task), 0) + 1
            seq = self._seq
        return _Pending(seq, kind, task, step or f"{kind[0]}{n}", name, request, self._clock())

    def _end(self, call: _Pending, result: object, exc: Exception | None) -> None:
        now = self._clock()
        error = None
        if exc is not None:
            t = type(exc)
            named = (
                t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
            )
            error = {"type": named, "message": str(exc)}
        event = TraceEvent(
            call.kind,
            call.task,
            call.step,
            call.name,
            call.request,
            None if exc is not None else _jsonable(result),
            error,
            round(call.t0 - self._start, 6),
            round(now - call.t0, 6),
        )
        with self._lock:  # keep trace.events in the order the calls began
            i = bisect.bisect(self._seqs, call.seq)
            self._seqs.insert(i, call.seq)
            self.trace.events.insert(i, event)


class RecordedError(RuntimeError):
    """A model error recorded in the trace, raised again by :class:`ReplayModel`.

    Attributes:
        task, step: where it was recorded.
        error_type: the original's type (module-qualified unless a builtin).
        error_message: the original's message.
    """

    def __init__(self, task: str, step: str, error_type: str, error_message: str) -> None:
        super().__init__(
            f"{error_type}: {error_message} (recorded at step {step} of task {task!r})"
        )
        self.task = task
        self.step = step
        self.error_type = error_type
        self.error_message = error_message


class ReplayModel:
    """A model stub from a trace: returns the recorded responses of a task in order, with the
    plan pinned.

    Called without a step, the i-th call for a task returns the i-th recorded model response of
    that task; with a step, the next response recorded under that step id. A recorded model
    error is raised again as :class:`RecordedError`. Thread-safe and asyncio-safe.

    Args:
        trace: the recorded run.
        strict_requests: refuse a request that differs from the recorded one (compared as
            canonical JSON; build it with :func:`request_of` to match what was recorded).
    """

    def __init__(self, trace: Trace, *, strict_requests: bool = False) -> None:
        self._strict = strict_requests
        self._lock = threading.Lock()
        self._by_task = {t: e for t in trace.tasks() if (e := trace.model_responses(t))}
        self._served: dict[str, list[bool]] = {}
        self.reset()

    def __call__(self, task: str, step: str | None = None, request: JSON = None) -> JSON:
        """The next recorded response for ``task`` (and ``step``).

        Raises:
            PlanDiverged: no such response is left, or (strict) the request differs.
            RecordedError: the recorded call raised.
        """
        with self._lock:
            event = self._serve(task, step, request)
        if event.error is not None:
            raise RecordedError(task, event.step, event.error["type"], event.error["message"])
        return cast(JSON, orjson.loads(orjson.dumps(event.response)))  # the caller's own copy

    async def acall(self, task: str, step: str | None = None, request: JSON = None) -> JSON:
        """The async face of calling the stub (the same responses and refusals)."""
        return self(task, step, request)

    def at(self, task: str, step: str, request: JSON = None) -> JSON:
        """The response recorded under ``(task, step)``, however often it is asked for.

        This is how a retried attempt replays its plan: the harness's agents ask for steps
        ``m1``, ``m2``, ... in every attempt, and each attempt gets the same responses.

        Raises:
            PlanDiverged: nothing was recorded under that step, or (strict) the request differs.
            RecordedError: the recorded call raised.
        """
        events = self._by_task.get(task, [])
        under = [e for e in events if e.step == step]
        if not under:
            why = f"no response was recorded under step {step!r}"
            raise PlanDiverged(task, step, len(events), why)
        event = under[0]
        self._check_request(task, event, len(events), request)
        if event.error is not None:
            raise RecordedError(task, event.step, event.error["type"], event.error["message"])
        return cast(JSON, orjson.loads(orjson.dumps(event.response)))

    def reset(self) -> None:
        """Start over: every response can be served again (for the next seed)."""
        with self._lock:
            self._served = {t: [False] * len(events) for t, events in self._by_task.items()}

    def remaining(self) -> dict[str, int]:
        """How many responses of each task have not been served yet."""
        with self._lock:
            return {t: served.count(False) for t, served in self._served.items()}

    def _serve(self, task: str, step: str | None, request: JSON) -> TraceEvent:
        events = self._by_task.get(task, [])
        served = self._served.get(task, [])
        if not events:
            raise PlanDiverged(task, step or "m1", 0, "no model call of this task was recorded")
        if step is None:
            free = [i for i, done in enumerate(served) if not done]
            if not free:
                why = f"call {len(events) + 1} asks for one more"
                raise PlanDiverged(task, f"m{len(events) + 1}", len(events), why)
        else:
            under = [i for i, e in enumerate(events) if e.step == step]
            if not under:
                why = f"no response was recorded under step {step!r}"
                raise PlanDiverged(task, step, len(events), why)
            free = [i for i in under if not served[i]]
            if not free:
                why = f"the {len(under)} responses recorded under step {step!r} were all served"
                raise PlanDiverged(task, step, len(events), why)
        event = events[free[0]]
        self._check_request(task, event, len(events), request)
        served[free[0]] = True
        return event

    def _check_request(self, task: str, event: TraceEvent, held: int, request: JSON) -> None:
        if self._strict and _canonical(request) != _canonical(event.request):
            why = (
                f"the request differs from the recorded one: asked {_canonical(request):.300},"
                f" recorded {_canonical(event.request):.300}"
            )
            raise PlanDiverged(task, event.step, held, why)
