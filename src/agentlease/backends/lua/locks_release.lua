#!lua
-- locks_release: release every lock of names that the owner holds with a live lease, in one
-- atomic step; the others are left unchanged, whoever holds them. Each lock released keeps the
-- request nonce, so a resend after a lost reply counts those locks as released (and touches
-- nothing) instead of reporting them as not held.
--
-- helpers: clock batched lock_names lock_read
-- KEYS: 1 owners, 2 expiry, 3 freed (name -> nonce of its last release)
-- ARGV: 1 owner, 2 request nonce, 3.. the lock names
-- Returns: the names the owner does not hold (left unchanged), in order.
local owners, expiry, freed = KEYS[1], KEYS[2], KEYS[3]
local owner, nonce = ARGV[1], ARGV[2]
if #ARGV == 3 then
  -- A set of one lock: the same steps on one name, without the tables a set needs.
  local name = ARGV[3]
  local now = clock()
  if redis.call('HGET', freed, name) == nonce then return {} end  -- released by the call resent
  local e = tonumber(redis.call('ZSCORE', expiry, name))
  if e and now < e and redis.call('HGET', owners, name) == owner then
    redis.call('HDEL', owners, name)
    redis.call('ZREM', expiry, name)
    redis.call('HSET', freed, name, nonce)
    return {}
  end
  return {name}
end
local names = lock_names(3)
local held = lock_read(owners, expiry, names, clock())
local done = batched('HMGET', freed, names)
local gone, marks, missing = {}, {}, {}
for i, name in ipairs(names) do
  if done[i] == nonce then  -- released by the call this one resends
  elseif held[i] == owner then
    gone[#gone + 1] = name
    marks[#marks + 1], marks[#marks + 2] = name, nonce
  else
    missing[#missing + 1] = name
  end
end
if #gone > 0 then
  batched('HDEL', owners, gone)
  batched('ZREM', expiry, gone)
  batched('HSET', freed, marks)
end
return missing
