#!lua
-- plan_secret: the store's key for the MACs of plans, made once: the first caller's 32 random
-- bytes are kept (SET NX) and every caller, that one too, is given what is kept.
--
-- helpers:
-- KEYS: 1 the secret (<prefix>:plans:secret, a slot of its own on a cluster)
-- ARGV: 1 32 random bytes, made by the client
-- Returns: the secret kept.
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
