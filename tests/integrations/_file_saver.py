"""A LangGraph checkpointer that outlives its process, for tests that kill one."""

from __future__ import annotations

import marshal
import os
import threading
from pathlib import Path
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver


class FileSaver(InMemorySaver):
    """An in-memory checkpointer mirrored to a file after every write (its data is bytes,
    strings and numbers: marshal keeps them), so a process that is killed leaves it behind."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._lock = threading.Lock()  # LangGraph writes from background threads
        if path.exists():
            storage, writes, blobs = marshal.loads(path.read_bytes())
            for thread, spaces in storage.items():
                for ns, checkpoints in spaces.items():
                    self.storage[thread][ns].update(checkpoints)
            self.writes.update(writes)
            self.blobs.update(blobs)

    def _save(self) -> None:
        storage = {t: {ns: dict(c) for ns, c in s.items()} for t, s in self.storage.items()}
        data = marshal.dumps((storage, dict(self.writes), dict(self.blobs)))
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            got = super().put(*args, **kwargs)
            self._save()
        return got

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            super().put_writes(*args, **kwargs)
            self._save()
