#!lua
-- hold_extend: renew a live hold to now + ttl, in one atomic step. A hold that ran out (swept or
-- not yet), ended, or never was is left as it is. Repeating it is harmless.
--
-- helpers: clock
-- KEYS: 1 the counter's holds, 2 their expiry
-- ARGV: 1 token, 2 ttl seconds
-- Returns: 1 if renewed, 0 if the token holds nothing.
local holds, expiry, token = KEYS[1], KEYS[2], ARGV[1]
local now = clock()
local expires = tonumber(redis.call('ZSCORE', expiry, token))
if not expires or expires <= now or not tonumber(redis.call('HGET', holds, token)) then
  return 0
end
redis.call('ZADD', expiry, now + tonumber(ARGV[2]), token)
return 1
