#!lua flags=no-writes
-- stats: counts by state and the oldest queued task's creation time, in one snapshot, in O(1):
-- queued, waiting (scheduled + failed) and dead are the sizes of their ZSETs, leased the size of
-- the index less the queued tasks in it; failed is counted by the scripts that move tasks in and
-- out of that state; parked is the size of the parked ZSET; cancelled is counted by the scripts
-- that cancel; done is what is left. The hot
-- partitions are the first five of the ZSET that scores each by minus its parked tasks.
--
-- helpers: clock fmt
-- KEYS: 1 tasks, 2 counters, 3 ready, 4 waiting, 5 index (leases by expiry, queued tasks by
--       -created_at), 6 dead, 7 parked, 8 hot (partition -> minus its parked tasks)
-- ARGV: none
-- Returns: {now, scheduled, queued, leased, failed, done, dead, oldest created_at or nil,
--          parked, hot partitions: flat, partition then minus its parked tasks, most first,
--          cancelled};
--          nil if nothing was ever enqueued to the queue.
local tasks, counters, ready, waiting = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local index, dead, parked, hot = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
if redis.call('EXISTS', counters) == 0 then return false end
local now = clock()
local failed = tonumber(redis.call('HGET', counters, 'failed')) or 0
local n_waiting, n_queued = redis.call('ZCARD', waiting), redis.call('ZCARD', ready)
local n_leased, n_dead = redis.call('ZCARD', index) - n_queued, redis.call('ZCARD', dead)
local n_parked = redis.call('ZCARD', parked)
local cancelled = tonumber(redis.call('HGET', counters, 'cancelled')) or 0
local done = redis.call('HLEN', tasks) - n_waiting - n_queued - n_leased - n_dead - n_parked
             - cancelled
-- The oldest queued task has the highest negative score; its created_at is that score negated
-- (dropping the sign of the exact decimal string).
local oldest = redis.call('ZREVRANGEBYSCORE', index, '(0', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)[2]
if oldest then oldest = string.sub(oldest, 2) end
return {fmt(now), n_waiting - failed, n_queued, n_leased, failed, done, n_dead, oldest or false,
        n_parked, redis.call('ZRANGE', hot, 0, 4, 'WITHSCORES'), cancelled}
