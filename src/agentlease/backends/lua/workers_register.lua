#!lua
-- workers_register: write (or refresh) a live worker's entry, lapsing ttl seconds from now on the
-- store's clock, and delete up to 100 entries that have lapsed, in one atomic step.
--
-- helpers: clock
-- KEYS: 1 info (hash: worker id -> its last beat, '%.17g', a newline, then its registration
--       JSON), 2 ttl (zset: worker id -> when its entry lapses)
-- ARGV: 1 worker id, 2 registration JSON, 3 ttl seconds
-- Returns: when the entry lapses, as a '%.17g' string.
local info, ttl = KEYS[1], KEYS[2]
local now = clock()
local lapsed = redis.call('ZRANGEBYSCORE', ttl, '-inf', string.format('%.17g', now),
                          'LIMIT', 0, 100)
if #lapsed > 0 then
  redis.call('HDEL', info, unpack(lapsed))
  redis.call('ZREM', ttl, unpack(lapsed))
end
local expires = string.format('%.17g', now + tonumber(ARGV[3]))
redis.call('HSET', info, ARGV[1], string.format('%.17g', now) .. '\n' .. ARGV[2])
redis.call('ZADD', ttl, expires, ARGV[1])
return expires
