#!lua flags=no-writes
-- workers_list: the live workers (entries not lapsed on the store's clock), by id, in one
-- snapshot.
--
-- helpers: clock
-- KEYS: 1 info (hash: worker id -> last beat, newline, registration JSON), 2 ttl (zset: worker
--       id -> when its entry lapses)
-- ARGV: none
-- Returns: flat, 4 values per worker: id, registration JSON, last beat, lapses at (times as
--          '%.17g' strings).
local info, ttl = KEYS[1], KEYS[2]
local now = clock()
local live = redis.call('ZRANGEBYSCORE', ttl, '(' .. string.format('%.17g', now), '+inf',
                        'WITHSCORES')
local entries = {}
for i = 1, #live, 2 do entries[#entries + 1] = {live[i], live[i + 1]} end
table.sort(entries, function(x, y) return x[1] < y[1] end)
local out = {}
for _, entry in ipairs(entries) do
  local value = redis.call('HGET', info, entry[1])
  if value then
    local cut = string.find(value, '\n', 1, true)
    out[#out + 1] = entry[1]
    out[#out + 1] = string.sub(value, cut + 1)
    out[#out + 1] = string.sub(value, 1, cut - 1)
    out[#out + 1] = entry[2]
  end
end
return out
