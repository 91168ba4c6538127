#!lua
-- breaker_record: report a call's outcome, in one atomic step. fence 0 (a call admitted while
-- closed) counts only while the breaker is closed: a success resets the failures (written only if
-- there were any), a failure adds one and, at threshold, opens it until now + cooldown. fence > 0
-- counts only if it is the current trial of a half-open breaker: success closes it with no
-- failures, failure reopens it until now + cooldown. Anything else changes nothing. Every write
-- sets the expiry to now + ttl.
--
-- helpers: clock expire_after breaker_reply
-- KEYS: 1 the breaker
-- ARGV: 1 fence, 2 ok ('1' or '0'), 3 threshold, 4 cooldown, 5 ttl
-- Returns: {state, failures, fence, retry_after, 0}: the state after the step (see breaker_reply)
local breaker = KEYS[1]
local b = redis.call('HMGET', breaker, 's', 'f', 'n', 'u')
local state = b[1] or 'closed'
local failures, current, untl = tonumber(b[2]) or 0, tonumber(b[3]) or 0, tonumber(b[4]) or 0
local fence, ok = tonumber(ARGV[1]), ARGV[2] == '1'
local now = clock()
if fence == 0 and state == 'closed' then
  if ok then
    if failures == 0 then return breaker_reply(state, failures, current, untl, now, 0) end
    failures = 0
  else
    failures = failures + 1
    if failures >= tonumber(ARGV[3]) then state, untl = 'open', now + tonumber(ARGV[4]) end
  end
elseif fence > 0 and state == 'half_open' and fence == current then
  if ok then
    state, failures, untl = 'closed', 0, 0
  else
    state, untl = 'open', now + tonumber(ARGV[4])
  end
else
  return breaker_reply(state, failures, current, untl, now, 0)
end
if state == 'closed' then untl = 0 end
redis.call('HSET', breaker, 's', state, 'f', string.format('%.0f', failures),
  'n', string.format('%.0f', current), 'u', string.format('%.17g', untl))
expire_after(breaker, now, ARGV[5])
return breaker_reply(state, failures, current, untl, now, 0)
