#!lua
-- workers_unregister: delete a worker's entry, in one atomic step.
--
-- helpers:
-- KEYS: 1 info (hash: worker id -> registration), 2 ttl (zset: worker id -> when it lapses)
-- ARGV: 1 worker id
-- Returns: 1 if the entry was there, else 0.
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('HDEL', KEYS[1], ARGV[1])
