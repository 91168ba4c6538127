#!lua
-- breaker_admit: whether a call may go ahead, in one atomic step. Closed (or absent): a read,
-- nothing written. Open and still cooling down, or half-open with a live trial: a read, with the
-- seconds to wait. Open past its cool-down, or half-open whose trial's turn ran out: becomes
-- half-open with fence + 1 and a trial's turn until now + trial_for, expiry now + ttl, and this
-- caller gets the trial (exactly one caller per half-open window: scripts run one at a time).
--
-- helpers: clock expire_after breaker_reply
-- KEYS: 1 the breaker
-- ARGV: 1 trial_for, 2 ttl
-- Returns: {state, failures, fence, retry_after, trial (1 or 0)} (see breaker_reply)
local breaker = KEYS[1]
local b = redis.call('HMGET', breaker, 's', 'f', 'n', 'u')
local state = b[1] or 'closed'
local failures, fence = tonumber(b[2]) or 0, tonumber(b[3]) or 0
if state == 'closed' then return {state, failures, fence, '0', 0} end
local now, untl = clock(), tonumber(b[4])
if now < untl then return breaker_reply(state, failures, fence, untl, now, 0) end
fence = fence + 1
untl = now + tonumber(ARGV[1])
redis.call('HSET', breaker, 's', 'half_open', 'n', string.format('%.0f', fence),
  'u', string.format('%.17g', untl))
expire_after(breaker, now, ARGV[2])
return breaker_reply('half_open', failures, fence, untl, now, 1)
