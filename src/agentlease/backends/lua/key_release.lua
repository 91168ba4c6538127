#!lua
-- key_release: give a reservation up (its action is known not to have applied), fenced, in one
-- atomic step: the key stays in flight with no holder and expires = now, so the next reserve
-- takes it over at once (fence + 1) whatever its fingerprint. purge is unchanged.
--
-- helpers: clock fmt key_held key_save
-- KEYS: 1 the key's hash
-- ARGV: 1 token, 2 request nonce
-- Returns: {'ok'}, {'replayed'} or {'lost', current fence, state} as for key_complete.lua.
local key = KEYS[1]
local token, nonce = ARGV[1], ARGV[2]
local now = clock()
local h, refusal = key_held(key, token, nonce, now)
if not h then return refusal end
key_save(key, {'token', '', 'holder', '', 'expires', fmt(now), 'nonce', nonce}, h[5])
return {'ok'}
