#!lua
-- complete: mark a leased task done with its result, fenced, in one atomic step.
--
-- helpers: clock fence save
-- KEYS: 1 tasks, 2 results, 3 leases
-- ARGV: 1 task id, 2 token, 3 request nonce, 4 result JSON ('' for none)
-- Returns: 1 when done; {'replayed'} when this same request was already applied (a retry after
--          a lost reply); {'lost', current attempt, state, reason} when the lease is not held;
--          {'unknown'} when there is no such task in this queue.
local tasks, results, leases = KEYS[1], KEYS[2], KEYS[3]
local id, token, nonce, result = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = clock()
local rec, refusal = fence(tasks, id, token, nonce, now)
if not rec then return refusal end
rec[F_STATE] = DONE
rec[F_FINISHED] = now
rec[F_TOKEN] = false
rec[F_EXPIRES] = false
rec[F_REQ] = nonce
save(tasks, id, rec)
if result ~= '' then redis.call('HSET', results, id, result) end
redis.call('ZREM', leases, id)
return 1
