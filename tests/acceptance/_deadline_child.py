"""The worker processes of tests/acceptance/test_deadline_processes.py.

    python -m tests.acceptance._deadline_child URL FACE QUEUE REMOTE LEDGER

Runs a worker (``FACE``: ``sync`` or ``async``) on ``QUEUE`` until SIGTERM:

- ``parents``: the handler enqueues a child task (it inherits the root task and the deadline),
  then keeps working: the async one is cancelled at the deadline; the sync one ignores its cancel
  token for a while and then enqueues a second child, after the deadline;
- ``children``: the handler calls an ``@idempotent`` tool that sends the side effect to the
  remote service at ``REMOTE`` with its key, fence and deadline (``al.call_timeout`` as the
  client's timeout), which answers too late.

Every step is a line in the shared ``O_APPEND`` ledger.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import sys
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import agentlease as al
from agentlease._worker import AsyncHandler
from tests.acceptance._idempotency_child import Ledger


def _body(task: str) -> bytes:
    left = al.remaining()
    assert left is not None, "the deadline did not reach the tool"
    return json.dumps(
        {
            "key": al.current_key(),
            "fence": al.current_fence(),
            "deadline": time.time() + left,
            "task": task,
        }
    ).encode()


def _post(remote: str, body: bytes) -> bytes:
    where = urlsplit(remote)
    conn = http.client.HTTPConnection(
        where.hostname or "127.0.0.1", where.port, timeout=al.call_timeout(30.0)
    )
    try:
        conn.request("POST", "/apply", body, {"Content-Type": "application/json"})
        return conn.getresponse().read()
    finally:
        conn.close()


async def _apost(remote: str, body: bytes) -> bytes:
    where = urlsplit(remote)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        writer.write(
            b"POST /apply HTTP/1.0\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        return await reader.read()
    finally:
        writer.close()


def main(url: str, face: str, queue_name: str, remote: str, path: str) -> int:
    ledger = Ledger(path)

    def charge(task: str) -> bytes:
        ledger.write("tool_started", task=task)
        return _post(remote, _body(task))

    async def acharge(task: str) -> bytes:
        ledger.write("tool_started", task=task)
        return await _apost(remote, _body(task))

    tool: Callable[[str], object]
    if face == "sync":
        tool = al.idempotent(tool="charge", store=al.Idempotency.connect(url), step="charge")(
            charge
        )
    else:
        tool = al.idempotent(tool="charge", store=al.AsyncIdempotency.connect(url), step="charge")(
            acharge
        )

    def sync_handler(ctx: al.JobContext) -> al.JSON:
        ledger.write("started", task=ctx.task_id)
        if queue_name == "parents":
            ctx.queue.enqueue("children", {}, id=f"{ctx.task_id}.child")
            time.sleep(al.remaining() or 0.0)  # ignores its cancel token: a careless handler
            time.sleep(0.3)
            ctx.queue.enqueue("children", {}, id=f"{ctx.task_id}.late-child")
            ledger.write("late_child_enqueued", task=ctx.task_id)
            return None
        tool(ctx.task_id)
        return None

    async def async_handler(ctx: al.AsyncJobContext) -> al.JSON:
        ledger.write("started", task=ctx.task_id)
        if queue_name == "parents":
            await ctx.queue.enqueue("children", {}, id=f"{ctx.task_id}.child")
            await asyncio.sleep(30)  # cancelled at the deadline
            ledger.write("outlived_deadline", task=ctx.task_id)
            return None
        await tool(ctx.task_id)  # type: ignore[misc]
        return None

    settings = al.WorkerSettings(poll_interval=0.05, shutdown_grace=1.0)
    ledger.write("ready", queue=queue_name)
    if face == "sync":
        queue = al.Queue.connect(url)
        al.Worker(queue, queue_name, sync_handler, settings=settings).run()
    else:
        aqueue = al.AsyncQueue.connect(url)
        asyncio.run(_run_async(aqueue, queue_name, async_handler, settings))
    ledger.close()
    return 0


async def _run_async(
    queue: al.AsyncQueue, name: str, handler: AsyncHandler, settings: al.WorkerSettings
) -> None:
    try:
        await al.AsyncWorker(queue, name, handler, settings=settings).run()
    finally:
        await queue.close()


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
