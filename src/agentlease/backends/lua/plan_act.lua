#!lua
-- plan_act: act on a plan (an approval gate), all or nothing, in one atomic step:
--   1. a receipt kept under the plan's id: return it (first = 1 only if it carries this call's
--      request nonce: a resend after a lost reply is answered as the first sending was);
--      nothing else is read or written;
--   2. now (TIME) at or past the plan's deadline: refuse, nothing written;
--   3. the counters of the plan give back the units of their expired holds (as every counter
--      script does first), then every read's version is compared with the current one (a
--      record's _v, a counter's version key; absent: 0): every read that moved is returned and
--      nothing of the plan is written;
--   4. every write's guards are checked, in order, before any is applied, each against the state
--      the writes before it would leave (a record write as record_write.lua checks it: fence,
--      expected version, transition guard; a counter step as counter_add.lua: low and high): the
--      first refusal is returned and nothing of the plan is written;
--   5. the writes are applied in order (a record's version +1 per write, a counter's version +1
--      per step that moves it), the receipt is kept for keep milliseconds (SET PX) and returned.
-- Every key is in KEYS: on a Redis Cluster they share one hash tag (a state space's, see
-- _state.lua), checked by the client before sending.
--
-- helpers: clock fmt batched counter_sweep counter_bump
-- KEYS: 1 the receipt, then the plan's records (one key each) and counters (four keys each: the
--       counter, its holds, their expiry, its version), each once
-- ARGV: 1 the plan as JSON: {"n": request nonce, "by": who approved, "keep": milliseconds to keep
--       the receipt, "until": deadline ('' for none), "counters": [the KEYS index of each
--       counter], "reads": [[kind 'r' or 'c', KEYS index, version], ...], "writes": [['r', KEYS
--       index, replace '1'/'0', expected version or '', fence or '', guarded hash field
--       ('f:' .. name) or '', absent allowed '1'/'0', [allowed JSON values], [hash field, JSON,
--       ...]] or ['c', KEYS index, delta, low or '', high or ''], ...]} (integers as strings)
-- Returns: {'receipt', first (1 or 0), the receipt's JSON: {"n", "by", "at", "v": [version after
--          each write, as strings]}}; {'expired', now}; {'stale', read index, current version,
--          ...}; {'fenced', write index, the record's fence}; {'conflict', write index, the
--          record's version, the record as HGETALL gives it}; {'refused', write index, the
--          guarded field's JSON (nil if absent)}; {'limit', write index, the counter's value}.
local plan = cjson.decode(ARGV[1])
local receipt = KEYS[1]
local kept = redis.call('GET', receipt)
if kept then
  local first = 0
  if cjson.decode(kept).n == plan.n then first = 1 end
  return {'receipt', first, kept}
end
local now = clock()
if plan['until'] ~= '' and tonumber(plan['until']) <= now then return {'expired', fmt(now)} end

-- 3. the reads
local values = {}
for _, c in ipairs(plan.counters) do
  values[c] = counter_sweep(KEYS[c], KEYS[c + 1], KEYS[c + 2], KEYS[c + 3], now)
end
local stale = {'stale'}
for i, read in ipairs(plan.reads) do
  local current
  if read[1] == 'r' then
    current = tonumber(redis.call('HGET', KEYS[read[2]], '_v')) or 0
  else
    current = tonumber(redis.call('GET', KEYS[read[2] + 3])) or 0
  end
  if current ~= tonumber(read[3]) then
    stale[#stale + 1] = i
    stale[#stale + 1] = current
  end
end
if #stale > 1 then return stale end

-- 4. every guard, before any write: sim[k] is record k as the writes before would leave it
local sim = {}
for i, w in ipairs(plan.writes) do
  local k = w[2]
  if w[1] == 'c' then
    local new = values[k] + tonumber(w[3])
    local low, high = tonumber(w[4]), tonumber(w[5])
    if (low and new < low) or (high and new > high) then return {'limit', i, values[k]} end
    values[k] = new
  else
    local s = sim[k]
    if not s then
      local stored = redis.call('HMGET', KEYS[k], '_v', '_f')
      s = {v = tonumber(stored[1]) or 0, f = tonumber(stored[2]) or 0, replaced = false, set = {}}
      sim[k] = s
    end
    local fence, guard = w[5], w[6]
    if fence ~= '' and tonumber(fence) < s.f then return {'fenced', i, s.f} end
    if w[4] ~= '' and tonumber(w[4]) ~= s.v then
      return {'conflict', i, s.v, redis.call('HGETALL', KEYS[k])}
    end
    if guard ~= '' then
      local state = s.set[guard]
      if state == nil then
        if s.replaced then state = false else state = redis.call('HGET', KEYS[k], guard) end
      end
      local allowed = w[7] == '1' and not state
      for _, value in ipairs(w[8]) do
        if state == value then allowed = true end
      end
      if not allowed then return {'refused', i, state} end
    end
    if w[3] == '1' then
      s.replaced, s.set = true, {}
    end
    local fields = w[9]
    for j = 1, #fields, 2 do s.set[fields[j]] = fields[j + 1] end
    s.v, s.f = s.v + 1, math.max(s.f, tonumber(fence) or 0)
  end
end

-- 5. every write
local updated, versions = fmt(now), {}
for i, w in ipairs(plan.writes) do
  local k = w[2]
  if w[1] == 'c' then
    local version = tonumber(redis.call('GET', KEYS[k + 3])) or 0
    if tonumber(w[3]) ~= 0 then
      redis.call('INCRBY', KEYS[k], w[3])
      version = counter_bump(KEYS[k + 3])
    end
    versions[i] = string.format('%.0f', version)
  else
    local stored = redis.call('HMGET', KEYS[k], '_v', '_f')
    local version, seen = tonumber(stored[1]) or 0, tonumber(stored[2]) or 0
    local fields = {'_v', version + 1, '_f', math.max(seen, tonumber(w[5]) or 0), '_u', updated}
    for _, x in ipairs(w[9]) do fields[#fields + 1] = x end
    if w[3] == '1' and version > 0 then redis.call('DEL', KEYS[k]) end
    batched('HSET', KEYS[k], fields)
    versions[i] = string.format('%.0f', version + 1)
  end
end
kept = cjson.encode({n = plan.n, by = plan.by, at = updated, v = versions})
redis.call('SET', receipt, kept, 'PX', plan.keep)
return {'receipt', 1, kept}
