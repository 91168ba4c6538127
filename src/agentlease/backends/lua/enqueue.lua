#!lua
-- enqueue: create tasks in one queue, all in one atomic step.
--
-- The caller has reserved each id for this queue in the global index ({prefix}:ids) first. A
-- task is created unless its id already exists here or its dedup key is taken here; an id whose
-- reservation was never followed by its task (the caller crashed in between) is simply created.
-- A task with a partition that is busy (counting the tasks created before it in this call) is
-- parked; otherwise it counts as busy for its partition (see _lib.lua).
--
-- helpers: clock save member lower_wake park
-- KEYS: 1 tasks, 2 payloads, 3 counters (the sequence, claim's wake time), 4 ready, 5 waiting,
--       6 index (leases by expiry, queued tasks), 7 dedup keys, 8 busy (partition -> busy
--       tasks), 9 parked, 10 hot (partition -> minus its parked tasks), 11 contexts
-- ARGV: 1 request nonce (a retry of this same request reports the tasks it created as created),
--       2 number of tasks, then 8 values per task:
--       id, payload JSON, priority, delay in seconds, dedup key ('' for none), max_reclaims,
--       partition ('' for none), context JSON ('' for none)
-- Returns: {created, id, created, id, ...}: created is 1 or 0, id is the created or existing task.
local K = {tasks = KEYS[1], payloads = KEYS[2], counters = KEYS[3], ready = KEYS[4],
           waiting = KEYS[5], index = KEYS[6], dedup = KEYS[7], busy = KEYS[8],
           parked = KEYS[9], hot = KEYS[10], contexts = KEYS[11]}
local nonce, count = ARGV[1], tonumber(ARGV[2])
local now = clock()
local out = {}
local made = {}  -- ids this run created (or, on a retry, had created)
local seq = nil
local soonest = nil  -- the earliest run_at of the delayed tasks created

for i = 0, count - 1 do
  local b = 3 + i * 8
  local id, payload, key = ARGV[b], ARGV[b + 1], ARGV[b + 4]
  local existing = nil
  local raw = redis.call('HGET', K.tasks, id)
  if raw then
    existing = id
  elseif key ~= '' then
    existing = redis.call('HGET', K.dedup, key)
    if existing then raw = redis.call('HGET', K.tasks, existing) end
  end
  if existing then
    local created = 0
    if not made[existing] and raw and cmsgpack.unpack(raw)[F_REQ] == nonce then
      created = 1  -- this request's first attempt created it; its reply was lost
      made[existing] = true
    end
    out[#out + 1] = created
    out[#out + 1] = existing
  else
    if not seq then seq = redis.call('HINCRBY', K.counters, 'seq', count) - count end
    seq = seq + 1
    local priority, delay = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
    local dedup = false
    if key ~= '' then dedup = key end
    -- In the record's order (see _lib.lua): state, attempt, token, expires_at, request nonce,
    -- finished_at, leased_at, deadline, progress timeout, last progress, priority, failures,
    -- reclaims, checkpoint saved, payload, sequence, front, max_reclaims, created_at, run_at,
    -- dedup key, partition (only if it has one).
    local rec = {QUEUED, 0, false, false, nonce, false, false, false, false, false, priority, 0,
                 0, false, false, seq, 0, tonumber(ARGV[b + 5]), now, now + delay, dedup}
    local part = ARGV[b + 6]
    if part == '' then
      part = false
    else
      rec[F_PART] = part
    end
    if part and (tonumber(redis.call('HGET', K.busy, part)) or 0) > 0 then
      park(K, rec, id)  -- in none of the queue's other sets until unparked
    else
      if part then redis.call('HINCRBY', K.busy, part, 1) end
      if delay > 0 then
        rec[F_STATE] = SCHEDULED
        redis.call('ZADD', K.waiting, now + delay, id)
        if not soonest or now + delay < soonest then soonest = now + delay end
      else
        redis.call('ZADD', K.ready, 0, member(rec, id))
        redis.call('ZADD', K.index, -now, id)
      end
    end
    if #payload <= INLINE then
      rec[F_PAYLOAD] = payload
    else
      redis.call('HSET', K.payloads, id, payload)
    end
    save(K.tasks, id, rec)
    if ARGV[b + 7] ~= '' then redis.call('HSET', K.contexts, id, ARGV[b + 7]) end
    if dedup then redis.call('HSET', K.dedup, dedup, id) end
    made[id] = true
    out[#out + 1] = 1
    out[#out + 1] = id
  end
end
if soonest then lower_wake(K.counters, soonest) end
return out
