#!lua
-- hold_commit: end a live hold and keep its units taken for good, in one atomic step; or, given
-- units, settle it: keep those units taken instead (the counter moves by units - held).
-- The units of the counter's holds that ran out (this one too) are given back first. The hold's
-- entry becomes the tombstone 'c' until its expiry, so a resend after a lost reply recognises
-- its own work.
--
-- helpers: clock counter_sweep
-- KEYS: 1 the counter, 2 its holds, 3 their expiry
-- ARGV: 1 token, 2 units to keep ('' for those held)
-- Returns: 1 if it ended the hold (or a resend finds it did), 0 if the token holds nothing.
local counter, holds, token = KEYS[1], KEYS[2], ARGV[1]
counter_sweep(counter, holds, KEYS[3], clock())
local units = redis.call('HGET', holds, token)
if units == 'c' then return 1 end
if not tonumber(units) then return 0 end
redis.call('HSET', holds, token, 'c')
if ARGV[2] ~= '' and ARGV[2] ~= units then
  redis.call('INCRBY', counter, string.format('%.0f', tonumber(ARGV[2]) - tonumber(units)))
end
return 1
