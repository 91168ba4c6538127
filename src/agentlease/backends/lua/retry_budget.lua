#!lua
-- retry_budget: add calls to a retry budget and, if asked, grant one retry, in one atomic step.
-- An absent (or expired, so deleted) budget has 0 calls and 0 retries. A retry is granted iff
-- retries < minimum or retries < calls * ratio (the calls counted after the addition): the two
-- halves of max(minimum, calls * ratio). A step that changed a count writes the budget and sets
-- its expiry to now + ttl; one that changed nothing writes nothing.
--
-- helpers: clock expire_after
-- KEYS: 1 the budget
-- ARGV: 1 calls (a negative count adds nothing), 2 retry ('1' or '0'), 3 ratio, 4 minimum,
--       5 ttl
-- Returns: {calls, retries, granted (1 or 0)}
local budget = KEYS[1]
local calls = math.max(tonumber(ARGV[1]), 0)
local stored = redis.call('HMGET', budget, 'c', 'r')
local total = (tonumber(stored[1]) or 0) + calls
local retries = tonumber(stored[2]) or 0
local granted = 0
if ARGV[2] == '1' and (retries < tonumber(ARGV[4]) or retries < total * tonumber(ARGV[3])) then
  granted, retries = 1, retries + 1
end
if calls > 0 or granted == 1 then
  redis.call('HSET', budget, 'c', string.format('%.0f', total), 'r', string.format('%.0f', retries))
  expire_after(budget, clock(), ARGV[5])
end
return {total, retries, granted}
