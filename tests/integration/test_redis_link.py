"""The Redis link's own connection: shared by threads and tasks, safe across forks, dead
sockets and cancelled calls (see ``agentlease.backends._async.redis_link``).

Scripts go over one connection the link keeps out of redis-py's pool; these tests prove that
every caller still gets its own reply: concurrent threads and asyncio tasks (one takes the
connection, the others the pool), a forked child (never its parent's socket), a connection the
server closed while idle (replaced before a call goes out, on both faces, so even a claim, which
is never sent twice, succeeds), a call cancelled while its reply was on the way (the connection
is closed, so the next call cannot read the stale reply), and scripts the server forgot (sent
again whole, never loaded with SCRIPT LOAD).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis

import agentlease as al
from agentlease.backends.lua import queue_keys
from tests._private_redis import PrivateRedis


def _drain(q: al.Queue, queue: str, seen: list[str]) -> None:
    while jobs := q.claim(queue, 1, lease_for=30):
        q.complete(jobs[0].lease, jobs[0].payload)
        seen.append(jobs[0].task_id)


def test_threads_share_one_backend_and_each_gets_its_own_reply(served_url_redis: str) -> None:
    q = al.Queue.connect(served_url_redis)
    try:
        ids = [e.task_id for e in q.enqueue_many("jobs", [{"n": i} for i in range(400)])]
        seen: list[str] = []
        threads = [threading.Thread(target=_drain, args=(q, "jobs", seen)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(seen) == sorted(ids), "every task claimed and completed exactly once"
        for task_id in ids[:20]:
            task = q.get(task_id)
            assert (task.state, task.result) == ("done", task.payload)
    finally:
        q.close()


def test_a_caller_that_finds_the_connection_busy_goes_through_the_pool(
    served_url_redis: str,
) -> None:
    q = al.Queue.connect(served_url_redis)
    try:
        link: Any = q.backend._link  # type: ignore[attr-defined]
        through_pool = Counter[str]()
        command = link._command

        def counted(*args: Any) -> Any:
            through_pool[args[0]] += 1
            return command(*args)

        link._command = counted
        q.enqueue_many("jobs", ["a", "b"])
        (a,) = q.claim("jobs", 1)
        assert through_pool["EVALSHA"] == 0, "a lone caller uses the link's own connection"
        own = link._own
        assert own is not None
        assert link._gate.acquire(False)  # someone else is using the connection
        try:
            (b,) = q.claim("jobs", 1)
            q.complete(a.lease, "A")
        finally:
            link._gate.release()
        assert through_pool["EVALSHA"] == 2, "the busy connection was not waited for"
        q.complete(b.lease, "B")
        assert through_pool["EVALSHA"] == 2
        assert link._own is own
        assert [q.get(j.task_id).result for j in (a, b)] == ["A", "B"]
    finally:
        q.close()


def test_a_connection_the_server_closed_is_replaced_before_a_claim_goes_out(
    served_url_redis: str,
) -> None:
    q = al.Queue.connect(served_url_redis)
    admin = redis.Redis.from_url(served_url_redis.partition("?")[0])
    try:
        link: Any = q.backend._link  # type: ignore[attr-defined]
        q.enqueue_many("jobs", ["a", "b"])
        q.claim("jobs", 1)
        own_id = link._execute("CLIENT", "ID")
        assert admin.client_kill_filter(_id=own_id) == 1
        (job,) = q.claim("jobs", 1)  # a claim is never sent twice: it must go out on a live socket
        assert job.payload == "b"
        assert link._execute("CLIENT", "ID") != own_id
    finally:
        admin.close()
        q.close()


async def test_a_connection_the_server_closed_is_replaced_on_the_asyncio_face_too(
    served_url_redis: str,
) -> None:
    """The event loop has not run since the server closed the socket, so it has not seen the
    close: the link must look at the socket itself."""
    q = al.AsyncQueue.connect(served_url_redis)
    admin = redis.Redis.from_url(served_url_redis.partition("?")[0])
    try:
        link: Any = q.backend._link  # type: ignore[attr-defined]
        await q.enqueue_many("jobs", ["a", "b", "c"])
        await q.claim("jobs", 1)
        for expected in ("b", "c"):
            own_id = await link._execute("CLIENT", "ID")
            assert admin.client_kill_filter(_id=own_id) == 1  # blocking: the loop does not run
            (job,) = await q.claim("jobs", 1)  # never sent twice: it must go out on a live socket
            assert job.payload == expected
            assert await link._execute("CLIENT", "ID") != own_id
    finally:
        admin.close()
        await q.close()


def test_a_forked_child_never_uses_its_parents_socket(served_url_redis: str) -> None:
    q = al.Queue.connect(served_url_redis)
    try:
        ids = {e.task_id for e in q.enqueue_many("jobs", [{"n": i} for i in range(300)])}
        q.claim("jobs", 1)  # the parent's own connection exists before the fork
        ids_left = len(ids) - 1
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: drain alongside the parent, report what it took
            code = 1
            try:
                os.close(read)
                taken: list[str] = []
                _drain(q, "jobs", taken)
                os.write(write, "\n".join(taken).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        mine: list[str] = []
        _drain(q, "jobs", mine)
        with os.fdopen(read, "rb") as pipe:
            theirs = [t for t in pipe.read().decode().split("\n") if t]
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert len(mine) + len(theirs) == ids_left
        assert not set(mine) & set(theirs), "no task taken by both"
        assert set(mine) | set(theirs) <= ids
    finally:
        q.close()


async def test_a_call_cancelled_mid_reply_leaves_no_stale_reply(
    private_redis: Callable[..., PrivateRedis],
) -> None:
    paused_redis = private_redis()  # a private server: the test pauses it
    url = paused_redis.url + "?prefix=cancel"
    q = al.AsyncQueue.connect(url)
    admin = redis.Redis(port=paused_redis.port)
    try:
        link: Any = q.backend._link  # type: ignore[attr-defined]
        a, b = await q.enqueue_many("jobs", ["A", "B"])
        keys = queue_keys("cancel", "jobs").get

        async def get(task_id: str) -> Any:
            return await link.script("get", keys, (task_id,), retry=True)

        assert (await get(a.task_id))[0] == a.task_id.encode()
        admin.execute_command("CLIENT", "PAUSE", 500, "ALL")
        late = asyncio.create_task(get(a.task_id))
        await asyncio.sleep(0.1)  # sent; the reply comes when the pause ends
        late.cancel()
        with pytest.raises(asyncio.CancelledError):
            await late
        assert link._own is None, "a connection interrupted mid-call is not kept"
        reply = await get(b.task_id)
        assert reply[0] == b.task_id.encode(), "the next call reads its own reply"
        assert (await q.get(a.task_id)).payload == "A"
    finally:
        admin.close()
        await q.close()


async def test_concurrent_tasks_share_one_async_backend(served_url_redis: str) -> None:
    q = al.AsyncQueue.connect(served_url_redis)
    try:
        ids = [e.task_id for e in await q.enqueue_many("jobs", [{"n": i} for i in range(200)])]
        seen: list[str] = []

        async def drain() -> None:
            while jobs := await q.claim("jobs", 1, lease_for=30):
                await q.complete(jobs[0].lease, jobs[0].payload)
                seen.append(jobs[0].task_id)

        await asyncio.gather(*(drain() for _ in range(8)))
        assert sorted(seen) == sorted(ids)
    finally:
        await q.close()


async def test_scripts_the_server_forgot_run_again_without_script_load(
    private_redis: Callable[..., PrivateRedis],
) -> None:
    """After SCRIPT FLUSH (what a restart or a failover looks like), single calls and pipelines
    send the scripts' text once: nothing is loaded elsewhere, and a user who may not run SCRIPT
    LOAD (here: every SCRIPT subcommand denied) loses nothing."""
    server = private_redis()
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "agent", "on", ">pw", "~*", "+@all", "-script")
    url = f"redis://agent:pw@127.0.0.1:{server.port}/0?prefix=forgot"
    sync_q = al.Queue.connect(url)
    async_q = al.AsyncQueue.connect(url)
    try:
        for face in ("sync", "async"):
            admin.script_flush()
            if face == "sync":
                (a, b) = sync_q.enqueue_many("jobs", ["a", "b"])  # a pipeline
                admin.script_flush()
                jobs = sync_q.claim("jobs", 2, lease_for=30)  # one script
                admin.script_flush()
                assert sync_q.complete_many([(j.lease, "ok") for j in jobs]) == [None, None]
            else:
                (a, b) = await async_q.enqueue_many("jobs", ["a", "b"])
                admin.script_flush()
                jobs = await async_q.claim("jobs", 2, lease_for=30)
                admin.script_flush()
                assert await async_q.complete_many([(j.lease, "ok") for j in jobs]) == [None] * 2
            assert {j.task_id for j in jobs} == {a.task_id, b.task_id}, face
            assert sync_q.get(a.task_id).result == "ok"
    finally:
        admin.close()
        sync_q.close()
        await async_q.close()
