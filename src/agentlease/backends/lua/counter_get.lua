#!lua
-- counter_get: a bounded counter's value (absent: 0), after giving back the units of its holds
-- that ran out, in one atomic step.
--
-- helpers: clock counter_sweep
-- KEYS: 1 the counter, 2 its holds, 3 their expiry, 4 its version
-- ARGV: none
-- Returns: the value.
return counter_sweep(KEYS[1], KEYS[2], KEYS[3], KEYS[4], clock())
