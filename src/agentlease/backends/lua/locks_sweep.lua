#!lua
-- locks_sweep: free up to limit locks whose lease ran out (expires_at <= now), soonest expiry
-- first, in one atomic step. The cost is proportional to the expired locks: live ones are never
-- read. Fences stay, so tokens keep rising.
--
-- helpers: clock batched
-- KEYS: 1 owners, 2 expiry
-- ARGV: 1 limit (at least 1)
-- Returns: how many locks it freed.
local owners, expiry = KEYS[1], KEYS[2]
local names = redis.call('ZRANGEBYSCORE', expiry, '-inf', clock(), 'LIMIT', 0, tonumber(ARGV[1]))
if #names > 0 then
  batched('HDEL', owners, names)
  batched('ZREM', expiry, names)
end
return #names
