#!lua
-- hold_take: hold units of a bounded counter for a token until now + ttl, in one atomic step,
-- unless the counter would pass high. The units of the counter's holds that ran out are given
-- back first. A resend after a lost reply finds its token there and changes nothing.
--
-- helpers: clock counter_sweep
-- KEYS: 1 the counter, 2 its holds, 3 their expiry
-- ARGV: 1 token, 2 units, 3 high, 4 ttl seconds
-- Returns: {'ok', the new value}; {'limit', the current value} (nothing else changed).
local counter, holds, expiry = KEYS[1], KEYS[2], KEYS[3]
local token, units = ARGV[1], tonumber(ARGV[2])
local now = clock()
local value = counter_sweep(counter, holds, expiry, now)
if redis.call('HEXISTS', holds, token) == 1 then return {'ok', value} end
if value + units > tonumber(ARGV[3]) then return {'limit', value} end
redis.call('HSET', holds, token, ARGV[2])
redis.call('ZADD', expiry, now + tonumber(ARGV[4]), token)
return {'ok', redis.call('INCRBY', counter, ARGV[2])}
