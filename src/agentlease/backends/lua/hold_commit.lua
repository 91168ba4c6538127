#!lua
-- hold_commit: end a live hold and keep its units taken for good, in one atomic step; or, given
-- units, settle it: keep those units taken instead (the counter moves by units - held).
-- The units of the counter's holds that ran out (this one too) are given back first. The hold's
-- entry becomes the tombstone 'c' until its expiry, so a resend after a lost reply recognises
-- its own work. Settling at other units than held raises the counter's version.
--
-- helpers: clock counter_sweep counter_bump
-- KEYS: 1 the counter, 2 its holds, 3 their expiry, 4 its version
-- ARGV: 1 token, 2 units to keep ('' for those held)
-- Returns: 1 if it ended the hold (or a resend finds it did), 0 if the token holds nothing.
local counter, holds, token = KEYS[1], KEYS[2], ARGV[1]
counter_sweep(counter, holds, KEYS[3], KEYS[4], clock())
local units = redis.call('HGET', holds, token)
if units == 'c' then return 1 end
if not tonumber(units) then return 0 end
redis.call('HSET', holds, token, 'c')
local moved = ARGV[2] ~= '' and tonumber(ARGV[2]) - tonumber(units) or 0
if moved ~= 0 then
  redis.call('INCRBY', counter, string.format('%.0f', moved))
  counter_bump(KEYS[4])
end
return 1
