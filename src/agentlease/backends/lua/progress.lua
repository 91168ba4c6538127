#!lua
-- progress: record a leased task's progress (and a checkpoint, if given) and restart its
-- progress deadline, fenced, in one atomic step. The lease's expiry is not moved here: the next
-- extend computes it from the new progress time.
--
-- helpers: clock fence save
-- KEYS: 1 tasks, 2 progress, 3 checkpoints
-- ARGV: 1 task id, 2 token, 3 progress JSON ('' clears it), 4 checkpoint JSON ('' keeps the
--       saved one)
-- Returns: 1 when recorded; {'lost', current attempt, state, reason} or {'unknown'} as for
--          complete.lua. (Repeating a progress write is harmless, so it carries no nonce.)
local tasks, progress, checkpoints = KEYS[1], KEYS[2], KEYS[3]
local id, token, value, checkpoint = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = clock()
local rec, refusal = fence(tasks, id, token, false, now)
if not rec then return refusal end
rec[F_PROGRESSED] = now
if value == '' then
  redis.call('HDEL', progress, id)
else
  redis.call('HSET', progress, id, value)
end
if checkpoint ~= '' then
  redis.call('HSET', checkpoints, id, checkpoint)
  rec[F_CHECKPOINTED] = true
end
save(tasks, id, rec)
return 1
