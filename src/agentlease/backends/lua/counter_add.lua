#!lua
-- counter_add: add delta to a bounded counter (absent: 0), in one atomic step, unless the new
-- value would be below low or above high. A delta other than 0 raises the counter's version.
--
-- The units of the counter's holds that ran out are given back first, in the same step.
--
-- helpers: clock counter_sweep counter_bump
-- KEYS: 1 the counter, 2 its holds, 3 their expiry, 4 its version
-- ARGV: 1 delta, 2 low ('' for none), 3 high ('' for none)
-- Returns: {'ok', the new value}; {'limit', the current value} (nothing else changed).
local counter = KEYS[1]
local value = counter_sweep(counter, KEYS[2], KEYS[3], KEYS[4], clock())
local delta = tonumber(ARGV[1])
local new = value + delta
local low, high = tonumber(ARGV[2]), tonumber(ARGV[3])
if (low and new < low) or (high and new > high) then return {'limit', value} end
if delta == 0 then return {'ok', value} end
counter_bump(KEYS[4])
return {'ok', redis.call('INCRBY', counter, ARGV[1])}
