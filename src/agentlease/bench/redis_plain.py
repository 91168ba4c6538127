"""The second baseline of the Redis batch claim: a plain script that makes claim.lua's changes.

The raw baseline of :mod:`agentlease.bench.redis_rows` pops ids from a list and marks each one
leased: the least a leased queue does, and much less than ``claim.lua`` does (priorities, the
attempt counter, a token, the task record, the lease index, the promote and reap checks). So the
batch claim rows also run beside :data:`PLAIN_CLAIM`: one script that makes the same changes as
``claim.lua`` on the library's own keys, written the plain way: read both ZSETs for due and
expired work on every call (no ``wake`` time to skip them), decode each task's whole record into
a table, change it and encode it again (no partial decoding), and one Redis call per write. The
queue is filled by the library (untimed), so both sides drain the same data.

What it leaves out, all of it work the library does and the baseline does not: promoting and
reaping themselves (the bench queues have nothing due or expired; the script refuses a queue
that has), partitions, and the reply's priority, failures and reclaims.
"""

from __future__ import annotations

import os
from typing import Any

from agentlease._records import TaskSpec
from agentlease._sync.queue import Queue
from agentlease.backends import connect
from agentlease.backends._redis_url import parse
from agentlease.backends.lua import queue_keys
from agentlease.bench.command import Stores
from agentlease.bench.loops import FILL_CHUNK, LEASE_FOR, MAX_LEASE, Library, Mode
from agentlease.bench.redis_link import Pinned, raw_url
from agentlease.bench.redis_link import client as _client
from agentlease.bench.redis_link import drop as _drop

__all__ = ["PLAIN", "PLAIN_CLAIM", "PlainRedis", "PlainStores"]

PLAIN = "plain claim script"
"""What the names of the rows measured beside :data:`PLAIN_CLAIM` end with."""

# The record's layout is drawn in backends/lua/_lib.lua: state (3 = leased), attempt, token,
# expires_at, ..., leased_at (7), lease deadline (8), progress timeout (9), last progress (10),
# ..., checkpointed (14), inline payload (15).
PLAIN_CLAIM = """
-- KEYS: claim.lua's: 1 tasks, 2 payloads, 3 checkpoints, 4 errors, 5 counters, 6 ready,
--       7 waiting, 8 index (the rest are not used)
-- ARGV: 1 n, 2 lease_for seconds, 3 max_total seconds, 4 n tokens of 32 characters
-- Returns: id, attempt, payload, checkpoint of each task leased, flat
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if #redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now, 'LIMIT', 0, 1) > 0
   or #redis.call('ZRANGEBYSCORE', KEYS[8], '(0', now, 'LIMIT', 0, 1) > 0 then
  return redis.error_reply('the plain claim neither promotes nor reaps')
end
local expires = math.min(now + tonumber(ARGV[2]), now + tonumber(ARGV[3]))
local deadline = now + tonumber(ARGV[3])
local out = {}
local popped = redis.call('ZPOPMIN', KEYS[6], ARGV[1])
for i = 1, #popped, 2 do
  local j = (i + 1) / 2
  local id = string.sub(popped[i], 26)
  local rec = cmsgpack.unpack(redis.call('HGET', KEYS[1], id))
  rec[1] = 3
  rec[2] = rec[2] + 1
  rec[3] = string.sub(ARGV[4], j * 32 - 31, j * 32)
  rec[4] = expires
  rec[7] = now
  rec[8] = deadline
  rec[9] = false
  rec[10] = now
  redis.call('HSET', KEYS[1], id, cmsgpack.pack(rec))
  redis.call('ZADD', KEYS[8], string.format('%.17g', expires), id)
  local checkpoint = false
  if rec[14] then checkpoint = redis.call('HGET', KEYS[3], id) end
  out[#out + 1] = id
  out[#out + 1] = rec[2]
  out[#out + 1] = rec[15] or redis.call('HGET', KEYS[2], id)
  out[#out + 1] = checkpoint
end
local wake = redis.call('HGET', KEYS[5], 'wake')
if #popped > 0 and (not wake or expires < tonumber(wake)) then
  redis.call('HSET', KEYS[5], 'wake', expires)
end
return out
"""


class PlainRedis:
    """The batch claim's second baseline: the library fills the queue (its own keys, under the
    URL's prefix), :data:`PLAIN_CLAIM` drains it over the library's transport.

    Args:
        url: a ``redis://`` URL; its ``prefix`` names the keys, deleted on close.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = parse(url).prefix
        self.client = _client(url)
        self._send = Pinned(self.client)
        self._sha = self._send("SCRIPT", "LOAD", PLAIN_CLAIM)
        self._q = Queue(connect(url))

    def fill(self, queue: str, count: int) -> None:
        for start in range(0, count, FILL_CHUNK):
            stop = min(count, start + FILL_CHUNK)
            self._q.enqueue_many(queue, [TaskSpec(payload={"n": i}) for i in range(start, stop)])

    def drain(self, queue: str, batch: int, mode: Mode) -> int:
        if mode != "claim_only":
            raise ValueError("the plain claim script is a baseline of claims only")
        keys = queue_keys(self.prefix, queue).claim
        send, sha, n = self._send, self._sha, len(keys)
        claimed = 0
        while True:
            tokens = os.urandom(16 * batch).hex()
            reply: Any = send("EVALSHA", sha, n, *keys, batch, LEASE_FOR, MAX_LEASE, tokens)
            if not reply:
                return claimed
            claimed += len(reply) // 4

    def close(self) -> None:
        try:
            self._q.close()
            _drop(self.url, self.prefix)
        finally:
            self._send.close()


class PlainStores(Stores):
    """The library on ``url`` beside the plain claim script on the same server, each under a
    prefix of its own; the plain side deletes its keys on close."""

    def __init__(self, url: str) -> None:
        self.kind = "rediss" if parse(url).tls else "redis"
        self.targets = None  # claim rows only: no worker processes
        self.library = Library(connect(url))
        self.raw = PlainRedis(raw_url(url))
