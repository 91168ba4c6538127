#!lua
-- fail: record a raised error on a leased task, fenced, in one atomic step: wait for a retry
-- after retry_in seconds (state failed), or dead-letter it (state dead). A dead task with a
-- partition frees it, and the partition's next parked task starts if it is no longer busy.
--
-- helpers: clock fence save task_reply lower_wake attempt_close error_type
-- KEYS: 1 tasks, 2 payloads, 3 results, 4 progress, 5 checkpoints, 6 errors, 7 counters,
--       8 index (leases by expiry, queued tasks), 9 waiting, 10 dead, 11 ready, 12 busy
--       (partition -> busy tasks), 13 parked, 14 hot (partition -> minus its parked tasks),
--       15 contexts, 16 attempts (task id -> its attempt history)
-- ARGV: 1 task id, 2 token, 3 request nonce, 4 error JSON, 5 retry_in seconds ('' to dead-letter)
-- Returns: {'ok', task...} with the task as it now stands (the values of get.lua), or
--          {'replayed', task...} for a retry of this same request, or {'lost', current attempt,
--          state, reason}, or {'unknown'}.
local K = {tasks = KEYS[1], payloads = KEYS[2], results = KEYS[3], progress = KEYS[4],
           checkpoints = KEYS[5], errors = KEYS[6], contexts = KEYS[15]}
local counters, index, waiting, dead = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local id, token, nonce, err = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local retry_in = tonumber(ARGV[5])
local now = clock()
local rec, refusal = fence(K.tasks, id, token, nonce, now)
if not rec then
  if refusal[1] == 'replayed' then
    return {'replayed', task_reply(K, id, load(K.tasks, id))}
  end
  return refusal
end
attempt_close(KEYS[16], id, rec[F_ATTEMPT], rec[F_LEASED], now, 'failed', error_type(err))
rec[F_FAILURES] = rec[F_FAILURES] + 1
rec[F_TOKEN] = false
rec[F_EXPIRES] = false
rec[F_REQ] = nonce
if retry_in then
  rec[F_STATE] = FAILED
  rec[F_RUNAT] = now + retry_in
  redis.call('ZADD', waiting, rec[F_RUNAT], id)
  lower_wake(counters, rec[F_RUNAT])
  redis.call('HINCRBY', counters, 'failed', 1)
else
  rec[F_STATE] = DEAD
  rec[F_FINISHED] = now
  redis.call('ZADD', dead, now, id)
end
save(K.tasks, id, rec)
redis.call('HSET', K.errors, id, err)
redis.call('ZREM', index, id)
if rec[F_STATE] == DEAD and rec[F_PART] then
  -- helpers here: unpark
  unpark({tasks = K.tasks, counters = counters, ready = KEYS[11], waiting = waiting,
          index = index, busy = KEYS[12], parked = KEYS[13], hot = KEYS[14]}, rec[F_PART], now)
end
return {'ok', task_reply(K, id, rec)}
