#!lua flags=no-writes
-- locks_holders: who holds each of names, in one consistent snapshot.
--
-- helpers: clock fmt batched lock_names lock_read
-- KEYS: 1 owners, 2 expiry
-- ARGV: 1.. the lock names
-- Returns: 2 values per name, in order: its owner and expires_at (a string) if it is held with
--          a live lease, else nil and nil.
local names = lock_names(1)
local held, expires = lock_read(KEYS[1], KEYS[2], names, clock())
local out = {}
for i = 1, #names do
  out[2 * i - 1], out[2 * i] = held[i], fmt(expires[i])
end
return out
