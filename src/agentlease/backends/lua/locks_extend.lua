#!lua
-- locks_extend: renew, to now + ttl, every lock of names that the owner holds with a live lease,
-- in one atomic step. Repeating it is harmless, so it carries no request nonce.
--
-- helpers: clock batched lock_names lock_read
-- KEYS: 1 owners, 2 expiry
-- ARGV: 1 owner, 2 ttl seconds, 3.. the lock names
-- Returns: the names the owner does not hold (left unchanged), in order.
local owners, expiry = KEYS[1], KEYS[2]
local owner, ttl = ARGV[1], tonumber(ARGV[2])
local names = lock_names(3)
local now = clock()
local held = lock_read(owners, expiry, names, now)
local x, missing = {}, {}
for i, name in ipairs(names) do
  if held[i] == owner then
    x[#x + 1], x[#x + 2] = now + ttl, name
  else
    missing[#missing + 1] = name
  end
end
if #x > 0 then batched('ZADD', expiry, x) end
return missing
