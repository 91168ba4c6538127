#!lua
-- key_extend: extend an in-flight reservation to now + hold_for, fenced by its token, in one
-- atomic step. The dedup window follows the lease: purge keeps the distance from expires that
-- the reservation set (and never moves earlier). Held means in flight under this token; the
-- clock does not decide (a lease that ran out is held until another attempt takes it over).
-- Repeating an extend is harmless, so it carries no request nonce.
--
-- helpers: clock fmt key_held key_save
-- KEYS: 1 the key's hash
-- ARGV: 1 token, 2 hold_for seconds
-- Returns: {'ok', new expires_at}; {'lost', current fence, state} when not held (both nil when
--          the key is absent or past purge).
local key = KEYS[1]
local token, hold_for = ARGV[1], tonumber(ARGV[2])
local now = clock()
local h, refusal = key_held(key, token, nil, now)
if not h then return refusal end
local old_expires, old_purge = tonumber(h[4]), tonumber(h[5])
local expires = now + hold_for
local purge = fmt(math.max(old_purge, expires + (old_purge - old_expires)))
key_save(key, {'expires', fmt(expires)}, purge)
return {'ok', fmt(expires)}
