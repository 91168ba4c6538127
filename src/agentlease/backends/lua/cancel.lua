#!lua
-- cancel: cancel one task of one queue in one atomic step. A waiting task (queued, scheduled,
-- failed, parked), or a lease that ran out, ends cancelled at once: out of its ZSET, its error
-- the cancel error, its partition freed as a completion frees it (a parked task never made it
-- busy: it only leaves the parked ZSETs). A live lease becomes CANCELLING: shown as leased, no
-- holder write passes the fence any more, and its next extend or the reaper ends it cancelled.
-- A task that has ended (done, dead, cancelled) is left as it is.
--
-- helpers: clock load save member end_cancelled
-- KEYS: 1 tasks, 2 errors, 3 counters, 4 ready, 5 waiting, 6 index (leases by expiry, queued
--       tasks), 7 busy (partition -> busy tasks), 8 parked, 9 hot (partition -> minus its
--       parked tasks), 10 attempts (a lease's attempt ends cancelled), 11 cancelled (cancelled
--       tasks by finished_at, for purging)
-- ARGV: 1 task id, 2 the cancel error JSON (it holds the reason)
-- Returns: {outcome, state, error JSON or nil}: outcome 'cancelled', 'requested' or
--          'finished', the state after the call, and the error the task keeps (a cancel asked
--          for earlier keeps its own); {'unknown'} when there is no such task in this queue.
local K = {tasks = KEYS[1], errors = KEYS[2], counters = KEYS[3], ready = KEYS[4],
           waiting = KEYS[5], index = KEYS[6], busy = KEYS[7], parked = KEYS[8], hot = KEYS[9],
           attempts = KEYS[10], cancelled = KEYS[11]}
local id, error = ARGV[1], ARGV[2]
local rec = load(K.tasks, id)
if not rec then return {'unknown'} end
local state = rec[F_STATE]
if state == DONE or state == DEAD then return {'finished', STATES[state], false} end
if state == CANCELLED then
  return {'finished', 'cancelled', redis.call('HGET', K.errors, id)}
end
local now = clock()
if state == CANCELLING then
  error = redis.call('HGET', K.errors, id)  -- the first reason stays
else
  redis.call('HSET', K.errors, id, error)
end
if (state == LEASED or state == CANCELLING) and now < rec[F_EXPIRES] then
  if state == LEASED then
    rec[F_STATE] = CANCELLING
    save(K.tasks, id, rec)
  end
  return {'requested', 'leased', error}
end
if state == QUEUED then
  redis.call('ZREM', K.ready, member(rec, id))
  redis.call('ZREM', K.index, id)
elseif state == SCHEDULED or state == FAILED then
  redis.call('ZREM', K.waiting, id)
  if state == FAILED then redis.call('HINCRBY', K.counters, 'failed', -1) end
elseif state == LEASED or state == CANCELLING then
  redis.call('ZREM', K.index, id)
elseif state == PARKED then
  local part, flag = rec[F_PART], 1
  if rec[F_FRONT] == 1 then flag = 0 end
  redis.call('ZREM', K.parked,
             part .. '\0' .. string.format('%d%016x', flag, rec[F_SEQ]) .. '\0' .. id)
  if tonumber(redis.call('ZINCRBY', K.hot, 1, part)) >= 0 then redis.call('ZREM', K.hot, part) end
  -- A parked task never counted as busy: nothing to free.
  rec[F_STATE] = CANCELLED
  rec[F_FINISHED] = now
  redis.call('HINCRBY', K.counters, 'cancelled', 1)
  redis.call('ZADD', K.cancelled, now, id)
  save(K.tasks, id, rec)
  return {'cancelled', 'cancelled', error}
end
end_cancelled(K, id, rec, now)
return {'cancelled', 'cancelled', error}
