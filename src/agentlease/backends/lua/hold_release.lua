#!lua
-- hold_release: end a live hold and give its units back to the counter, in one atomic step.
-- The units of the counter's holds that ran out (this one too) are given back first. The hold's
-- entry becomes the tombstone 'r' until its expiry, so a resend after a lost reply recognises
-- its own work.
--
-- helpers: clock counter_sweep
-- KEYS: 1 the counter, 2 its holds, 3 their expiry
-- ARGV: 1 token
-- Returns: 1 if it ended the hold (or a resend finds it did), 0 if the token holds nothing.
local counter, holds, token = KEYS[1], KEYS[2], ARGV[1]
counter_sweep(counter, holds, KEYS[3], clock())
local units = redis.call('HGET', holds, token)
if units == 'r' then return 1 end
if not tonumber(units) then return 0 end
redis.call('HSET', holds, token, 'r')
redis.call('DECRBY', counter, units)
return 1
