#!lua
-- hold_release: end a live hold and give its units back to the counter, in one atomic step.
-- The units of the counter's holds that ran out (this one too) are given back first. The hold's
-- entry becomes the tombstone 'r' until its expiry, so a resend after a lost reply recognises
-- its own work. Giving units back raises the counter's version.
--
-- helpers: clock counter_sweep counter_bump
-- KEYS: 1 the counter, 2 its holds, 3 their expiry, 4 its version
-- ARGV: 1 token
-- Returns: 1 if it ended the hold (or a resend finds it did), 0 if the token holds nothing.
local counter, holds, token = KEYS[1], KEYS[2], ARGV[1]
counter_sweep(counter, holds, KEYS[3], KEYS[4], clock())
local units = redis.call('HGET', holds, token)
if units == 'r' then return 1 end
if not tonumber(units) then return 0 end
redis.call('HSET', holds, token, 'r')
if tonumber(units) ~= 0 then
  redis.call('DECRBY', counter, units)
  counter_bump(KEYS[4])
end
return 1
