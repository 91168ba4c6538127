"""A demo worker process: ``python -m agentlease._demo.proc URL QUEUE LEDGER LEASE_FOR``.

It runs an :class:`agentlease.Worker` (concurrency 1) whose handler works in slices and writes a
fenced progress record after each slice, so that a worker frozen past its lease makes writes the
store must refuse. Every claim, extension, accepted completion, refusal and fenced write goes to
the ledger.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import agentlease as al
from agentlease._demo.ledger import Ledger
from agentlease.errors import LeaseLost

SLICE = 0.05


def main(argv: list[str]) -> int:
    url = os.environ["AGENTLEASE_URL"]  # not in argv, which any local user can list
    queue_name, ledger_path, lease_for = argv[0], Path(argv[1]), float(argv[2])
    ledger = Ledger(ledger_path)

    def on_event(event: al.Event) -> None:
        ledger.write(
            event.name, task=event.task_id, attempt=event.attempt, t=time.time(), **event.fields
        )

    def handler(ctx: al.JobContext) -> al.JSON:
        payload = ctx.payload
        assert isinstance(payload, dict)
        work = float(payload["work"])  # type: ignore[arg-type]
        slices = max(1, round(work / SLICE))
        for i in range(slices):
            if ctx.wait(work / slices):
                return None  # the lease is gone; the worker refuses to write the result
            sent = time.time()
            try:
                ctx.progress({"slice": i})
            except LeaseLost as exc:
                ledger.write(
                    "write",
                    task=ctx.task_id,
                    attempt=ctx.attempt,
                    ok=False,
                    t_send=sent,
                    t=time.time(),
                    reason=exc.reason,
                )
                if exc.current_attempt is None:  # refused here, before reaching the store
                    ledger.write(
                        "zombie_rejected",
                        task=ctx.task_id,
                        attempt=ctx.attempt,
                        t=time.time(),
                        write="progress",
                        source="handler",
                    )
                raise
            ledger.write(
                "write", task=ctx.task_id, attempt=ctx.attempt, ok=True, t_send=sent, t=time.time()
            )
        return {"task": ctx.task_id, "attempt": ctx.attempt}

    queue = al.Queue.connect(
        url, settings=al.QueueSettings(lease_for=lease_for, max_reclaims=20), on_event=on_event
    )
    worker = al.Worker(
        queue,
        queue_name,
        handler,
        settings=al.WorkerSettings(concurrency=1, poll_interval=0.1, shutdown_grace=5.0),
    )
    ledger.write("ready", t=time.time())
    worker.run()
    ledger.write("exit", t=time.time())
    queue.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
