#!lua
-- extend: renew many leases of one queue in one atomic step, each fenced by its token.
--
-- A lease is renewed only if its task is leased under that token and the lease is still live
-- (now < expires_at). The new expiry is now + lease_for, capped by the lease's total deadline
-- and, if the queue has a progress timeout, by the last progress + that timeout.
--
-- helpers: clock fmt load save expiry
-- KEYS: 1 tasks, 2 leases
-- ARGV: 1 lease_for seconds, then 2 values per lease: task id, token
-- Returns: one value per lease, in order: the new expires_at as a string, or nil if not held.
local tasks, leases = KEYS[1], KEYS[2]
local lease_for = tonumber(ARGV[1])
local now = clock()
local out = {}
for i = 2, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local rec = load(tasks, id)
  if rec and rec[F_STATE] == LEASED and rec[F_TOKEN] == token and now < rec[F_EXPIRES] then
    local e = expiry(now, lease_for, rec[F_DEADLINE], rec[F_PROGRESSED], rec[F_PTIMEOUT])
    if e ~= rec[F_EXPIRES] then
      rec[F_EXPIRES] = e
      save(tasks, id, rec)
      redis.call('ZADD', leases, e, id)
    end
    out[#out + 1] = fmt(e)
  else
    out[#out + 1] = false
  end
end
return out
