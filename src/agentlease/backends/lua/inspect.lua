#!lua flags=no-writes
-- inspect: the live leases of one queue, soonest expiry first, in one snapshot.
--
-- helpers: clock fmt load
-- KEYS: 1 tasks, 2 counters, 3 index (leases by expiry, queued tasks), 4 attempts (task id ->
--       its attempt history; '>' .. task id -> the worker of its last claim, the holder)
-- ARGV: 1 limit
-- Returns: {now, then 7 values per lease: id, attempt, leased_at, expires_at, reclaims,
--          failures, holder (nil if none)}; nil if nothing was ever enqueued to the queue.
local tasks, counters, index = KEYS[1], KEYS[2], KEYS[3]
if redis.call('EXISTS', counters) == 0 then return false end
local now = clock()
local out = {fmt(now)}
local ids = redis.call('ZRANGEBYSCORE', index, '(' .. string.format('%.17g', now), '+inf',
                       'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(ids) do
  local rec = load(tasks, id)
  out[#out + 1] = id
  out[#out + 1] = rec[F_ATTEMPT]
  out[#out + 1] = fmt(rec[F_LEASED])
  out[#out + 1] = fmt(rec[F_EXPIRES])
  out[#out + 1] = rec[F_RECLAIMS]
  out[#out + 1] = rec[F_FAILURES]
  local holder = redis.call('HGET', KEYS[4], '>' .. id)
  out[#out + 1] = holder
end
return out
