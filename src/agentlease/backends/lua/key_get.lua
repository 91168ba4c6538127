#!lua flags=no-writes
-- key_get: read one idempotency key in one consistent snapshot.
--
-- helpers: clock key_record
-- KEYS: 1 the key's hash
-- ARGV: none
-- Returns: state, fingerprint, fence, holder, expires_at, result JSON, error JSON, created_at,
--          finished_at, purge_at, now (times as strings; absent values nil); nil if the key is
--          absent or past purge.
local now = clock()
local v = key_record(KEYS[1], now)
if not v[1] or tonumber(v[10]) <= now then return false end
return v
