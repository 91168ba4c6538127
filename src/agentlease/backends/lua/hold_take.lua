#!lua
-- hold_take: hold units of a bounded counter for a token until now + ttl, in one atomic step,
-- unless the counter would pass high. The units of the counter's holds that ran out are given
-- back first; taking units raises the counter's version. A resend after a lost reply finds its token there and changes nothing.
--
-- helpers: clock counter_sweep counter_bump
-- KEYS: 1 the counter, 2 its holds, 3 their expiry, 4 its version
-- ARGV: 1 token, 2 units, 3 high, 4 ttl seconds
-- Returns: {'ok', the new value}; {'limit', the current value} (nothing else changed).
local counter, holds, expiry = KEYS[1], KEYS[2], KEYS[3]
local token, units = ARGV[1], tonumber(ARGV[2])
local now = clock()
local value = counter_sweep(counter, holds, expiry, KEYS[4], now)
if redis.call('HEXISTS', holds, token) == 1 then return {'ok', value} end
if value + units > tonumber(ARGV[3]) then return {'limit', value} end
redis.call('HSET', holds, token, ARGV[2])
redis.call('ZADD', expiry, now + tonumber(ARGV[4]), token)
if units == 0 then return {'ok', value} end
counter_bump(KEYS[4])
return {'ok', redis.call('INCRBY', counter, ARGV[2])}
