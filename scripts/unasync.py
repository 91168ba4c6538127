"""Generate the synchronous face (``src/agentlease/_sync``) from the asyncio source (``_async``).

The async code is the one source of truth; this script rewrites it token by token (``async def``
to ``def``, ``await x`` to ``x``, ``AsyncQueue`` to ``Queue``, ...). Run it after editing
``_async``; ``--check`` exits 1 if the generated files drifted (CI and a unit test run it).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src" / "agentlease"
# (asyncio source, generated sync twin) directory pairs.
PAIRS = [
    (ROOT / "_async", ROOT / "_sync"),
    (ROOT / "backends" / "_async", ROOT / "backends" / "_sync"),
]

RENAMES = {
    "AsyncQueue": "Queue",
    "AsyncBackend": "Backend",
    "connect_async": "connect",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "_async": "_sync",
    "aclose": "close",
    "AsyncIterator": "Iterator",
    "AsyncGenerator": "Generator",
    "asynccontextmanager": "contextmanager",
    # Redis: redis.asyncio is the asyncio twin of redis.
    "AsyncRedisBackend": "RedisBackend",
    "AsyncRedis": "Redis",
    "AsyncRedisCluster": "RedisCluster",
    "redis_asyncio": "redis_sync",
    "async_gate": "sync_gate",
    # PostgreSQL: psycopg's async classes and the pool's.
    "AsyncPostgresBackend": "PostgresBackend",
    "AsyncConnection": "Connection",
    "AsyncCursor": "Cursor",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncNullConnectionPool": "NullConnectionPool",
    "async_sleep": "sync_sleep",
    "async_tls_refusal": "sync_tls_refusal",
    "async_lock": "sync_lock",
    # Idempotent actions.
    "AsyncIdempotency": "Idempotency",
    "AsyncAction": "Action",
    "AsyncRenewals": "Renewals",
    # Shared-state guards.
    "AsyncSharedState": "SharedState",
    "AsyncLockSet": "LockSet",
    "AsyncCounterHold": "CounterHold",
    "AsyncPlan": "Plan",
    # Retry budgets, circuit breakers, spend budgets.
    "AsyncRetryBudget": "RetryBudget",
    "AsyncCircuitBreaker": "CircuitBreaker",
    "AsyncSpendBudget": "SpendBudget",
    "AsyncSpendHold": "SpendHold",
    "AsyncFactBoard": "FactBoard",
    # Periodic tasks.
    "AsyncScheduler": "Scheduler",
    "AsyncWakeup": "Wakeup",
}
SUBS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\basync def\b"), "def"),
    (re.compile(r"\basync with\b"), "with"),
    (re.compile(r"\basync for\b"), "for"),
    (re.compile(r"\bawait "), ""),
    (re.compile(r"\bAwaitable\[(\w+)\]"), r"\1"),
    (re.compile(r"\bAwaitable, "), ""),
    (re.compile(r"\b(" + "|".join(map(re.escape, RENAMES)) + r")\b"), ""),
]
HEADER = (
    "# Generated from agentlease/{name} by scripts/unasync.py. DO NOT EDIT.\n"
    "# Edit the asyncio source and run: python scripts/unasync.py\n"
)


def convert(text: str) -> str:
    """The synchronous twin of one asyncio module."""
    for pattern, replacement in SUBS[:-1]:
        text = pattern.sub(replacement, text)
    return SUBS[-1][0].sub(lambda m: RENAMES[m.group(1)], text)


def generated() -> dict[Path, str]:
    """Every target file and the text it must have."""
    out: dict[Path, str] = {}
    for source_dir, target_dir in PAIRS:
        for source in sorted(source_dir.glob("*.py")):
            body = convert(source.read_text(encoding="utf-8"))
            name = source.relative_to(ROOT).as_posix()
            out[target_dir / source.name] = HEADER.format(name=name) + body
    return out


def main(argv: list[str]) -> int:
    check = "--check" in argv
    drifted = []
    for path, text in generated().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        drifted.append(path)
        if not check:
            path.write_text(text, encoding="utf-8")
    stale = {p for _, target in PAIRS for p in target.glob("*.py")} - set(generated())
    if check:
        for path in drifted:
            print(f"{path} is out of date: run python scripts/unasync.py", file=sys.stderr)
        for path in sorted(stale):
            print(f"{path} has no asyncio source", file=sys.stderr)
        return 1 if drifted or stale else 0
    for path in sorted(stale):
        path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
