#!lua
-- requeue_dead: put dead-lettered tasks of one queue back in the ready set with fresh reclaim
-- and failure budgets, in one atomic step. The attempt counter is kept, so fencing stays
-- monotonic; the last error is kept for the record. A task whose partition is busy (counting
-- the tasks requeued before it in this call) is requeued parked (its run_at is past: it ran,
-- so it is queued when unparked).
--
-- helpers: load save make_ready park
-- KEYS: 1 tasks, 2 counters, 3 ready, 4 index (leases by expiry, queued tasks), 5 dead, 6 busy
--       (partition -> busy tasks), 7 parked, 8 hot (partition -> minus its parked tasks)
-- ARGV: 1 to the front ('1') or the back ('0'), 2 cap, 3 'ids' then the task ids to requeue, or
--       'all' for the cap longest dead tasks of the queue
-- Returns: how many tasks were requeued, or nil if the queue does not exist.
local K = {tasks = KEYS[1], counters = KEYS[2], ready = KEYS[3], index = KEYS[4], dead = KEYS[5],
           busy = KEYS[6], parked = KEYS[7], hot = KEYS[8]}
local front, cap = ARGV[1] == '1', tonumber(ARGV[2])
if redis.call('EXISTS', K.counters) == 0 then return false end
local ids
if ARGV[3] == 'ids' then
  ids = {}
  for i = 4, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  ids = redis.call('ZRANGE', K.dead, 0, cap - 1)
end
local count = 0
for _, id in ipairs(ids) do
  local rec = load(K.tasks, id)
  if rec and rec[F_STATE] == DEAD then
    rec[F_RECLAIMS] = 0
    rec[F_FAILURES] = 0
    rec[F_FINISHED] = false
    local part = rec[F_PART]
    if part and (tonumber(redis.call('HGET', K.busy, part)) or 0) > 0 then
      -- Sent to the front or the back as make_ready does it, among the partition's parked tasks.
      if front then
        rec[F_FRONT] = 1
      else
        rec[F_FRONT] = 0
        rec[F_SEQ] = redis.call('HINCRBY', K.counters, 'seq', 1)
      end
      park(K, rec, id)
    else
      if part then redis.call('HINCRBY', K.busy, part, 1) end
      make_ready(rec, id, front, K.counters, K.ready, K.index)
    end
    save(K.tasks, id, rec)
    redis.call('ZREM', K.dead, id)
    count = count + 1
  end
end
return count
