#!lua
-- key_reserve: reserve an idempotency key for one attempt, or report why not, in one atomic step.
--
-- Reserves when the key is absent or past purge (fence 1, or the old fence + 1 if the hash is
-- still there), or takes it over when it is in flight, its lease ran out (expires <= now) and
-- either the fingerprint is the same or nobody holds it (released): fence + 1. A reservation
-- stores the fingerprint, holder and token, expires = now + hold_for, purge = expires + window.
-- The token is drawn by the caller, so it doubles as the request nonce: a retry of a reservation
-- that was applied (its reply was lost) finds its own token and gets the same reservation back.
-- One read of every field the decision or the reply needs: a replay (the commonest call that
-- writes nothing) costs that read and its reply.
--
-- helpers: clock fmt key_save
-- KEYS: 1 the key's hash
-- ARGV: 1 fingerprint, 2 holder, 3 hold_for seconds, 4 window seconds, 5 token
-- Returns: {'hold', fence, expires_at, taken over ('1' or '0')} when reserved (by this call or
--          the one it retries); else {'record', the key as key_get.lua returns it}, unchanged:
--          done or failed (a replay), in flight and live (a duplicate), or another fingerprint
--          (a conflict).
local key = KEYS[1]
local fp, token = ARGV[1], ARGV[5]
-- state, fp, fence, holder, expires, result, error, created, finished, purge, token, taken
local v = redis.call('HMGET', key, 'state', 'fp', 'fence', 'holder', 'expires', 'result',
                     'error', 'created', 'finished', 'purge', 'token', 'taken')
local now = clock()
local state = v[1]
local live = state and tonumber(v[10]) > now
local fence, taken
if not live then
  fence, taken = (tonumber(v[3]) or 0) + 1, '0'
  if state then redis.call('DEL', key) end
elseif state ~= 'in_flight' then
  return {'record', state, v[2], tonumber(v[3]), v[4], v[5], v[6], v[7], v[8], v[9], v[10],
          fmt(now)}
elseif v[11] == token then
  return {'hold', tonumber(v[3]), v[5], v[12]}
elseif tonumber(v[5]) <= now and (v[2] == fp or v[11] == '') then
  fence, taken = tonumber(v[3]) + 1, '1'
else
  return {'record', state, v[2], tonumber(v[3]), v[4], v[5], v[6], v[7], v[8], v[9], v[10],
          fmt(now)}
end
local hold_for = tonumber(ARGV[3])
local expires = fmt(now + hold_for)
local fields = {'fp', fp, 'holder', ARGV[2], 'token', token, 'expires', expires, 'fence', fence,
                'taken', taken}
if not live then
  fields[#fields + 1] = 'state'
  fields[#fields + 1] = 'in_flight'
  fields[#fields + 1] = 'created'
  fields[#fields + 1] = fmt(now)
end
key_save(key, fields, fmt(now + hold_for + tonumber(ARGV[4])))
return {'hold', fence, expires, taken}
