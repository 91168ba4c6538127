"""The Redis backend's Lua scripts: their text, the keys each one is given, and their replies.

One ``.lua`` file per primitive, each with a header listing its KEYS, ARGV and return value,
read here with :mod:`importlib.resources`. ``_lib.lua`` holds what they share (the task record's
layout, the store's clock, the lease arithmetic, fencing, reaping); each script gets the helpers
its ``-- helpers:`` line names, prepended after its ``#!lua`` line, and those a
``-- helpers here:`` line names inside a rare branch, defined in that branch. The record's field
positions (``F_STATE`` ...) are written into the text as numbers. Every call of a script makes
its helpers' closures anew, and a closure that used a local constant would capture it as an
upvalue: both are cost on every claim and completion. Scripts are called by SHA and loaded again
on NOSCRIPT (after a restart, a failover or ``SCRIPT FLUSH``); see ``_async/redis_link.py``.

Key layout. Every key of one queue carries the hash tag ``{<prefix>:<queue>}``, so a queue lives
on one Redis Cluster shard and every script is given all the keys it touches:

=========================== ================================================================
``{p:q}:t``                 hash: task id -> the task's record (MessagePack array, ~70-130 B
                            plus the payload when it is 200 bytes or less; what claim,
                            extend and complete change comes first, see ``_lib.lua``)
``{p:q}:p``                 hash: task id -> payload JSON, when it is longer
``{p:q}:r`` ``:g`` ``:c``   hashes: task id -> result / progress / checkpoint JSON, when set
``{p:q}:e``                 hash: task id -> last error JSON, when set
``{p:q}:n``                 hash: the sequence counter, the count of failed tasks (the
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
``{p:q}:k``                 hash: dedup key -> task id
``p:ids``                   hash: task id -> queue (ids are unique across queues)
``p:queues``                set: every queue enqueued to
=========================== ================================================================

A queued task with a small payload costs about 500 bytes of Redis memory in all (its record,
its members of the ready ZSET and the index, and its entry in the id index).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from agentlease._records import Enqueued, Job, Lease, LeaseInfo, LeaseTerms, Reaped, Task, TaskState

__all__ = [
    "SCRIPTS",
    "QueueKeys",
    "Script",
    "claim_terms",
    "enqueued_from",
    "jobs_from",
    "lease_infos_from",
    "queue_keys",
    "reaped_from",
    "store_time",
    "task_from",
]

NAMES = (
    "enqueue",
    "claim",
    "extend",
    "complete",
    "fail",
    "release",
    "progress",
    "reap",
    "requeue_dead",
    "get",
    "stats",
    "inspect",
    "dead",
)


@dataclass(frozen=True, slots=True)
class Script:
    """One script as sent to Redis: its full text (shared helpers included) and SHA1."""

    name: str
    text: bytes
    sha: str


_HELPER = re.compile(r"^-- @helper (\w+):(.*)$", re.MULTILINE)
_USES = re.compile(r"^-- helpers:(.*)$", re.MULTILINE)
_HERE = re.compile(r"^[ \t]*-- helpers here:(.*)$", re.MULTILINE)


def _helpers(lib: str) -> dict[str, tuple[list[str], str]]:
    """``_lib.lua``'s sections: name -> (the helpers it needs, its text), in file order."""
    parts = _HELPER.split(lib)
    return {
        name: (deps.split(), f"-- @helper {name}:{deps}\n{body.strip()}\n")
        for name, deps, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True)
    }


def _needed(helpers: dict[str, tuple[list[str], str]], wanted: list[str]) -> set[str]:
    """The helpers ``wanted`` and those they need."""
    needed: set[str] = set()
    stack = list(wanted)
    while stack:
        name = stack.pop()
        if name not in helpers:
            raise RuntimeError(f"_lib.lua has no helper {name!r}")
        if name not in needed:
            needed.add(name)
            stack.extend(helpers[name][0])
    return needed


def _text(helpers: dict[str, tuple[list[str], str]], names: set[str]) -> str:
    """The text of the helpers ``names``, in file order."""
    return "".join(text for name, (_, text) in helpers.items() if name in names)


_FIELDS = re.compile(r"^local (F_\w+(?:, F_\w+)*) = (\d+(?:, \d+)*)\n", re.MULTILINE)
_NAME = re.compile(r"\bF_\w+")


def _fields(helpers: dict[str, tuple[list[str], str]]) -> dict[str, str]:
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


def _branches(helpers: dict[str, tuple[list[str], str]], top: set[str], body: str) -> str:
    """``body`` with each "-- helpers here:" line (in a branch) replaced by the helpers it names
    and what they need beyond ``top``: calls that skip the branch never make their closures."""

    def here(m: re.Match[str]) -> str:
        return _text(helpers, _needed(helpers, m[1].split()) - top)

    return _HERE.sub(here, body)


def _load(files: Traversable | None = None) -> dict[str, Script]:
    """Every script of :data:`NAMES`, from this package's files (or those of ``files``)."""
    files = files or resources.files(__name__)
    helpers = _helpers(files.joinpath("_lib.lua").read_text(encoding="utf-8"))
    positions = _fields(helpers)
    scripts = {}
    for name in NAMES:
        body = files.joinpath(f"{name}.lua").read_text(encoding="utf-8")
        shebang, _, rest = body.partition("\n")
        uses = _USES.search(rest)
        if not shebang.startswith("#!lua") or uses is None:
            raise RuntimeError(f"{name}.lua must start with #!lua and name its helpers")
        top = _needed(helpers, ["constants", *uses.group(1).split()])
        code = f"{_text(helpers, top)}-- {name}.lua\n{_branches(helpers, top, rest)}"
        code = _inline(code, positions, name)
        text = f"{shebang}\n{code}".encode()
        scripts[name] = Script(name, text, hashlib.sha1(text).hexdigest())
    return scripts


SCRIPTS = _load()


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The keys of one queue, in the order each script lists them in its header."""

    enqueue: tuple[str, ...]
    claim: tuple[str, ...]
    extend: tuple[str, ...]
    complete: tuple[str, ...]
    fail: tuple[str, ...]
    release: tuple[str, ...]
    progress: tuple[str, ...]
    reap: tuple[str, ...]
    requeue_dead: tuple[str, ...]
    get: tuple[str, ...]
    stats: tuple[str, ...]
    inspect: tuple[str, ...]
    dead: tuple[str, ...]


@lru_cache(maxsize=4096)
def queue_keys(prefix: str, queue: str) -> QueueKeys:
    """The keys of ``queue`` under ``prefix`` (all with the hash tag ``{prefix:queue}``)."""
    tag = f"{{{prefix}:{queue}}}:"
    t, p, r, g, c, e, n, q, w, i, d, k = (tag + s for s in "tprgcenqwldk")
    return QueueKeys(
        enqueue=(t, p, n, q, w, i, k),
        claim=(t, p, c, e, n, q, w, i, d),
        extend=(t, n, i),
        complete=(t, r, i),
        fail=(t, p, r, g, c, e, n, i, w, d),
        release=(t, n, i, q),
        progress=(t, g, c),
        reap=(t, e, n, q, i, d),
        requeue_dead=(t, n, q, i, d),
        get=(t, p, r, g, c, e),
        stats=(t, n, q, w, i, d),
        inspect=(t, n, i),
        dead=(t, p, r, g, c, e, n, d),
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
}
_OUTCOMES: dict[bytes, Any] = {b"requeued": "requeued", b"dead": "dead"}


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
        )
        for j, i in enumerate(range(0, len(v), 7))
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
        )
        for i in range(1, len(v), 6)
    ]


def enqueued_from(v: list[Any]) -> list[Enqueued]:
    """The outcome of each task, from ``enqueue.lua``'s reply."""
    return [Enqueued(v[i + 1].decode(), v[i] == 1) for i in range(0, len(v), 2)]
