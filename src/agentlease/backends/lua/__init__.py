"""The Redis backend's Lua scripts: their text, the keys each one is given, and their replies.

One ``.lua`` file per primitive, each with a header listing its KEYS, ARGV and return value,
read here with :mod:`importlib.resources`. ``_lib.lua`` holds what they share (the task record's
layout, the store's clock, the lease arithmetic, fencing, reaping), ``_keys.lua`` what the
idempotency-key scripts share (the key record's layout, its fencing) and ``_state.lua`` what the
shared-state scripts share (the layouts of records and locks, who holds a lock). Each script gets
the helpers its ``-- helpers:`` line names, prepended after its ``#!lua`` line, and those a
``-- helpers here:`` line names inside a rare branch, defined in that branch. The task record's
field positions (``F_STATE`` ...) are written into the text as numbers. Every call of a script
makes its helpers' closures anew, and a closure that used a local constant would capture it as
an upvalue: both are cost on every claim and completion. A script is put together the first time
it is asked for (:data:`SCRIPTS`), so a process pays only for those it sends. Scripts are called
by SHA and loaded again on NOSCRIPT (after a restart, a failover or ``SCRIPT FLUSH``); see
``_async/redis_link.py``.

Key layout. Every key of one queue carries the hash tag ``{<prefix>:<queue>}``, so a queue lives
on one Redis Cluster shard and every script is given all the keys it touches:

=========================== ================================================================
``{p:q}:t``                 hash: task id -> the task's record (MessagePack array, ~70-130 B
                            plus the payload when it is 200 bytes or less; what claim,
                            extend and complete change comes first, see ``_lib.lua``)
``{p:q}:p``                 hash: task id -> payload JSON, when it is longer
``{p:q}:r`` ``:g`` ``:c``   hashes: task id -> result / progress / checkpoint JSON, when set
``{p:q}:e``                 hash: task id -> last error JSON, when set
``{p:q}:x``                 hash: task id -> its context JSON (root task, deadline), for the
                            tasks enqueued with one; absent while no task of the queue had one
``{p:q}:a``                 hash: task id -> a JSON array of its last 20 attempts that ended
                            otherwise than done (number, worker, started, ended, outcome,
                            error type), written by the scripts that end them; ``>`` + task
                            id -> the worker of its last claim (its lease's holder). The
                            running attempt and a done task's last one are read from the
                            task record (see ``attempt_open`` in ``_lib.lua``)
``{p:q}:n``                 hash: the sequence counter, the counts of failed and of
                            cancelled tasks (the
                            other counts are sizes of hashes and ZSETs: ``stats`` is O(1)),
                            and ``wake``: a time no later than any score of ``:w`` and any
                            lease's in ``:l``, before which claim need not search them
``{p:q}:q``                 zset, score 0: queued tasks, ordered by member (priority, front,
                            sequence, id); claim pops with ZPOPMIN
``{p:q}:w``                 zset by run_at: scheduled and retry-waiting tasks
``{p:q}:l``                 zset, the index: leased tasks by expires_at (the reaper reads
                            only the expired: scores in (0, now]) and queued tasks by minus
                            their created_at (the oldest queued age is the highest negative
                            score); claim moves a task from one to the other with one ZADD
``{p:q}:d``                 zset by finished_at: dead letters
``{p:q}:f``                 zset by finished_at: done tasks (layout 2), so that a purge reads
                            only the tasks it deletes; ``:n`` keeps ``fidx`` once the queue's
                            done tasks of layout 1 are in it (see ``purge.lua``)
``{p:q}:k``                 hash: dedup key -> task id
``{p:q}:pb``                hash: partition -> its busy tasks (scheduled, queued, leased,
                            failed), while it has any or parked tasks wait on it
``{p:q}:pk``                zset, score 0: parked tasks, ordered by member (partition, zero
                            byte, front, sequence, zero byte, id): ZRANGEBYLEX finds a
                            partition's next task (see ``park`` in ``_lib.lua``)
``{p:q}:ph``                zset: partition -> minus its parked tasks (the hot partitions
                            are its first members)
``p:ids``                   hash: task id -> queue (ids are unique across queues)
``p:queues``                set: every queue enqueued to
``p:layout``                string: this layout's version (3), written on first use; a client
                            refuses a higher one (see ``_async/redis_layout.py``)
``p:key:{k}``               hash: idempotency key ``k`` (its own hash tag, so keys spread over
                            a cluster): state, fingerprint, fence, holder, token, times,
                            result or error, last request nonce (see ``_keys.lua``); Redis
                            expires it at its purge time
``p:rec:{k}``               hash: versioned record ``k`` (its own hash tag): ``f:<name>`` ->
                            that field's JSON, ``_v`` version, ``_f`` highest fence seen, ``_u``
                            time of the last write (see ``_state.lua``)
``p:ctr:{c}``               string: bounded counter ``c`` (its own hash tag)
``p:ctr:{c}:h``             hash: token -> units of each hold on counter ``c`` (same hash tag),
                            or a tombstone once it ended, until its expiry (see ``_state.lua``)
``p:ctr:{c}:x``             zset by expires_at: the tokens of ``:h`` (a counter's scripts give
                            back the expired first, reading only those)
``p:ctr:{c}:v``             string: counter ``c``'s version (layout 3; absent: 0), +1 by every
                            script that changes its value (see ``_state.lua``)
``p:rec:{p:sp:s}:k``        a name of state space ``s``, ``"s|k"`` (layout 3): record ``k`` of
``p:ctr:{p:sp:s}:c``        the space, counter ``c`` and its ``p:ctr:h:{p:sp:s}:c``,
                            ``p:ctr:x:{p:sp:s}:c``, ``p:ctr:v:{p:sp:s}:c`` (the kind goes before
                            the tag: the name after it may hold ``:``), all in the space's hash
                            tag: one slot per space, so a plan over a space is one script
``p:plan:{t}:id``           string: the receipt of plan ``id`` (JSON: who approved, when, each
                            write's version after it, the request nonce of the call that acted),
                            in the hash tag ``t`` of the plan's first name (its space's); Redis
                            expires it after the plan's ``keep_for`` (see ``plan_act.lua``)
``p:plans:secret``          string: the 32 random bytes the MACs of plans are made with, written
                            once (SET NX; a slot of its own)
``p:bud:{k}``               hash: retry budget ``k`` (its own hash tag): ``c`` calls, ``r``
                            retries granted; Redis expires it ``ttl`` after its last write
``p:brk:{k}``               hash: circuit breaker ``k`` (its own hash tag): ``s`` state, ``f``
                            failures, ``n`` fence of the latest trial, ``u`` end of the
                            cool-down or of the trial's turn; expires as a budget does (see
                            ``_state.lua``)
``{p:locks}:owner``         hash: lock name -> owner, until released or swept (every lock key
                            shares the hash tag ``{p:locks}``: all locks live on one shard, so a
                            lock set of any names is one script; the suffixes are not one
                            letter, so a queue named ``locks`` cannot collide)
``{p:locks}:expiry``        zset by expires_at: the locks of ``:owner`` (the sweep reads only
                            the expired)
``{p:locks}:fence``         hash: lock name -> last fencing token (kept: tokens only rise)
``{p:locks}:freed``         hash: lock name -> request nonce of the release that freed it last
``{p:workers}:info``        hash: worker id -> its registration (JSON), and ``{p:workers}:ttl``
                            zset: worker id -> when its entry lapses (both under one hash tag,
                            so ``workers_*`` scripts touch one shard; lapsed entries are not
                            listed, and ``workers_register`` deletes them)
=========================== ================================================================

A queued task with a small payload costs about 500 bytes of Redis memory in all (its record,
its members of the ready ZSET and the index, and its entry in the id index).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from agentlease._records import (
    BreakerState,
    BreakerStatus,
    Enqueued,
    Job,
    KeyHold,
    KeyRecord,
    KeyState,
    Lease,
    LeaseInfo,
    LeaseTerms,
    Reaped,
    StateRecord,
    Task,
    TaskState,
    WorkerInfo,
    attempts_from_json,
    reason_of,
    with_last_attempt,
)

__all__ = [
    "SCRIPTS",
    "LockKeys",
    "QueueKeys",
    "Script",
    "breaker_hash",
    "breaker_state_from",
    "budget_hash",
    "claim_terms",
    "counter_key",
    "counter_keys",
    "counter_tag",
    "enqueued_from",
    "jobs_from",
    "key_hash",
    "key_hold_from",
    "key_record_from",
    "lease_infos_from",
    "lock_keys",
    "plan_receipt_key",
    "plan_secret_key",
    "queue_keys",
    "reaped_from",
    "record_hash",
    "record_tag",
    "state_record_from",
    "store_time",
    "task_from",
    "worker_keys",
    "workers_from",
]

NAMES = (
    "enqueue",
    "claim",
    "extend",
    "complete",
    "complete_many",
    "fail",
    "release",
    "progress",
    "reap",
    "requeue_dead",
    "get",
    "stats",
    "inspect",
    "dead",
    "purge",
    "list",
    "cancel",
    "delete_queue",
    "key_reserve",
    "key_extend",
    "key_complete",
    "key_fail",
    "key_release",
    "key_get",
    "record_write",
    "counter_add",
    "counter_get",
    "counter_version",
    "hold_take",
    "hold_extend",
    "hold_release",
    "hold_commit",
    "locks_acquire",
    "locks_extend",
    "locks_release",
    "locks_holders",
    "locks_sweep",
    "retry_budget",
    "breaker_admit",
    "breaker_record",
    "plan_secret",
    "plan_act",
    "workers_register",
    "workers_list",
    "workers_unregister",
)
# Files of helpers, in the order their sections are prepended.
LIBS = ("_lib.lua", "_keys.lua", "_state.lua")


@dataclass(frozen=True, slots=True)
class Script:
    """One script as sent to Redis: its full text (shared helpers included) and SHA1."""

    name: str
    text: bytes
    sha: str


Helpers = dict[str, tuple[list[str], str]]
"""Helper sections by name, in file order: (the helpers each one needs, its text)."""

_HELPER = re.compile(r"^-- @helper (\w+):(.*)$", re.MULTILINE)
_USES = re.compile(r"^-- helpers:(.*)$", re.MULTILINE)
_HERE = re.compile(r"^[ \t]*-- helpers here:(.*)$", re.MULTILINE)


def _helpers(lib: str) -> Helpers:
    """``_lib.lua``'s sections: name -> (the helpers it needs, its text), in file order."""
    parts = _HELPER.split(lib)
    return {
        name: (deps.split(), f"-- @helper {name}:{deps}\n{body.strip()}\n")
        for name, deps, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True)
    }


def _needed(helpers: Helpers, wanted: list[str]) -> set[str]:
    """The helpers ``wanted`` and those they need."""
    needed: set[str] = set()
    stack = list(wanted)
    while stack:
        name = stack.pop()
        if name not in helpers:
            raise RuntimeError(f"no helper {name!r} in {', '.join(LIBS)}")
        if name not in needed:
            needed.add(name)
            stack.extend(helpers[name][0])
    return needed


def _text(helpers: Helpers, names: set[str]) -> str:
    """The text of the helpers ``names``, in file order."""
    return "".join(text for name, (_, text) in helpers.items() if name in names)


_FIELDS = re.compile(r"^local (F_\w+(?:, F_\w+)*) = (\d+(?:, \d+)*)\n", re.MULTILINE)
_NAME = re.compile(r"\bF_\w+")


def _fields(helpers: Helpers) -> dict[str, str]:
    """The record's field positions, by name, taken out of the ``constants`` section.

    Scripts get them as numbers (see :func:`_inline`), not as locals: a helper that used a local
    would capture it as an upvalue, which Lua makes anew at every call of the script.
    """
    deps, text = helpers["constants"]
    positions: dict[str, str] = {}
    for names, values in _FIELDS.findall(text):
        positions.update(zip(names.split(", "), values.split(", "), strict=True))
    helpers["constants"] = (deps, _FIELDS.sub("", text))
    return positions


def _inline(text: str, positions: dict[str, str], name: str) -> str:
    """``text`` with every field name in ``positions`` written as its number."""
    for declared in re.findall(r"^\s*local ([\w, ]+)=", text, re.MULTILINE):
        for word in declared.replace(",", " ").split():
            if word in positions:
                raise RuntimeError(f"{name}.lua declares {word}, a field position of _lib.lua")
    return _NAME.sub(lambda m: positions.get(m.group(0), m.group(0)), text)


def _branches(helpers: Helpers, top: set[str], body: str) -> str:
    """``body`` with each "-- helpers here:" line (in a branch) replaced by the helpers it names
    and what they need beyond ``top``: calls that skip the branch never make their closures."""

    def here(m: re.Match[str]) -> str:
        return _text(helpers, _needed(helpers, m[1].split()) - top)

    return _HERE.sub(here, body)


def _libs(files: Traversable) -> tuple[Helpers, dict[str, str]]:
    """The helpers of :data:`LIBS` by name, and the record's field positions."""
    helpers: Helpers = {}
    for lib in LIBS:
        helpers |= _helpers(files.joinpath(lib).read_text(encoding="utf-8"))
    return helpers, _fields(helpers)


def _build(files: Traversable, name: str, helpers: Helpers, positions: dict[str, str]) -> Script:
    """The script ``name`` as it is sent: its file with the helpers it needs, fields inlined."""
    body = files.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    shebang, _, rest = body.partition("\n")
    uses = _USES.search(rest)
    if not shebang.startswith("#!lua") or uses is None:
        raise RuntimeError(f"{name}.lua must start with #!lua and name its helpers")
    top = _needed(helpers, ["constants", *uses.group(1).split()])
    code = f"{_text(helpers, top)}-- {name}.lua\n{_branches(helpers, top, rest)}"
    code = _inline(code, positions, name)
    text = f"{shebang}\n{code}".encode()
    return Script(name, text, hashlib.sha1(text).hexdigest())


def _load(files: Traversable | None = None) -> dict[str, Script]:
    """Every script of :data:`NAMES`, from this package's files (or those of ``files``)."""
    files = files or resources.files(__name__)
    helpers, positions = _libs(files)
    return {name: _build(files, name, helpers, positions) for name in NAMES}


class _Scripts(Mapping[str, Script]):
    """Every script of :data:`NAMES` by name, each built from its file when first asked for.

    A process sends a few of the scripts (a worker: claim, extend, complete and fail), and
    building one takes several regular-expression passes over its text: building all 35 when
    the module is imported cost every process that opens a Redis store a few milliseconds. Two
    threads that ask for the same script at once both build it; the texts are identical and
    either one is kept.
    """

    def __init__(self) -> None:
        self._built: dict[str, Script] = {}
        self._libs: tuple[Traversable, Helpers, dict[str, str]] | None = None

    def __getitem__(self, name: str) -> Script:
        try:
            return self._built[name]
        except KeyError:
            if name not in NAMES:
                raise
        if self._libs is None:
            files = resources.files(__name__)
            self._libs = (files, *_libs(files))
        script = self._built[name] = _build(self._libs[0], name, *self._libs[1:])
        return script

    def __iter__(self) -> Iterator[str]:
        return iter(NAMES)

    def __len__(self) -> int:
        return len(NAMES)


SCRIPTS: Mapping[str, Script] = _Scripts()


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The keys of one queue, in the order each script lists them in its header."""

    enqueue: tuple[str, ...]
    claim: tuple[str, ...]
    extend: tuple[str, ...]
    complete: tuple[str, ...]
    complete_many: tuple[str, ...]
    fail: tuple[str, ...]
    release: tuple[str, ...]
    progress: tuple[str, ...]
    reap: tuple[str, ...]
    requeue_dead: tuple[str, ...]
    get: tuple[str, ...]
    stats: tuple[str, ...]
    inspect: tuple[str, ...]
    dead: tuple[str, ...]
    purge: dict[str, tuple[str, ...]]
    listing: dict[str, tuple[str, ...]]
    cancel: tuple[str, ...]
    delete_queue: tuple[str, ...]


@lru_cache(maxsize=4096)
def queue_keys(prefix: str, queue: str) -> QueueKeys:
    """The keys of ``queue`` under ``prefix`` (all with the hash tag ``{prefix:queue}``)."""
    tag = f"{{{prefix}:{queue}}}:"
    t, p, r, g, c, e, n, q, w, i, d, k = (tag + s for s in "tprgcenqwldk")
    pb, pk, ph = tag + "pb", tag + "pk", tag + "ph"  # partitions: busy, parked, hot
    x = tag + "x"  # task contexts
    f = tag + "f"  # done tasks by finished_at
    a = tag + "a"  # attempt histories
    z = tag + "z"  # cancelled tasks by finished_at
    return QueueKeys(
        enqueue=(t, p, n, q, w, i, k, pb, pk, ph, x),
        claim=(t, p, c, e, n, q, w, i, d, pb, pk, ph, x, a, z),
        extend=(t, n, i, q, w, pb, pk, ph, a, z),
        complete=(t, r, i, n, q, w, pb, pk, ph, f),
        complete_many=(t, r, i, n, q, w, pb, pk, ph, f),
        fail=(t, p, r, g, c, e, n, i, w, d, q, pb, pk, ph, x, a),
        release=(t, n, i, q, a),
        progress=(t, g, c),
        reap=(t, e, n, q, i, d, w, pb, pk, ph, a, z),
        requeue_dead=(t, n, q, i, d, pb, pk, ph),
        get=(t, p, r, g, c, e, x, a),
        stats=(t, n, q, w, i, d, pk, ph),
        inspect=(t, n, i, a),
        dead=(t, p, r, g, c, e, n, d, x),
        purge={
            s: (t, p, r, g, c, e, x, k, n, index, f, a)
            for s, index in (("done", f), ("dead", d), ("cancelled", z))
        },
        listing={
            s: (t, p, r, g, c, e, x, index)
            for s, index in (
                ("queued", q),
                ("leased", i),
                ("done", f),
                ("dead", d),
                ("cancelled", z),
            )
        },
        cancel=(t, e, n, q, w, i, pb, pk, ph, a, z),
        delete_queue=(t, p, r, g, c, e, x, n, q, w, i, d, k, pb, pk, ph, a, f, z),
    )


@lru_cache(maxsize=1024)
def claim_terms(n: int, terms: LeaseTerms, cap: int) -> str:
    """``claim.lua``'s first argument: the claim's terms in one string (one argument instead of
    six is less for the client to send and for the script to receive)."""
    timeout = "-" if terms.progress_timeout is None else repr(float(terms.progress_timeout))
    front = "1" if terms.reap_front else "0"
    return f"{n} {float(terms.lease_for)!r} {float(terms.max_total)!r} {timeout} {front} {cap}"


# -- replies --------------------------------------------------------------------------------------

_STATES: dict[bytes, TaskState] = {
    b"scheduled": "scheduled",
    b"queued": "queued",
    b"leased": "leased",
    b"failed": "failed",
    b"done": "done",
    b"dead": "dead",
    b"parked": "parked",
    b"cancelled": "cancelled",
}
_OUTCOMES: dict[bytes, Any] = {b"requeued": "requeued", b"dead": "dead", b"cancelled": "cancelled"}


def _time(value: bytes | None) -> float | None:
    return None if value is None else float(value)


def task_from(queue: str, v: list[Any]) -> Task:
    """A task from the flat reply of ``get.lua`` (and ``fail.lua``, ``dead.lua``)."""
    return Task(
        id=v[0].decode(),
        queue=queue,
        state=_STATES[v[1]],
        priority=v[2],
        payload_json=v[13],
        attempt=v[3],
        reclaims=v[4],
        failures=v[5],
        max_reclaims=v[6],
        created_at=float(v[7]),
        run_at=float(v[8]),
        dedup_key=None if v[9] is None else v[9].decode(),
        leased_at=_time(v[10]),
        expires_at=_time(v[11]),
        finished_at=_time(v[12]),
        progress_json=v[14],
        checkpoint_json=v[15],
        result_json=v[16],
        error_json=v[17],
        partition=None if v[18] is None else v[18].decode(),
        context_json=v[19] if len(v) > 19 else None,
        cancel_reason=reason_of(v[17]) if len(v) > 20 and v[20] else None,
        attempts=with_last_attempt(
            attempts_from_json(v[21]),
            state=_STATES[v[1]],
            attempt=v[3],
            holder=None if v[22] is None else v[22].decode(),
            leased_at=_time(v[10]),
            finished_at=_time(v[12]),
        )
        if len(v) > 22
        else attempts_from_json(v[21])
        if len(v) > 21
        else (),
    )


def store_time(seconds: bytes, micros: bytes) -> float:
    """The store's time from TIME's two integers: the very double a script computes from them."""
    return int(seconds) + int(micros) / 1_000_000


def jobs_from(
    queue: str, now: float, expires: bytes | None, tokens: str, v: list[Any]
) -> list[Job]:
    """The jobs of a claim, from ``claim.lua``'s reply: their expiry and the flat list of jobs.
    The j-th job is leased with the j-th 32-character token of the ``tokens`` the claim sent."""
    if expires is None:
        return []
    expires_at = float(expires)
    return [
        Job(
            Lease(v[i].decode(), queue, tokens[32 * j : 32 * j + 32], v[i + 1], now, expires_at),
            v[i + 2],
            v[i + 3],
            v[i + 4],
            v[i + 5],
            v[i + 6],
            v[i + 7],
            float(v[i + 8]),
        )
        for j, i in enumerate(range(0, len(v), 9))
    ]


def reaped_from(queue: str, v: list[Any]) -> list[Reaped]:
    """The reaped leases, from the flat list of ``claim.lua`` or ``reap.lua``."""
    return [
        Reaped(v[i].decode(), queue, v[i + 1], _OUTCOMES[v[i + 2]]) for i in range(0, len(v), 3)
    ]


def lease_infos_from(v: list[Any]) -> list[LeaseInfo]:
    """Live leases from ``inspect.lua``'s reply (its first value is the store's time)."""
    now = float(v[0])
    return [
        LeaseInfo(
            v[i].decode(),
            v[i + 1],
            now - float(v[i + 2]),
            float(v[i + 3]) - now,
            v[i + 4],
            v[i + 5],
            None if v[i + 6] is None else v[i + 6].decode(),
        )
        for i in range(1, len(v), 7)
    ]


def enqueued_from(v: list[Any]) -> list[Enqueued]:
    """The outcome of each task, from ``enqueue.lua``'s reply."""
    return [Enqueued(v[i + 1].decode(), v[i] == 1) for i in range(0, len(v), 2)]


# -- idempotency keys ----------------------------------------------------------------------------

_KEY_STATES: dict[bytes, KeyState] = {
    b"in_flight": "in_flight",
    b"done": "done",
    b"failed": "failed",
}


def key_hash(prefix: str, key: str) -> str:
    """The hash of idempotency key ``key`` under ``prefix`` (the key is its own hash tag)."""
    return f"{prefix}:key:{{{key}}}"


def key_hold_from(key: str, token: str, v: list[Any]) -> KeyHold:
    """The reservation from ``key_reserve.lua``'s ``{'hold', fence, expires_at, taken}``."""
    return KeyHold(key, token, v[1], float(v[2]), taken_over=v[3] == b"1")


def key_record_from(key: str, v: list[Any]) -> KeyRecord:
    """A key from the flat reply of ``key_get.lua`` (and ``key_reserve.lua`` after its tag)."""
    return KeyRecord(
        key=key,
        state=_KEY_STATES[v[0]],
        fingerprint=v[1].decode(),
        fence=v[2],
        holder=v[3].decode(),
        expires_at=_time(v[4]),
        result_json=v[5],
        error_json=v[6],
        created_at=float(v[7]),
        finished_at=_time(v[8]),
        purge_at=float(v[9]),
        now=float(v[10]),
    )


# -- shared-state guards -------------------------------------------------------------------------


SPACE = "|"
"""What separates a state space from a name in ``"<space>|<name>"`` (never in a plain name)."""


def _space(prefix: str, name: str) -> tuple[str, str] | None:
    """The hash tag of the state space of ``name`` and the name within it; ``None`` for a plain
    name (no :data:`SPACE` in it)."""
    space, sep, rest = name.partition(SPACE)
    return (f"{prefix}:sp:{space}", rest) if sep else None


def record_tag(prefix: str, key: str) -> str:
    """The hash tag of record ``key``: the key itself, or its state space's."""
    spaced = _space(prefix, key)
    return key if spaced is None else spaced[0]


counter_tag = record_tag
"""The hash tag of counter ``name``: the name itself, or its state space's (as a record's)."""


def record_hash(prefix: str, key: str) -> str:
    """The hash of versioned record ``key`` under ``prefix``: its own hash tag, or, for a name
    of a state space (``"<space>|<name>"``), the space's (layout 3)."""
    spaced = _space(prefix, key)
    if spaced is None:
        return f"{prefix}:rec:{{{key}}}"
    return f"{prefix}:rec:{{{spaced[0]}}}:{spaced[1]}"


def counter_key(prefix: str, name: str) -> str:
    """The string of counter ``name`` under ``prefix`` (its hash tag as a record's)."""
    return counter_keys(prefix, name)[0]


@lru_cache(maxsize=4096)
def counter_keys(prefix: str, name: str) -> tuple[str, str, str, str]:
    """Counter ``name``, its holds, their expiry and its version (layout 3), all with one hash
    tag (the name's, or its state space's), in the order the counter scripts list them. In a
    space the kind of key goes before the tag, since the name after it may hold ``:``."""
    spaced = _space(prefix, name)
    if spaced is None:
        counter = f"{prefix}:ctr:{{{name}}}"
        return counter, f"{counter}:h", f"{counter}:x", f"{counter}:v"
    tag, rest = spaced
    counter, holds, expiry, version = (
        f"{prefix}:ctr:{kind}{{{tag}}}:{rest}" for kind in ("", "h:", "x:", "v:")
    )
    return counter, holds, expiry, version


def plan_receipt_key(prefix: str, tag: str, plan_id: str) -> str:
    """The receipt of plan ``plan_id``, in the hash tag ``tag`` of the plan's first name (every
    name of a plan shares it on a cluster)."""
    return f"{prefix}:plan:{{{tag}}}:{plan_id}"


def plan_secret_key(prefix: str) -> str:
    """The store's key for the MACs of plans (no hash tag: a slot of its own on a cluster)."""
    return f"{prefix}:plans:secret"


@dataclass(frozen=True, slots=True)
class LockKeys:
    """The keys of a store's locks, in the order each ``locks_*`` script lists them."""

    acquire: tuple[str, ...]
    extend: tuple[str, ...]
    release: tuple[str, ...]
    holders: tuple[str, ...]
    sweep: tuple[str, ...]


@lru_cache(maxsize=64)
def lock_keys(prefix: str) -> LockKeys:
    """The lock keys under ``prefix``, all with the hash tag ``{prefix:locks}``."""
    tag = f"{{{prefix}:locks}}:"
    owner, expiry, fence, freed = (tag + s for s in ("owner", "expiry", "fence", "freed"))
    return LockKeys(
        acquire=(owner, expiry, fence),
        extend=(owner, expiry),
        release=(owner, expiry, freed),
        holders=(owner, expiry),
        sweep=(owner, expiry),
    )


def state_record_from(key: str, stored: dict[bytes, bytes] | list[bytes]) -> StateRecord | None:
    """A versioned record from its hash (HGETALL's dict, or a script's flat name, value list);
    ``None`` if the hash is empty (never written)."""
    pairs = (
        stored if isinstance(stored, dict) else dict(zip(stored[::2], stored[1::2], strict=True))
    )
    if not pairs:
        return None
    fields = {name[2:].decode(): value for name, value in pairs.items() if name[:2] == b"f:"}
    return StateRecord(
        key=key,
        version=int(pairs[b"_v"]),
        fields=fields,
        fence=int(pairs[b"_f"]),
        updated_at=float(pairs[b"_u"]),
    )


# -- retry budgets and circuit breakers ---------------------------------------------------------

_BREAKER_STATES: dict[bytes, BreakerStatus] = {
    b"closed": "closed",
    b"open": "open",
    b"half_open": "half_open",
}


def budget_hash(prefix: str, key: str) -> str:
    """The hash of retry budget ``key`` under ``prefix`` (the key is its own hash tag)."""
    return f"{prefix}:bud:{{{key}}}"


def breaker_hash(prefix: str, key: str) -> str:
    """The hash of circuit breaker ``key`` under ``prefix`` (the key is its own hash tag)."""
    return f"{prefix}:brk:{{{key}}}"


def breaker_state_from(v: list[Any]) -> BreakerState:
    """A breaker's state from ``breaker_admit.lua``'s or ``breaker_record.lua``'s reply."""
    return BreakerState(_BREAKER_STATES[v[0]], int(v[1]), int(v[2]), float(v[3]), v[4] == 1)


# -- live workers ---------------------------------------------------------------------------------


def worker_keys(prefix: str) -> tuple[str, str]:
    """The keys of the worker registry under ``prefix``: the info hash and the expiry zset
    (one hash tag, ``{prefix:workers}``: one shard on a cluster)."""
    tag = f"{{{prefix}:workers}}:"
    return tag + "info", tag + "ttl"


def workers_from(v: list[Any]) -> list[WorkerInfo]:
    """The live workers from ``workers_list.lua``'s flat reply (4 values each)."""
    return [
        WorkerInfo(v[i].decode(), v[i + 1], float(v[i + 2]), float(v[i + 3]))
        for i in range(0, len(v), 4)
    ]
