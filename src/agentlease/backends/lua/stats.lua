#!lua flags=no-writes
-- stats: counts by state and the oldest queued task's creation time, in one snapshot, in O(1):
-- queued, leased, waiting (scheduled + failed) and dead are the sizes of their ZSETs; failed is
-- counted by the scripts that move tasks in and out of that state; done is what is left.
--
-- helpers: clock fmt
-- KEYS: 1 tasks, 2 counters, 3 ready, 4 waiting, 5 leases, 6 dead, 7 age (queued by created_at)
-- ARGV: none
-- Returns: {now, scheduled, queued, leased, failed, done, dead, oldest created_at or nil};
--          nil if nothing was ever enqueued to the queue.
local tasks, counters, ready, waiting = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local leases, dead, age = KEYS[5], KEYS[6], KEYS[7]
if redis.call('EXISTS', counters) == 0 then return false end
local now = clock()
local failed = tonumber(redis.call('HGET', counters, 'failed')) or 0
local n_waiting, n_queued = redis.call('ZCARD', waiting), redis.call('ZCARD', ready)
local n_leased, n_dead = redis.call('ZCARD', leases), redis.call('ZCARD', dead)
local done = redis.call('HLEN', tasks) - n_waiting - n_queued - n_leased - n_dead
local oldest = redis.call('ZRANGE', age, 0, 0, 'WITHSCORES')
return {fmt(now), n_waiting - failed, n_queued, n_leased, failed, done, n_dead, oldest[2] or false}
