"""An append-only ledger of what the worker processes did, independent of the store.

Each process appends JSON lines to its own file with single ``os.write`` calls on an
``O_APPEND`` descriptor, so a line is whole even when the process is SIGKILLed or frozen.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

__all__ = ["Ledger", "read_ledgers"]


class Ledger:
    """One process's ledger file."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def write(self, kind: str, **fields: Any) -> None:
        """Append one record (with this process's pid)."""
        line = orjson.dumps({"kind": kind, "pid": self._pid, **fields}) + b"\n"
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)


def read_ledgers(directory: Path) -> Iterator[dict[str, Any]]:
    """Every whole record in every ledger of ``directory`` (a torn last line is skipped)."""
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict):
                yield record
