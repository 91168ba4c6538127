"""A SQLite database of schema version 7 (before lease holders, attempt histories and live
workers) is brought to version 10 when opened: its tasks keep working (a lease taken before the
upgrade is completed after it), and the attempts after it are recorded with their workers."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import agentlease as al
from agentlease.backends.sqlite import SCHEMA_VERSION
from tests.integration.test_deadlines import WITHOUT_VERSION_10

Q = "upgrade"


def test_a_version_7_database_gains_holders_attempts_and_workers(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    with al.Queue.connect(url) as q:
        q.enqueue_many(Q, [al.TaskSpec(payload=i, id=f"t{i}") for i in range(2)])
        (old,) = q.claim(Q, lease_for=60)
    db = sqlite3.connect(path)  # back to version 7, with a lease held
    for statement in WITHOUT_VERSION_10:
        db.execute(statement)
    db.execute("PRAGMA user_version = 7")
    db.commit()
    db.close()

    with al.Queue.connect(url) as q:
        assert [(i.task_id, i.holder) for i in q.inspect(Q)] == [(old.task_id, None)]
        q.complete(old.lease, "done before the history began")
        # Its last attempt is read from the task itself; no worker was recorded by its claim.
        assert [(a.worker, a.outcome) for a in q.get(old.task_id).attempts] == [(None, "done")]
        (new,) = q.claim(Q, lease_for=60, holder="after:1:abc")
        q.complete(new.lease, None)
        assert [(a.worker, a.outcome) for a in q.get(new.task_id).attempts] == [
            ("after:1:abc", "done")
        ]
        q.register_worker("after:1:abc", {"pid": 1}, ttl=30)
        assert [w.id for w in q.workers()] == ["after:1:abc"]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    db.close()
