#!lua
-- locks_acquire: acquire every lock of a set for one owner, or none, in one atomic step.
--
-- A lock is free when nobody holds it or its lease ran out (expires_at <= now); a lock the owner
-- already holds counts as free, and taking it again renews it with a new token. On success each
-- lock gets expires_at = now + ttl and its fencing token + 1 (tokens only rise, across releases
-- and sweeps). A resend after a lost reply finds the locks held by the same owner and takes them
-- again: new tokens, still rising.
--
-- helpers: clock fmt batched lock_names lock_read
-- KEYS: 1 owners, 2 expiry, 3 fences
-- ARGV: 1 owner, 2 ttl seconds, 3.. the lock names (sorted, no duplicates)
-- Returns: {'ok', {the token of each name, in order}}; or {'busy', name, holder, seconds until
--          its lease runs out} for the first lock another owner holds (nothing changed).
local owners, expiry, fences = KEYS[1], KEYS[2], KEYS[3]
local owner, ttl = ARGV[1], tonumber(ARGV[2])
if #ARGV == 3 then
  -- A set of one lock: the same steps on one name, without the tables a set needs.
  local name = ARGV[3]
  local now = clock()
  local holder = redis.call('HGET', owners, name)
  if holder and holder ~= owner then
    local e = tonumber(redis.call('ZSCORE', expiry, name))
    if e and now < e then return {'busy', name, holder, fmt(e - now)} end
  end
  local token = redis.call('HINCRBY', fences, name, 1)
  redis.call('HSET', owners, name, owner)
  redis.call('ZADD', expiry, now + ttl, name)
  return {'ok', {token}}
end
local names = lock_names(3)
local now = clock()
local held, expires = lock_read(owners, expiry, names, now)
for i, name in ipairs(names) do
  if held[i] and held[i] ~= owner then return {'busy', name, held[i], fmt(expires[i] - now)} end
end
local tokens = batched('HMGET', fences, names)
local until_ = now + ttl
local f, o, x = {}, {}, {}
for i, name in ipairs(names) do
  tokens[i] = (tonumber(tokens[i]) or 0) + 1
  f[#f + 1], f[#f + 2] = name, tokens[i]
  o[#o + 1], o[#o + 2] = name, owner
  x[#x + 1], x[#x + 2] = until_, name
end
batched('HSET', fences, f)
batched('HSET', owners, o)
batched('ZADD', expiry, x)
return {'ok', tokens}
