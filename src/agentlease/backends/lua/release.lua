#!lua
-- release: give a leased task back unrun (neither a failure nor a reclaim), fenced, in one
-- atomic step: to the front of its priority, or behind every queued task.
--
-- helpers: clock fence save make_ready attempt_close
-- KEYS: 1 tasks, 2 counters, 3 index (leases by expiry, queued tasks), 4 ready, 5 attempts
--       (task id -> its attempt history)
-- ARGV: 1 task id, 2 token, 3 request nonce, 4 front ('1') or back ('0')
-- Returns: 1 when released; {'replayed'}, {'lost', current attempt, state, reason} or
--          {'unknown'} as for complete.lua.
local tasks, counters, index, ready = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, token, nonce, front = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1'
local now = clock()
local rec, refusal = fence(tasks, id, token, nonce, now)
if not rec then return refusal end
attempt_close(KEYS[5], id, rec[F_ATTEMPT], rec[F_LEASED], now, 'released', false)
rec[F_TOKEN] = false
rec[F_EXPIRES] = false
rec[F_REQ] = nonce
make_ready(rec, id, front, counters, ready, index)  -- replaces the lease's index entry
save(tasks, id, rec)
return 1
