#!lua
-- counter_version: a bounded counter's value and version (absent: 0 and 0), after giving back
-- the units of its holds that ran out, in one atomic step: one snapshot of both.
--
-- helpers: clock counter_sweep
-- KEYS: 1 the counter, 2 its holds, 3 their expiry, 4 its version
-- ARGV: none
-- Returns: {value, version}.
local value = counter_sweep(KEYS[1], KEYS[2], KEYS[3], KEYS[4], clock())
return {value, tonumber(redis.call('GET', KEYS[4])) or 0}
