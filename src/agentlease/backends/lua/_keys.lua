-- Helpers shared by the idempotency-key scripts (key_*.lua), prepended like those of _lib.lua.
--
-- An idempotency key is one hash, <prefix>:key:{<key>} (the key is its own hash tag, so keys
-- spread over a cluster and each script touches that one hash), with the fields:
--   state     'in_flight', 'done' or 'failed'
--   fp        the fingerprint of the action's arguments
--   fence     +1 at every reservation (first, takeover, or first after a purge)
--   holder    who holds the reservation ('' for nobody: finished or released)
--   token     the holder's token ('' for nobody); holder writes must show it
--   taken     '1' if the reservation was a takeover, else '0'
--   expires   the in-flight lease's end (absent once finished)
--   result    the result JSON (absent for none); error: the permanent failure JSON
--   created, finished, purge: times (fmt() strings; finished absent until finished)
--   nonce     the request nonce of the last holder write that gave the reservation up
-- Every write moves the hash's expiry (PEXPIREAT) to purge, so Redis deletes keys past the dedup
-- window itself; a hash still there at or past purge counts as absent.

-- @helper key_save:
-- Write fields (a flat name, value list) and purge (a fmt() string), and move the hash's expiry
-- to purge, rounded up to the millisecond so that Redis never deletes a key before it counts as
-- absent.
local function key_save(key, fields, purge)
  redis.call('HSET', key, 'purge', purge, unpack(fields))
  redis.call('PEXPIREAT', key, string.format('%.0f', math.ceil(tonumber(purge) * 1000)))
end

-- @helper key_held:
-- Fencing: the key's state, token, fence, expires, purge and nonce (HMGET's reply) if its
-- reservation is held under token (in flight, not past purge), else nil and the reply to send.
-- The clock does not decide for the holder: an in-flight lease that ran out is still held until
-- another attempt takes it over. A write that gives the reservation up stores its request nonce;
-- a retry of it (its reply was lost) finds that nonce and is answered 'replayed' instead of lost.
local function key_held(key, token, nonce, now)
  local v = redis.call('HMGET', key, 'state', 'token', 'fence', 'expires', 'purge', 'nonce')
  local live = v[1] and tonumber(v[5]) > now
  if live and v[1] == 'in_flight' and token ~= '' and v[2] == token then
    return v, nil
  end
  if nonce and v[1] and v[6] == nonce then return nil, {'replayed'} end
  if not live then return nil, {'lost', false, false} end
  return nil, {'lost', tonumber(v[3]), v[1]}
end

-- @helper key_finish: clock fmt key_held
-- Store an outcome (complete: 'done' and its result; fail: 'failed' and its error), fenced: no
-- holder, no in-flight lease, purged window seconds from now (the hash's expiry follows, as in
-- key_save). Returns the script's reply.
local function key_finish(key, state, field, value, token, nonce, window)
  local now = clock()
  local h, refusal = key_held(key, token, nonce, now)
  if not h then return refusal end
  redis.call('HDEL', key, 'expires')
  local purge = fmt(now + window)
  if value ~= '' then
    redis.call('HSET', key, 'purge', purge, 'state', state, 'finished', fmt(now), 'token', '',
               'holder', '', 'nonce', nonce, field, value)
  else
    redis.call('HSET', key, 'purge', purge, 'state', state, 'finished', fmt(now), 'token', '',
               'holder', '', 'nonce', nonce)
  end
  redis.call('PEXPIREAT', key, string.format('%.0f', math.ceil(tonumber(purge) * 1000)))
  return {'ok'}
end

-- @helper key_record: fmt
-- Everything a read shows of a key, as one flat array (see lua.key_record_from): state,
-- fingerprint, fence, holder, expires_at, result, error, created_at, finished_at, purge_at, now.
local function key_record(key, now)
  local v = redis.call('HMGET', key, 'state', 'fp', 'fence', 'holder', 'expires', 'result',
                       'error', 'created', 'finished', 'purge')
  v[3] = tonumber(v[3])
  v[11] = fmt(now)
  return v
end
