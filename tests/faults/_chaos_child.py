"""One worker process of the chaos test (tests/faults/test_chaos.py).

``python _chaos_child.py URL QUEUE FACE LEDGER LEASE_FOR SEED`` runs :class:`agentlease.Worker`
(FACE ``sync``) or :class:`agentlease.AsyncWorker` (FACE ``async``) until SIGTERM. Its handler
works for ``payload["work"]`` seconds in short slices, stopping when the job is cancelled, and
returns ``{"pid": ..., "attempt": ...}``.

The ledger is this process's own append-only file, independent of the store: one fsync'd line
per step, ``<task> <attempt> <pid> <kind>``, written with one ``os.write`` on an ``O_APPEND``
descriptor so that a line is whole even when the process is SIGKILLed. Kinds: ``start`` and
``end`` of a handler run, ``stop`` (the handler saw its job cancelled), ``cancel`` (an async
handler was cancelled), ``accepted`` (the worker's ``completed`` event: the store took the
result), ``lost`` (``lease_lost``), ``- 0 <pid> ready`` (connected, about to run) and
``- 0 <pid> exit <processed>``.

Every exception that escapes anything (``run()``, a thread, an event-loop callback) is printed
to stderr with its type and traceback, and an exception escaping ``run()`` exits with status 3.
Warnings of the ``agentlease`` logger go to stderr too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback
from typing import Any

import agentlease as al

PID = os.getpid()
SLICE = 0.05


class Ledger:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.lock = threading.Lock()

    def note(self, task: str, attempt: int, kind: str, extra: str = "") -> None:
        line = f"{task} {attempt} {PID} {kind}{' ' + extra if extra else ''}\n".encode()
        with self.lock:
            os.write(self.fd, line)
            os.fsync(self.fd)


def report(where: str, exc: BaseException) -> None:
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    text = "".join(traceback.format_exception(exc))
    sys.stderr.write(f"CHAOS-UNCAUGHT in {where}: {kind}: {exc}\n{text}")
    sys.stderr.flush()


def main(argv: list[str]) -> int:
    url, queue_name, face, ledger_path = argv[0], argv[1], argv[2], argv[3]
    lease_for, seed = float(argv[4]), int(argv[5])
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format="%(asctime)s pid=%(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
    )

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else "?"
        if args.exc_value is not None:
            report(f"thread {name}", args.exc_value)

    threading.excepthook = thread_hook
    ledger = Ledger(ledger_path)

    def on_event(event: al.Event) -> None:
        if event.name == "completed":
            ledger.note(event.task_id, event.attempt, "accepted")
        elif event.name == "lease_lost":
            ledger.note(event.task_id, event.attempt, "lost")

    def sync_handler(ctx: al.JobContext) -> al.JSON:
        ledger.note(ctx.task_id, ctx.attempt, "start")
        payload: Any = ctx.payload
        end = time.monotonic() + float(payload["work"])
        while (left := end - time.monotonic()) > 0:
            if ctx.wait(min(SLICE, left)):
                ledger.note(ctx.task_id, ctx.attempt, "stop")
                ctx.check()  # LeaseLost or Cancelled: the worker knows what to do
        ledger.note(ctx.task_id, ctx.attempt, "end")
        return {"pid": PID, "attempt": ctx.attempt}

    async def async_handler(ctx: al.AsyncJobContext) -> al.JSON:
        ledger.note(ctx.task_id, ctx.attempt, "start")
        payload: Any = ctx.payload
        end = time.monotonic() + float(payload["work"])
        try:
            while (left := end - time.monotonic()) > 0:
                await asyncio.sleep(min(SLICE, left))
                if ctx.cancelled:
                    ledger.note(ctx.task_id, ctx.attempt, "stop")
                    ctx.check()
        except asyncio.CancelledError:
            ledger.note(ctx.task_id, ctx.attempt, "cancel")
            raise
        ledger.note(ctx.task_id, ctx.attempt, "end")
        return {"pid": PID, "attempt": ctx.attempt}

    queue_settings = al.QueueSettings(lease_for=lease_for, max_reclaims=1000)
    worker_settings = al.WorkerSettings(
        concurrency=2, poll_interval=0.1, shutdown_grace=3.0, seed=seed
    )
    try:
        if face == "sync":
            queue = al.Queue.connect(url, settings=queue_settings, on_event=on_event)
            worker = al.Worker(queue, queue_name, sync_handler, settings=worker_settings)
            try:
                queue.queues()  # connected (and the schema in place) before saying ready
                ledger.note("-", 0, "ready")
                processed = worker.run()
            finally:
                queue.close()
        else:

            async def run_async() -> int:
                def loop_hook(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
                    exc = context.get("exception")
                    if isinstance(exc, BaseException):
                        report(f"event loop ({context.get('message')})", exc)
                    else:
                        loop.default_exception_handler(context)

                asyncio.get_running_loop().set_exception_handler(loop_hook)
                aqueue = al.AsyncQueue.connect(url, settings=queue_settings, on_event=on_event)
                try:
                    aworker = al.AsyncWorker(
                        aqueue, queue_name, async_handler, settings=worker_settings
                    )
                    await aqueue.queues()
                    ledger.note("-", 0, "ready")
                    return await aworker.run()
                finally:
                    await aqueue.close()

            processed = asyncio.run(run_async())
    except BaseException as exc:
        report("run()", exc)
        return 3
    ledger.note("-", 0, "exit", str(processed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
