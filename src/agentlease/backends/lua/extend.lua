#!lua
-- extend: renew many leases of one queue in one atomic step, each fenced by its token.
--
-- A lease is renewed only if its task is leased under that token and the lease is still live
-- (now < expires_at). The new expiry is now + lease_for, capped by the lease's total deadline
-- and, if the queue has a progress timeout, by the last progress + that timeout.
--
-- A lease held under that token whose task a cancel was asked for (CANCELLING) is not renewed:
-- the task ends cancelled here, its holder told by the nil.
--
-- helpers: clock fmt save_head expiry lower_wake
-- KEYS: 1 tasks, 2 counters (claim's wake time), 3 index (leases by expiry, queued tasks),
--       4 ready, 5 waiting, 6 busy, 7 parked, 8 hot (for a cancelled task's partition),
--       9 attempts (a cancelled lease's attempt ends), 10 cancelled (cancelled tasks by
--       finished_at)
-- ARGV: 1 lease_for seconds, then 2 values per lease: task id, token
-- Returns: one value per lease, in order: the new expires_at as a string, or nil if not held.
local tasks, counters, index = KEYS[1], KEYS[2], KEYS[3]
local lease_for = tonumber(ARGV[1])
local now = clock()
local out = {}
local soonest = nil  -- the earliest expiry this call set
for i = 2, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local raw = redis.call('HGET', tasks, id)
  local off, state, attempt, held, expires  -- the head of the record, up to expires_at
  if raw then off, state, attempt, held, expires = cmsgpack.unpack_limit(raw, 4, 3) end
  if raw and state == LEASED and held == token and now < expires then
    local _, _, _, _, deadline, ptimeout, progressed = cmsgpack.unpack_limit(raw, 6, off)
    local e = expiry(now, lease_for, deadline, progressed, ptimeout)
    if e ~= expires then
      save_head(tasks, id, raw, off, state, attempt, held, e)
      redis.call('ZADD', index, e, id)
      if not soonest or e < soonest then soonest = e end
    end
    out[#out + 1] = fmt(e)
  elseif raw and state == CANCELLING and held == token then
    -- helpers here: load save end_cancelled
    local K = {tasks = tasks, counters = counters, ready = KEYS[4], waiting = KEYS[5],
               index = index, busy = KEYS[6], parked = KEYS[7], hot = KEYS[8],
               attempts = KEYS[9], cancelled = KEYS[10]}
    redis.call('ZREM', index, id)
    end_cancelled(K, id, load(tasks, id), now)
    out[#out + 1] = false
  else
    out[#out + 1] = false
  end
end
if soonest then lower_wake(counters, soonest) end
return out
