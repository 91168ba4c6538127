"""The tools of ``agentlease mcp serve``: each one's description, input schema, annotations and
handler, as plain data and functions (the MCP SDK is met only in :mod:`agentlease.mcp.server`).

A handler takes the server's :class:`~agentlease.mcp._sessions.Runtime`, the calling session's
:class:`~agentlease.mcp._sessions.Holdings` (``None`` without a session) and the arguments as
given, checks every argument itself (an agent's arguments are never trusted to match the
schema) and returns a JSON object. A refusal is raised as the agentlease error it is; the server
turns it into a tool error whose content is :func:`agentlease._error_body.error_body`.

A call waits for the store at most the runtime's ``call_timeout`` plus what the tool waits for
by design (``waits``: a lock set's ``timeout``), else it is refused with
:class:`~agentlease.errors.BackendUnavailable`: a hung store never hangs the agent.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agentlease._clock import monotonic
from agentlease._codec import JSON
from agentlease._policy.retry import RetryPolicy
from agentlease.errors import InvalidInput

from ._sessions import (
    ActionFailed,
    HeldAction,
    Holdings,
    LockHolder,
    Runtime,
    SessionRequired,
    bounded,
    decode_lease,
    encode_lease,
    not_held,
)

__all__ = ["TOOLS", "Tool"]

Args = dict[str, Any]
Handler = Callable[[Runtime, Holdings | None, Args], Awaitable[dict[str, JSON]]]


@dataclass(frozen=True)
class Tool:
    """One tool: what ``tools/list`` shows and what ``tools/call`` runs."""

    name: str
    description: str
    properties: dict[str, dict[str, Any]]
    required: tuple[str, ...]
    handler: Handler
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    waits: float = 0.0
    """The longest the call waits by design (beyond the store's round trips)."""

    @property
    def input_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": self.properties,
            "required": list(self.required),
            "additionalProperties": False,
        }


# -- arguments ------------------------------------------------------------------------------------

_MISSING = object()


def _get(args: Args, name: str, kinds: tuple[type, ...], what: str, default: Any = _MISSING) -> Any:
    value = args.get(name, _MISSING)
    if value is _MISSING or (value is None and default is not _MISSING):
        if default is _MISSING:
            raise InvalidInput(f"{name} is required")
        return default
    if isinstance(value, bool) and bool not in kinds:
        raise InvalidInput(f"{name} must be {what}, not a boolean")
    if not isinstance(value, kinds):
        raise InvalidInput(f"{name} must be {what}, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(f"{name} must be a finite number")
    return value


def _str(args: Args, name: str, default: Any = _MISSING) -> Any:
    return _get(args, name, (str,), "a string", default)


def _int(args: Args, name: str, default: Any = _MISSING) -> Any:
    return _get(args, name, (int,), "an integer", default)


def _num(args: Args, name: str, default: Any = _MISSING) -> Any:
    return _get(args, name, (int, float), "a number", default)


def _names(args: Args, name: str) -> list[str]:
    value = _get(args, name, (list,), "a list of strings")
    if not value or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"{name} must be a non-empty list of strings")
    return list(value)


def _check_unknown(tool: Tool, args: Args) -> None:
    unknown = sorted(set(args) - set(tool.properties))
    if unknown:
        raise InvalidInput(f"{tool.name} takes no argument {', '.join(map(repr, unknown))}")


def _session(session: Holdings | None, tool: str) -> Holdings:
    if session is None:
        raise SessionRequired(
            f"{tool} needs an MCP session (the initialize handshake): what it takes is given"
            " back when the session ends, and a request without a session has no end"
        )
    session.check_open()
    return session


# -- the queue ------------------------------------------------------------------------------------


async def _enqueue(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    done = await rt.queue.enqueue(
        _str(args, "queue"),
        args.get("payload"),
        id=_str(args, "id", None),
        priority=_int(args, "priority", 0),
        delay=_num(args, "delay", 0.0),
        dedup_key=_str(args, "dedup_key", None),
        partition=_str(args, "partition", None),
    )
    return {"task_id": done.task_id, "created": done.created}


async def _claim(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    queue = _str(args, "queue")
    holdings = _session(session, "claim")
    jobs = await rt.queue.claim(queue, 1)
    if not jobs:
        return {"task": None}
    (job,) = jobs
    if holdings.closed:  # the session ended while the claim was in flight: give it back
        await rt.queue.release(job.lease)
        raise SessionRequired("the session has ended")
    holdings.add_job(job)
    return {
        "task": {
            "task_id": job.task_id,
            "queue": queue,
            "payload": job.payload,
            "attempt": job.attempt,
            "lease": encode_lease(job.lease),
            "checkpoint": job.checkpoint,
        }
    }


async def _heartbeat(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    given = decode_lease(args.get("lease"))
    lease = given if session is None else session.lease(given)
    if "progress" in args or "checkpoint" in args:
        await rt.queue.progress(lease, args.get("progress"), checkpoint=args.get("checkpoint"))
    (renewed,) = await rt.queue.extend([lease])
    if renewed is None:
        if session is not None:
            session.take(given)
        task = await rt.queue.get(lease.task_id)
        from agentlease.errors import LeaseLost

        raise LeaseLost(lease.task_id, lease.attempt, task.attempt, task.state)
    if session is not None and (given.task_id, given.token) in session.leases:
        session.leases[(given.task_id, given.token)].lease = renewed
    return {"task_id": renewed.task_id, "attempt": renewed.attempt}


async def _complete(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    given = decode_lease(args.get("lease"))
    lease = given if session is None else session.lease(given)
    await rt.queue.complete(lease, args.get("result"))
    if session is not None:
        session.take(given)
    return {"task_id": lease.task_id, "state": "done"}


async def _fail(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    given = decode_lease(args.get("lease"))
    error = _str(args, "error")[:4000]
    lease = given if session is None else session.lease(given)
    held = None if session is None else session.leases.get((given.task_id, given.token))
    failures = held.failures if held is not None else (await rt.queue.get(lease.task_id)).failures
    exc = ActionFailed(error)
    retry_in = None if args.get("retry") is False else RetryPolicy().retry_in(failures, exc)
    task = await rt.queue.fail(lease, exc, retry_in=retry_in)
    if session is not None:
        session.take(given)
    return {"task_id": task.id, "state": task.state, "retry_in": retry_in}


async def _release(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    given = decode_lease(args.get("lease"))
    lease = given if session is None else session.lease(given)
    await rt.queue.release(lease, front=True)
    if session is not None:
        session.take(given)
    return {"task_id": lease.task_id, "state": "queued"}


async def _stats(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    stats = await rt.queue.stats(_str(args, "queue"))
    return {
        "queue": stats.queue,
        "counts": dict(stats.counts),
        "depth": stats.depth,
        "oldest_queued_age": stats.oldest_queued_age,
    }


# -- idempotent actions ---------------------------------------------------------------------------


async def _action_begin(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    tool, step, task_id = _str(args, "tool"), _str(args, "step"), _str(args, "task_id")
    key = _str(args, "key", None)
    holdings = _session(session, "action_begin")
    act = await rt.keys.begin(tool, args.get("args"), step=step, task_id=task_id, key=key)
    if act.replayed:
        assert act.record is not None
        body: dict[str, JSON] = {"replayed": True, "key": act.key, "state": act.record.state}
        if act.record.state == "failed":
            body["error"] = act.record.error
        else:
            body["result"] = act.result
        return body
    if holdings.closed:
        await act.abandon()
        raise SessionRequired("the session has ended")
    holdings.actions[act.key] = HeldAction(act, monotonic() + rt.lease_cap)
    return {"replayed": False, "key": act.key, "fence": act.fence, "taken_over": act.taken_over}


def _held_action(session: Holdings | None, args: Args) -> tuple[Holdings, str, HeldAction]:
    key = _str(args, "key")
    holdings = _session(session, "this tool")
    held = holdings.actions.pop(key, None)
    if held is None:
        raise not_held("reservation", key)
    return holdings, key, held


async def _action_complete(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    _, key, held = _held_action(session, args)
    await held.action.complete(args.get("result"))
    return {"key": key, "state": "done"}


async def _action_fail(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    error = _str(args, "error")[:4000]
    _, key, held = _held_action(session, args)
    await held.action.fail(ActionFailed(error))
    return {"key": key, "state": "failed"}


async def _action_release(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    _, key, held = _held_action(session, args)
    await held.action.release()
    return {"key": key, "state": "released"}


# -- locks ----------------------------------------------------------------------------------------


async def _locks_acquire(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    names, timeout = _names(args, "names"), _num(args, "timeout")
    hold = _num(args, "hold", rt.lock_cap)
    if not 0 < timeout <= 60:
        raise InvalidInput("timeout must be more than 0 and at most 60 seconds")
    if not 0 < hold <= rt.lock_cap:
        raise InvalidInput(f"hold must be more than 0 and at most {rt.lock_cap} seconds")
    holdings = _session(session, "locks_acquire")
    holder = LockHolder(rt.state, names, timeout, hold)
    async with bounded(timeout + rt.call_timeout, "acquiring the lock set"):
        held = await holder.acquired()
    if holdings.closed:
        await holder.release()
        raise SessionRequired("the session has ended")
    holdings.locks[holder.id] = holder
    return {"lock": holder.id, "names": list(held.names), "tokens": dict(held.tokens), "hold": hold}


async def _locks_release(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    lock = _str(args, "lock")
    holdings = _session(session, "locks_release")
    holder = holdings.locks.pop(lock, None)
    if holder is None:
        raise not_held("lock set", lock)
    await holder.release()
    return {"lock": lock, "released": holder.names}


# -- shared state ---------------------------------------------------------------------------------


async def _state_get(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    got = await rt.state.get(_str(args, "key"))
    return {"value": got.value, "version": got.version}


async def _state_cas(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    key, version = _str(args, "key"), _int(args, "expected_version")
    value = _get(args, "value", (dict,), "a JSON object")
    new = await rt.state.compare_and_set(key, version, value, fence=_int(args, "fence", None))
    return {"version": new}


async def _state_set_field(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    key, name = _str(args, "key"), _str(args, "field")
    if "value" not in args:
        raise InvalidInput("value is required")
    new = await rt.state.set_field(
        key,
        name,
        args["value"],
        expected_version=_int(args, "expected_version", None),
        fence=_int(args, "fence", None),
    )
    return {"version": new}


async def _counter_get(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    return {"value": await rt.state.counter(_str(args, "name"))}


async def _counter_add(rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    name, n = _str(args, "name"), _int(args, "n")
    limit, minimum = _int(args, "limit", None), _int(args, "minimum", None)
    if limit is not None and minimum is not None:
        raise InvalidInput("give limit (for n > 0) or minimum (for n < 0), not both")
    if limit is not None:
        if n <= 0:
            raise InvalidInput("limit bounds an increase: n must be positive")
        return {"value": await rt.state.reserve(name, n, limit=limit)}
    if minimum is not None:
        if n >= 0:
            raise InvalidInput("minimum bounds a decrease: n must be negative")
        return {"value": await rt.state.take(name, -n, minimum=minimum)}
    return {"value": await rt.state.add(name, n)}


# -- the table ------------------------------------------------------------------------------------

_JSON: dict[str, Any] = {"description": "any JSON value"}
_LEASE = {"type": "string", "description": "the lease string claim returned"}


def _s(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _n(description: str, kind: str = "number") -> dict[str, Any]:
    return {"type": kind, "description": description}


TOOLS: tuple[Tool, ...] = (
    Tool(
        "enqueue",
        "Add a task to a queue. Returns its task_id and whether it was created (false: a task "
        "with this id or dedup_key exists already).",
        {
            "queue": _s("the queue's name"),
            "payload": _JSON,
            "id": _s("a task id of your own (enqueueing it again creates nothing)"),
            "dedup_key": _s("a second task with this key in this queue creates nothing"),
            "priority": _n("higher runs first", "integer"),
            "delay": _n("seconds before it may run"),
            "partition": _s("the resource it writes to: one task per partition at a time"),
        },
        ("queue",),
        _enqueue,
    ),
    Tool(
        "claim",
        "Lease the next ready task of a queue; null when none is ready. The lease belongs to "
        "this session: it is renewed while the session lives (up to the server's lease cap) "
        "and the task goes back to the queue when the session ends. attempt is the fencing "
        "number: pass it to systems that can refuse older attempts.",
        {"queue": _s("the queue's name")},
        ("queue",),
        _claim,
    ),
    Tool(
        "heartbeat",
        "Extend a lease now, optionally recording progress (and a checkpoint to resume from).",
        {"lease": _LEASE, "progress": _JSON, "checkpoint": _JSON},
        ("lease",),
        _heartbeat,
        idempotent=True,
    ),
    Tool(
        "complete",
        "Mark the task done with its result. Refused with LeaseLost if the lease was lost "
        "(another attempt may hold the task): then do not act on the task any more.",
        {"lease": _LEASE, "result": _JSON},
        ("lease",),
        _complete,
        idempotent=True,
    ),
    Tool(
        "fail",
        "Record that the task failed: it is retried later per the retry policy (retry=false: "
        "dead-letter it now).",
        {
            "lease": _LEASE,
            "error": _s("what went wrong"),
            "retry": {"type": "boolean", "description": "false: do not retry"},
        },
        ("lease", "error"),
        _fail,
        idempotent=True,
    ),
    Tool(
        "release",
        "Give the task back unrun, to the front of its queue (not counted as a failure).",
        {"lease": _LEASE},
        ("lease",),
        _release,
        idempotent=True,
    ),
    Tool(
        "stats",
        "Counts of a queue's tasks by state, its depth and its oldest queued age.",
        {"queue": _s("the queue's name")},
        ("queue",),
        _stats,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "action_begin",
        "Before a side effect (an email, a charge, a ticket): reserve its key, from the task "
        "id, the step, the tool and its arguments. replayed=true: it was done already, use the "
        "stored result and do not act. Else act (pass key downstream as an Idempotency-Key), "
        "then call action_complete or action_fail with the key.",
        {
            "tool": _s("the side effect's tool name"),
            "args": _JSON,
            "task_id": _s("the task this belongs to"),
            "step": _s("the step of the task"),
            "key": _s("a key of your own instead of the derived one"),
        },
        ("tool", "task_id", "step"),
        _action_begin,
    ),
    Tool(
        "action_complete",
        "Record the side effect's result under its key: later begins replay it.",
        {"key": _s("the key action_begin returned"), "result": _JSON},
        ("key",),
        _action_complete,
        idempotent=True,
    ),
    Tool(
        "action_fail",
        "Record that the side effect failed for good: later begins replay the failure.",
        {"key": _s("the key action_begin returned"), "error": _s("what went wrong")},
        ("key", "error"),
        _action_fail,
        idempotent=True,
    ),
    Tool(
        "action_release",
        "Give the key up: the side effect is known not to have happened.",
        {"key": _s("the key action_begin returned")},
        ("key",),
        _action_release,
        idempotent=True,
    ),
    Tool(
        "locks_acquire",
        "Acquire every lock of names or none (canonical order, no deadlock), waiting at most "
        "timeout seconds (else LockTimeout). Locks are held for hold seconds at most (capped "
        "short by the server: never hold a lock while you think) and released when the "
        "session ends. tokens are fencing tokens for state writes.",
        {
            "names": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "timeout": _n("seconds to wait for the locks (required)"),
            "hold": _n("seconds to hold them at most (default and maximum: the server's cap)"),
        },
        ("names", "timeout"),
        _locks_acquire,
        waits=60.0,
    ),
    Tool(
        "locks_release",
        "Release a lock set; LockLost if it ran out before.",
        {"lock": _s("the lock id locks_acquire returned")},
        ("lock",),
        _locks_release,
        idempotent=True,
    ),
    Tool(
        "state_get",
        "A shared record's value and version (version 0: it does not exist).",
        {"key": _s("the record's key")},
        ("key",),
        _state_get,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "state_compare_and_set",
        "Replace a whole record if it is still at expected_version (0: create it); else "
        "ConflictError with the current value and version: re-read, re-decide, retry.",
        {
            "key": _s("the record's key"),
            "expected_version": _n("the version you read", "integer"),
            "value": {"type": "object", "description": "the new record (a JSON object)"},
            "fence": _n("a lock's fencing token: older tokens are refused", "integer"),
        },
        ("key", "expected_version", "value"),
        _state_cas,
        destructive=True,
        idempotent=True,
    ),
    Tool(
        "state_set_field",
        "Set one field of a record, leaving the others as they are.",
        {
            "key": _s("the record's key"),
            "field": _s("the field's name"),
            "value": _JSON,
            "expected_version": _n("refuse unless the record is at this version", "integer"),
            "fence": _n("a lock's fencing token: older tokens are refused", "integer"),
        },
        ("key", "field", "value"),
        _state_set_field,
        destructive=True,
    ),
    Tool(
        "counter_get",
        "A shared counter's value (0 if never used).",
        {"name": _s("the counter's name")},
        ("name",),
        _counter_get,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "counter_add",
        "Add n (negative: subtract) to a shared counter in one atomic step. With limit (n > 0) "
        "the count may not pass it; with minimum (n < 0) it may not drop below it: else "
        "LimitReached and nothing changes.",
        {
            "name": _s("the counter's name"),
            "n": _n("the amount", "integer"),
            "limit": _n("the most the counter may reach", "integer"),
            "minimum": _n("the least the counter may drop to", "integer"),
        },
        ("name", "n"),
        _counter_add,
    ),
)


async def call(tool: Tool, rt: Runtime, session: Holdings | None, args: Args) -> dict[str, JSON]:
    """Run ``tool`` with ``args`` (unknown arguments are refused before anything is done)."""
    _check_unknown(tool, args)
    async with bounded(rt.call_timeout + tool.waits, f"the {tool.name} call"):
        return await tool.handler(rt, session, args)
