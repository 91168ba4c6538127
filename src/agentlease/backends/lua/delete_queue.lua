#!lua
-- delete_queue: delete up to cap tasks of one queue (any state) in one atomic step and, once
-- none is left, every key of the queue. Unless forced, a queue with a live lease is refused and
-- nothing is deleted. Tasks are picked with HRANDFIELD (O(cap), whatever the queue's size); each
-- leaves every hash and ZSET of the queue, and the counts stats reads stay right for the rest.
-- The caller removes the returned ids from the global ids hash (another slot), and the queue
-- from the queues set once it is gone.
--
-- helpers: clock load member
-- KEYS: 1 tasks, 2 payloads, 3 results, 4 progress, 5 checkpoints, 6 errors, 7 contexts,
--       8 counters, 9 ready, 10 waiting, 11 index, 12 dead, 13 dedup, 14 busy, 15 parked, 16 hot,
--       17 attempts, 18 done (by finished_at), 19 cancelled (by finished_at)
-- ARGV: 1 cap, 2 force ('1') or not ('0')
-- Returns: {'busy', live leases} when refused; else {'more' | 'gone', deleted ids...}.
local tasks, counters, index = KEYS[1], KEYS[8], KEYS[11]
local cap, force = tonumber(ARGV[1]), ARGV[2] == '1'
if not force then
  local leased = redis.call('ZCOUNT', index, string.format('(%.17g', clock()), '+inf')
  if leased > 0 then return {'busy', leased} end
end
local ids = redis.call('HRANDFIELD', tasks, cap)
local out = {'more'}
for _, id in ipairs(ids) do
  local rec = load(tasks, id)
  local state = rec[F_STATE]
  if state == QUEUED then redis.call('ZREM', KEYS[9], member(rec, id)) end
  if state == FAILED then redis.call('HINCRBY', counters, 'failed', -1) end
  if state == CANCELLED then redis.call('HINCRBY', counters, 'cancelled', -1) end
  redis.call('ZREM', KEYS[10], id)
  redis.call('ZREM', index, id)
  redis.call('ZREM', KEYS[12], id)
  redis.call('ZREM', KEYS[18], id)
  redis.call('ZREM', KEYS[19], id)
  if rec[F_DEDUP] then redis.call('HDEL', KEYS[13], rec[F_DEDUP]) end
  local part = rec[F_PART]
  if part then
    if state == PARKED then
      local flag = 1
      if rec[F_FRONT] == 1 then flag = 0 end
      redis.call('ZREM', KEYS[15],
                 part .. '\0' .. string.format('%d%016x', flag, rec[F_SEQ]) .. '\0' .. id)
      if tonumber(redis.call('ZINCRBY', KEYS[16], 1, part)) >= 0 then
        redis.call('ZREM', KEYS[16], part)
      end
    elseif state ~= DONE and state ~= DEAD and state ~= CANCELLED then
      redis.call('HINCRBY', KEYS[14], part, -1)
    end
  end
  out[#out + 1] = id
end
for i = 1, #ids, 1000 do
  local chunk = {unpack(ids, i, math.min(i + 999, #ids))}
  for k = 1, 7 do redis.call('HDEL', KEYS[k], unpack(chunk)) end
  redis.call('HDEL', KEYS[17], unpack(chunk))
  for k = 1, #chunk do chunk[k] = '>' .. chunk[k] end
  redis.call('HDEL', KEYS[17], unpack(chunk))
end
if redis.call('HLEN', tasks) == 0 then
  redis.call('UNLINK', unpack(KEYS))
  out[1] = 'gone'
end
return out
