#!lua
-- complete_many: complete.lua for many leased tasks of one queue in one script call. Each item is
-- fenced and applied on its own, exactly as complete.lua would (the batch is not all or nothing).
--
-- helpers: clock save_head
-- KEYS: 1 tasks, 2 results, 3 index (leases by expiry, queued tasks), 4 counters (claim's wake
--       time), 5 ready, 6 waiting, 7 busy (partition -> busy tasks), 8 parked, 9 hot
--       (partition -> minus its parked tasks), 10 done (done tasks by finished_at, for purging)
-- ARGV: 1 request nonce (one for the whole batch: each record keeps it on its own), 2 the task
--       ids and tokens, space-separated ("id1 token1 id2 token2 ..."; neither contains a space),
--       then one result JSON per task ('' for none)
-- Returns: one reply per task, in order, each as complete.lua returns it.
local tasks, results, index = KEYS[1], KEYS[2], KEYS[3]
local nonce = ARGV[1]
local now = clock()
local out = {}
local i = 2
for id, token in string.gmatch(ARGV[2], '(%S+) (%S+)') do
  i = i + 1
  local result = ARGV[i]
  local raw = redis.call('HGET', tasks, id)
  if not raw then
    out[#out + 1] = {'unknown'}
  else
    local off, state, attempt, held, expires, req = cmsgpack.unpack_limit(raw, 6, 3)
    if not (state == LEASED and held == token and now < expires) then
      -- helpers here: refusal
      out[#out + 1] = refusal(state, attempt, held, req, token, nonce)
    else
      save_head(tasks, id, raw, off, DONE, attempt, false, false, nonce, now)
      if result ~= '' then redis.call('HSET', results, id, result) end
      redis.call('ZREM', index, id)
      redis.call('ZADD', KEYS[10], now, id)
      -- The record's third byte is its number of values: 22 when it has a partition.
      if string.byte(raw, 3) == 22 then
        -- helpers here: unpark
        local K = {tasks = tasks, counters = KEYS[4], ready = KEYS[5], waiting = KEYS[6],
                   index = index, busy = KEYS[7], parked = KEYS[8], hot = KEYS[9]}
        unpark(K, select(F_PART, cmsgpack.unpack(string.sub(raw, 4))), now)
      end
      out[#out + 1] = 1
    end
  end
end
return out
