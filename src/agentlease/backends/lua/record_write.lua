#!lua
-- record_write: one guarded write of a versioned record, in one atomic step.
--
-- Checked in this order against the record as stored (absent: version 0, no fields, fence 0);
-- the first check that fails refuses the write and nothing changes:
--   1. the fence, if given: refused if lower than the highest the record has seen;
--   2. the expected version, if given: refused unless equal to the stored version;
--   3. the transition guard, if given: refused unless the guarded field's stored JSON is one
--      of the allowed values (or the field is absent and absent is allowed).
-- Then the fields are set (replace: every other field is dropped), the version goes up by one,
-- the record keeps the higher fence and the time of the write.
--
-- helpers: clock fmt batched
-- KEYS: 1 the record's hash
-- ARGV: 1 replace ('1' or '0'), 2 expected version ('' for none), 3 fence ('' for none),
--       4 guarded hash field ('f:' .. name; '' for no guard), 5 absent allowed ('1' or '0'),
--       6 n, the number of allowed JSON values, 7 .. 6 + n those values,
--       then pairs of hash field ('f:' .. name) and JSON value
-- Returns: {'ok', version, fence, updated_at (a fmt() string), the fields}: the record after the
--          write, its fields as HGETALL gives them after a merge, none after a replace (they
--          are exactly the fields written); or, nothing changed: {'fenced', the record's fence};
--          {'conflict', the record as HGETALL gives it (empty if absent)}; {'refused', the
--          guarded field's JSON (nil if absent)}.
local rec = KEYS[1]
local replace, expected, fence = ARGV[1] == '1', ARGV[2], ARGV[3]
local guard, absent_ok, n = ARGV[4], ARGV[5] == '1', tonumber(ARGV[6])
local stored = redis.call('HMGET', rec, '_v', '_f', guard)
local version, seen = tonumber(stored[1]) or 0, tonumber(stored[2]) or 0
if fence ~= '' and tonumber(fence) < seen then return {'fenced', seen} end
if expected ~= '' and tonumber(expected) ~= version then
  return {'conflict', redis.call('HGETALL', rec)}
end
if guard ~= '' then
  local state = stored[3]
  local allowed = absent_ok and not state
  for i = 7, 6 + n do
    if state == ARGV[i] then allowed = true end
  end
  if not allowed then return {'refused', state} end
end
local fenced, updated = math.max(seen, tonumber(fence) or 0), fmt(clock())
local fields = {'_v', version + 1, '_f', fenced, '_u', updated}
for i = 7 + n, #ARGV do fields[#fields + 1] = ARGV[i] end
if replace and version > 0 then redis.call('DEL', rec) end
batched('HSET', rec, fields)
if replace then return {'ok', version + 1, fenced, updated, {}} end
return {'ok', version + 1, fenced, updated, redis.call('HGETALL', rec)}
