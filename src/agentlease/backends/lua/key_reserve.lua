#!lua
-- key_reserve: reserve an idempotency key for one attempt, or report why not, in one atomic step.
--
-- Reserves when the key is absent or past purge (fence 1, or the old fence + 1 if the hash is
-- still there), or takes it over when it is in flight, its lease ran out (expires <= now) and
-- either the fingerprint is the same or nobody holds it (released): fence + 1. A reservation
-- stores the fingerprint, holder and token, expires = now + hold_for, purge = expires + window.
-- The token is drawn by the caller, so it doubles as the request nonce: a retry of a reservation
-- that was applied (its reply was lost) finds its own token and gets the same reservation back.
--
-- helpers: clock fmt key_read key_save key_record
-- KEYS: 1 the key's hash
-- ARGV: 1 fingerprint, 2 holder, 3 hold_for seconds, 4 window seconds, 5 token
-- Returns: {'hold', fence, expires_at, taken over ('1' or '0')} when reserved (by this call or
--          the one it retries); else {'record', the key as key_get.lua returns it}, unchanged:
--          done or failed (a replay), in flight and live (a duplicate), or another fingerprint
--          (a conflict).
local key = KEYS[1]
local fp, holder, token = ARGV[1], ARGV[2], ARGV[5]
local hold_for, window = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = clock()
local h = key_read(key, {'state', 'fp', 'fence', 'token', 'expires', 'purge', 'taken'})
local live = h.state and tonumber(h.purge) > now
if live and h.state == 'in_flight' and h.token == token then
  return {'hold', tonumber(h.fence), h.expires, h.taken}
end
local expires = fmt(now + hold_for)
local purge = fmt(now + hold_for + window)
local fields = {'fp', fp, 'holder', holder, 'token', token, 'expires', expires}
local fence, taken
if not live then
  fence, taken = (tonumber(h.fence) or 0) + 1, '0'
  if h.state then redis.call('DEL', key) end
  fields[#fields + 1] = 'state'
  fields[#fields + 1] = 'in_flight'
  fields[#fields + 1] = 'created'
  fields[#fields + 1] = fmt(now)
elseif h.state == 'in_flight' and tonumber(h.expires) <= now and (h.fp == fp or h.token == '') then
  fence, taken = tonumber(h.fence) + 1, '1'
else
  local reply = key_record(key, now)
  table.insert(reply, 1, 'record')
  return reply
end
fields[#fields + 1] = 'fence'
fields[#fields + 1] = fence
fields[#fields + 1] = 'taken'
fields[#fields + 1] = taken
key_save(key, fields, purge)
return {'hold', fence, expires, taken}
