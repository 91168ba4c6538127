#!lua
-- complete: mark a leased task done with its result, fenced, in one atomic step. A task with a
-- partition frees it, and the partition's next parked task starts if it is no longer busy.
--
-- helpers: clock save_head
-- KEYS: 1 tasks, 2 results, 3 index (leases by expiry, queued tasks), 4 counters (claim's wake
--       time), 5 ready, 6 waiting, 7 busy (partition -> busy tasks), 8 parked, 9 hot
--       (partition -> minus its parked tasks), 10 done (done tasks by finished_at, for purging)
-- ARGV: 1 task id, 2 token, 3 request nonce, 4 result JSON ('' for none)
-- Returns: 1 when done; {'replayed'} when this same request was already applied (a retry after
--          a lost reply); {'lost', current attempt, state, reason} when the lease is not held;
--          {'unknown'} when there is no such task in this queue.
local tasks, results, index = KEYS[1], KEYS[2], KEYS[3]
local id, token, nonce, result = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = clock()
-- Fenced as fence() does, on the head of the record (the values this write changes).
local raw = redis.call('HGET', tasks, id)
if not raw then return {'unknown'} end
local off, state, attempt, held, expires, req = cmsgpack.unpack_limit(raw, 6, 3)
if not (state == LEASED and held == token and now < expires) then
  -- helpers here: refusal
  return refusal(state, attempt, held, req, token, nonce)
end
save_head(tasks, id, raw, off, DONE, attempt, false, false, nonce, now)
if result ~= '' then redis.call('HSET', results, id, result) end
redis.call('ZREM', index, id)
redis.call('ZADD', KEYS[10], now, id)
-- The record's third byte is its number of values: 22 when it has a partition (see _lib.lua).
if string.byte(raw, 3) == 22 then
  -- helpers here: unpark
  local K = {tasks = tasks, counters = KEYS[4], ready = KEYS[5], waiting = KEYS[6],
             index = index, busy = KEYS[7], parked = KEYS[8], hot = KEYS[9]}
  unpark(K, select(F_PART, cmsgpack.unpack(string.sub(raw, 4))), now)
end
return 1
