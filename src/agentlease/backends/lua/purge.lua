#!lua
-- purge: delete up to limit done (dead, cancelled) tasks of one queue that finished at least
-- older_than seconds ago (store clock), oldest first, in one atomic step, reading only the tasks
-- it deletes from the finished ZSET (done: {p:q}:f, dead: {p:q}:d, cancelled: {p:q}:z). A task
-- goes with everything it held (record, payload, result, progress, checkpoint, error, context,
-- attempts) and frees its dedup key. Its entry in the global id index (another slot) is dropped
-- by the client afterwards, from the ids
-- this returns; a resend of the same request (same nonce, after a lost reply) returns the same
-- ids again, kept in the counters hash until the next purge of the queue, which returns them
-- once more (as "previous"), so that ids a client never freed (it died between the two steps)
-- are freed by the next purge. Freeing an id twice is harmless: the client puts back the entry
-- of an id enqueued to this queue again meanwhile.
--
-- Done tasks completed by a client of key layout 1 are not in {p:q}:f. While the counters hash
-- lacks 'fidx', each purge of done tasks first indexes up to limit more of the queue's records
-- (HSCAN of the tasks hash, its cursor kept in 'fscan'), and sets 'fidx' once the scan is over:
-- a bounded backfill, done once per queue, spread over the first purges.
--
-- helpers: clock load
-- KEYS: 1 tasks, 2 payloads, 3 results, 4 progress, 5 checkpoints, 6 errors, 7 contexts,
--       8 dedup (dedup key -> task id), 9 counters, 10 finished (the ZSET of the state purged),
--       11 done (the done ZSET, for the backfill), 12 attempts (task id -> its attempt history)
-- ARGV: 1 state ('done', 'dead' or 'cancelled'), 2 older_than seconds, 3 limit, 4 request nonce
-- Returns: {the ids purged, the ids the previous purge of the queue returned}.
local tasks, counters, finished = KEYS[1], KEYS[9], KEYS[10]
local want, limit, nonce = ARGV[1], tonumber(ARGV[3]), ARGV[4]
local last = {}
for id in string.gmatch(redis.call('HGET', counters, 'pids') or '', '%S+') do
  last[#last + 1] = id
end
if redis.call('HGET', counters, 'pnonce') == nonce then return {last, {}} end
local state = DEAD
if want == 'cancelled' then state = CANCELLED end
if want == 'done' then
  state = DONE
  if redis.call('EXISTS', counters) == 1 and not redis.call('HGET', counters, 'fidx') then
    local scan = redis.call('HSCAN', tasks, redis.call('HGET', counters, 'fscan') or '0',
                            'COUNT', limit)
    local found = scan[2]
    for i = 1, #found, 2 do
      local _, st, _, _, _, _, fin = cmsgpack.unpack_limit(found[i + 1], 6, 3)
      if st == DONE and fin then redis.call('ZADD', KEYS[11], fin, found[i]) end
    end
    if scan[1] == '0' then
      redis.call('HSET', counters, 'fidx', 1)
      redis.call('HDEL', counters, 'fscan')
    else
      redis.call('HSET', counters, 'fscan', scan[1])
    end
  end
end
local cutoff = clock() - tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', finished, '-inf', cutoff, 'LIMIT', 0, limit)
local purged = {}
for _, id in ipairs(ids) do
  redis.call('ZREM', finished, id)
  local rec = load(tasks, id)
  if rec and rec[F_STATE] == state then
    local dedup = rec[F_DEDUP]
    if dedup and redis.call('HGET', KEYS[8], dedup) == id then redis.call('HDEL', KEYS[8], dedup) end
    for k = 1, 7 do redis.call('HDEL', KEYS[k], id) end
    redis.call('HDEL', KEYS[12], id, '>' .. id)
    purged[#purged + 1] = id
  end
end
if state == CANCELLED and #purged > 0 then
  redis.call('HINCRBY', counters, 'cancelled', -#purged)  -- stats counts them there
end
if #purged > 0 then
  redis.call('HSET', counters, 'pnonce', nonce, 'pids', table.concat(purged, ' '))
elseif #last > 0 then
  redis.call('HDEL', counters, 'pnonce', 'pids')  -- handed out once more, below
end
return {purged, last}
