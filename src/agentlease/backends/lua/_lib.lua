-- Shared helpers, prepended to the scripts at load time (after their #!lua line).
--
-- Each "-- @helper name: dependencies" section is one helper; a script names the helpers it
-- calls in a "-- helpers:" line of its header and gets those (and their dependencies) only, so
-- that no call pays for closures it never uses. The "-- @helper constants" section goes first
-- into every script. Helpers that only a rare branch calls can be named in a "-- helpers here:"
-- line inside that branch instead: they are defined there, so the calls that skip the branch
-- do not make them (every call of a script makes its closures anew).
--
-- A task is one field of the queue's hash {prefix:queue}:t, its value a MessagePack array, the
-- record: state, attempt (the fencing number), token, expires_at, the nonce of the last write
-- request, finished_at, leased_at, the lease's total deadline, progress timeout and last
-- progress, priority, failures, reclaims, whether a checkpoint is saved, the payload when it is
-- small, sequence number, sent-to-front flag, max_reclaims, created_at, run_at and dedup key,
-- then, only for a task that has one, its partition (a record without it reads as partition nil,
-- so records written before partitions existed need no change).
-- Bigger values live in their own hashes of the queue (payloads, results, progress, checkpoints,
-- errors), so that a claim or a heartbeat never rewrites them; so does a task's context (its root
-- task and deadline, JSON as enqueued: {prefix:queue}:x), which only tasks that have one write,
-- so a record's layout is the same with or without it.
--
-- The order serves the hot paths: what complete, extend and claim change comes first, so they
-- decode only the head of a record (cmsgpack.unpack_limit) and write it back with the bytes of
-- the rest unchanged (save_head), instead of decoding and encoding all 21 (or 22) values. The
-- third byte of a record is its number of values: 22 says it has a partition, which lets
-- complete skip all partition work for a task without one after reading that byte alone.
--
-- Partitions (single-writer routing, see agentlease.backends.base). The hash {prefix:queue}:pb
-- counts each partition's busy tasks (scheduled, queued, leased, failed); a task enqueued or
-- requeued while its partition is busy is parked: state parked, a member of the ZSET
-- {prefix:queue}:pk (see park), which is in no other ZSET of the queue. {prefix:queue}:ph scores
-- each partition with parked tasks by minus their number (so ZRANGE 0 4 lists the most parked
-- first, ties by name). A task of a partition that becomes done or dead calls unpark.
--
-- The queue's index ZSET {prefix:queue}:l holds every leased task, scored by its expires_at, and
-- every queued task, scored by minus its created_at: expired leases are the scores in (0, now],
-- the oldest queued task is the highest negative score, and a claim moves a task from one to
-- the other with one ZADD (scores are exact doubles, and negating one is exact).
--
-- Times are seconds on the store's clock (TIME). They are stored as doubles inside the record and
-- as ZSET scores, both exact; they leave a script as strings made by fmt() (or as TIME's two
-- integers, or as '%.17g' strings, which are exact), because a Lua number returned to Redis is
-- truncated to an integer and tostring() keeps only 14 digits.

-- @helper constants:
-- CANCELLING is a lease whose task a cancel was asked for: shown as leased, but no holder write
-- passes the fence (it requires LEASED), and its next extend or the reaper makes it CANCELLED.
local STATES = {'scheduled', 'queued', 'leased', 'failed', 'done', 'dead', 'parked', 'cancelled',
                'leased'}
local SCHEDULED, QUEUED, LEASED, FAILED, DONE, DEAD, PARKED = 1, 2, 3, 4, 5, 6, 7
local CANCELLED, CANCELLING = 8, 9
-- Positions in the record. Absent values are false (a nil would cut the array short). The loader
-- (agentlease.backends.lua) writes these names into the scripts as the numbers they stand for:
-- as locals, every helper that used them would capture them as upvalues, and a script's helpers
-- are made anew at every call.
local F_STATE, F_ATTEMPT, F_TOKEN, F_EXPIRES, F_REQ, F_FINISHED = 1, 2, 3, 4, 5, 6
local F_LEASED, F_DEADLINE, F_PTIMEOUT, F_PROGRESSED = 7, 8, 9, 10
local F_PRIO, F_FAILURES, F_RECLAIMS, F_CHECKPOINTED, F_PAYLOAD = 11, 12, 13, 14, 15
local F_SEQ, F_FRONT, F_MAXR, F_CREATED, F_RUNAT, F_DEDUP, F_PART = 16, 17, 18, 19, 20, 21, 22
-- Payloads up to this many bytes live in the record (one read less per claim, one hash entry
-- less per task); longer ones in the payloads hash, so that rewriting a record stays cheap.
local INLINE = 200

-- @helper clock:
-- The store's time in seconds, and TIME's reply (seconds, microseconds) for a script that sends
-- it back: a client computes the same double from those two integers with the same two
-- operations, which no decimal string does as cheaply.
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000, t
end

-- @helper fmt:
local function fmt(x)
  if x then return string.format('%.6f', x) end
  return false
end

-- @helper load:
-- A record packs 21 values (22 with a partition), so its MessagePack array header is always 3
-- bytes (array 16) and the values follow one after another: unpacked as a sequence, they fill a
-- table built at its size in one step (unpacking the array grows its table one value at a time,
-- at twice the cost).
local function load(tasks, id)
  local raw = redis.call('HGET', tasks, id)
  if raw then return {cmsgpack.unpack(string.sub(raw, 4))} end
  return nil
end

-- @helper save:
local function save(tasks, id, rec)
  redis.call('HSET', tasks, id, cmsgpack.pack(rec))
end

-- @helper save_head:
-- Write back a record whose first values changed: raw is the record as read, off the offset past
-- those values (as cmsgpack.unpack_limit(raw, k, 3) returns it), and ... their new values. The
-- bytes of the rest, and the array header (21 or 22 values), are kept as they are.
local function save_head(tasks, id, raw, off, ...)
  redis.call('HSET', tasks, id,
             string.sub(raw, 1, 3) .. cmsgpack.pack(...) .. string.sub(raw, off + 1))
end

-- @helper zrem:
-- ZREM many members, in chunks (unpack() is bounded by Lua's stack).
local function zrem(key, ids)
  for i = 1, #ids, 1000 do
    redis.call('ZREM', key, unpack(ids, i, math.min(i + 999, #ids)))
  end
end

-- @helper member:
-- The ready ZSET holds every queued task with score 0, ordered by this member alone:
-- 8 hex digits of (2^31 - 1 - priority), so higher priorities sort first; '0' for a task sent to
-- the front, '1' otherwise; 16 hex digits of its sequence number; then the id (from byte 26).
local function member(rec, id)
  local flag = 1
  if rec[F_FRONT] == 1 then flag = 0 end
  return string.format('%08x%d%016x', 2147483647 - rec[F_PRIO], flag, rec[F_SEQ]) .. id
end

-- @helper expiry:
-- The expiry of a lease claimed or extended at now: never past the lease's total deadline, nor
-- past the progress deadline when there is one (agentlease._policy.lease.lease_expiry).
local function expiry(now, lease_for, deadline, progressed, ptimeout)
  local e = math.min(now + lease_for, deadline)
  if ptimeout then e = math.min(e, progressed + ptimeout) end
  return e
end

-- @helper lower_wake:
-- The counters hash keeps 'wake': a time no later than any score in the waiting ZSET and any
-- positive score (a lease's expiry) in the index, so that claim can skip searching both for due
-- tasks and expired leases until the clock reaches it (when it is absent, claim searches, and
-- sets it). A script that adds such a score lowers 'wake' to it when it is earlier; removing a
-- score may leave 'wake' early, which costs one needless search, never a missed task.
local function lower_wake(counters, t)
  local wake = redis.call('HGET', counters, 'wake')
  if wake and t < tonumber(wake) then redis.call('HSET', counters, 'wake', t) end
end

-- @helper make_ready: member
-- Put a task back in the ready set: to the front of its priority (keeping its sequence number, so
-- tasks sent to the front keep their order) or behind everything (a fresh sequence number).
-- Its index entry, if it had one (a lease), is replaced by minus its created_at.
local function make_ready(rec, id, front, counters, ready, index)
  rec[F_STATE] = QUEUED
  if front then
    rec[F_FRONT] = 1
  else
    rec[F_FRONT] = 0
    rec[F_SEQ] = redis.call('HINCRBY', counters, 'seq', 1)
  end
  redis.call('ZADD', ready, 0, member(rec, id))
  redis.call('ZADD', index, -rec[F_CREATED], id)
end

-- @helper refusal:
-- The reply to a holder write whose lease (token) is not held and live, from the record's state,
-- attempt, token and request nonce. A holder write carries a nonce; a retry of a write that was
-- applied but whose reply was lost finds its own nonce on the record and is answered 'replayed'
-- instead of lost.
local function refusal(state, attempt, held, req, token, nonce)
  if nonce and req == nonce then return {'replayed'} end
  -- A cancelled task: the client reads the reason (kept in the errors hash) and raises
  -- TaskCancelled.
  if state == CANCELLING or state == CANCELLED then
    return {'lost', attempt, 'cancelled', 'cancelled'}
  end
  local reason
  if state ~= LEASED then
    reason = 'task is ' .. STATES[state]
  elseif held ~= token then
    reason = 'token replaced'
  else
    reason = 'lease expired'
  end
  return {'lost', attempt, STATES[state], reason}
end

-- @helper fence: load refusal
-- Fencing: the record if the lease (token) is held and live, else nil and the reply to send.
local function fence(tasks, id, token, nonce, now)
  local rec = load(tasks, id)
  if not rec then return nil, {'unknown'} end
  if rec[F_STATE] == LEASED and rec[F_TOKEN] == token and now < rec[F_EXPIRES] then
    return rec, nil
  end
  return nil, refusal(rec[F_STATE], rec[F_ATTEMPT], rec[F_TOKEN], rec[F_REQ], token, nonce)
end

-- @helper park:
-- Park a task (its record is saved by the caller): its member of the parked ZSET is its
-- partition, a zero byte, '0' if sent to the front else '1', 16 hex digits of its sequence, a
-- zero byte and its id, so that ZRANGEBYLEX finds a partition's next task (partition keys and
-- ids hold no zero byte). K holds the keys parked and hot.
local function park(K, rec, id)
  local part, flag = rec[F_PART], 1
  if rec[F_FRONT] == 1 then flag = 0 end
  rec[F_STATE] = PARKED
  redis.call('ZADD', K.parked, 0,
             part .. '\0' .. string.format('%d%016x', flag, rec[F_SEQ]) .. '\0' .. id)
  redis.call('ZINCRBY', K.hot, -1, part)
end

-- @helper unpark: load save member lower_wake
-- A task of partition part became done or dead: count it out of the partition's busy tasks and,
-- if none is left, start the partition's next parked task (lowest sequence; queued, or scheduled
-- if its run_at is ahead), which makes the partition busy again. K holds the keys: tasks,
-- counters, ready, waiting, index, busy, parked, hot.
local function unpark(K, part, now)
  if redis.call('HINCRBY', K.busy, part, -1) > 0 then return end
  local head = redis.call('ZRANGEBYLEX', K.parked, '[' .. part .. '\0', '(' .. part .. '\1',
                          'LIMIT', 0, 1)[1]
  if not head then
    redis.call('HDEL', K.busy, part)
    return
  end
  redis.call('ZREM', K.parked, head)
  if tonumber(redis.call('ZINCRBY', K.hot, 1, part)) >= 0 then redis.call('ZREM', K.hot, part) end
  redis.call('HSET', K.busy, part, 1)
  local id = string.sub(head, #part + 20)
  local rec = load(K.tasks, id)
  if rec[F_RUNAT] > now then
    rec[F_STATE] = SCHEDULED
    redis.call('ZADD', K.waiting, rec[F_RUNAT], id)
    lower_wake(K.counters, rec[F_RUNAT])
  else
    rec[F_STATE] = QUEUED
    redis.call('ZADD', K.ready, 0, member(rec, id))
    redis.call('ZADD', K.index, -rec[F_CREATED], id)
  end
  save(K.tasks, id, rec)
end

-- @helper attempt_open:
-- A task's attempt history lives in the queue's hash {prefix:queue}:a: field <id> is a JSON array
-- (cjson) of its last 20 attempts that ended otherwise than done, oldest first, each an object:
-- attempt, worker (absent when the claim named none), started, ended, outcome, error (the
-- error's type, for a failure), times as fmt() strings; field '>' .. <id> (no task id holds a
-- '>') is the worker of its last claim. A claim writes only that worker: the running attempt and
-- the last one of a done task are read from the task record (its attempt, leased_at,
-- finished_at) and this field, so a claim and a completion cost no history write.
local function attempt_open(hist, id, worker)
  if worker ~= '' then
    redis.call('HSET', hist, '>' .. id, worker)
  else
    redis.call('HDEL', hist, '>' .. id)
  end
end

-- @helper attempt_close: fmt
-- Record the attempt numbered attempt of a task, begun at started, as ended now otherwise than
-- done: outcome failed (err: the error's type, or false), released, expired or cancelled; its
-- worker is the one of the task's last claim.
local function attempt_close(hist, id, attempt, started, now, outcome, err)
  local raw = redis.call('HGET', hist, id)
  local list = {}
  if raw then list = cjson.decode(raw) end
  local last = list[#list]
  if last and last.attempt == attempt then return end  -- recorded already
  local entry = {attempt = attempt, started = fmt(started), ended = fmt(math.max(now, started)),
                 outcome = outcome}
  local worker = redis.call('HGET', hist, '>' .. id)
  if worker then entry.worker = worker end
  if err then entry.error = err end
  list[#list + 1] = entry
  if #list > 20 then table.remove(list, 1) end
  redis.call('HSET', hist, id, cjson.encode(list))
end

-- @helper error_type:
-- The type of a recorded error (JSON {"type": ..., "message": ...}), or false.
local function error_type(err)
  local ok, value = pcall(cjson.decode, err)
  if ok and type(value) == 'table' and type(value.type) == 'string' then return value.type end
  return false
end

-- @helper end_cancelled: save unpark attempt_close
-- A task whose cancel was asked for (its error already stored) ends cancelled: out of the index
-- (the caller's job when it took it out already), counted in the counters' 'cancelled', its
-- partition freed as a completion frees it, and its running attempt (if a lease was live) ended
-- as cancelled; it joins the cancelled ZSET by finished time (for purging). rec is saved here.
-- K holds counters, tasks, busy, parked, hot, attempts, cancelled.
local function end_cancelled(K, id, rec, now)
  if rec[F_STATE] == CANCELLING or rec[F_STATE] == LEASED then
    attempt_close(K.attempts, id, rec[F_ATTEMPT], rec[F_LEASED], now, 'cancelled', false)
  end
  rec[F_STATE] = CANCELLED
  rec[F_FINISHED] = now
  rec[F_TOKEN] = false
  rec[F_EXPIRES] = false
  redis.call('HINCRBY', K.counters, 'cancelled', 1)
  redis.call('ZADD', K.cancelled, now, id)
  save(K.tasks, id, rec)
  if rec[F_PART] then unpark(K, rec[F_PART], now) end
end

-- @helper reap: load save zrem make_ready unpark attempt_close end_cancelled
-- Requeue (or dead-letter, past max_reclaims) the expired leases ids (read by the caller from
-- the index, oldest expiry first, at most a cap of them); an expired lease whose task a cancel
-- was asked for ends cancelled, never requeued. Appends id, attempt, outcome to out for each,
-- and ends each lease's attempt as expired (or cancelled). K holds the keys: tasks, errors,
-- counters, ready, waiting, index, dead, busy, parked, hot, attempts, cancelled.
local function reap(K, ids, now, front, out)
  zrem(K.index, ids)  -- first: a requeued task comes back into the index as a queued one
  for _, id in ipairs(ids) do
    local rec = load(K.tasks, id)
    if rec and rec[F_STATE] == CANCELLING then
      end_cancelled(K, id, rec, now)
      out[#out + 1] = id
      out[#out + 1] = rec[F_ATTEMPT]
      out[#out + 1] = 'cancelled'
    elseif rec and rec[F_STATE] == LEASED then
      local reclaims = rec[F_RECLAIMS] + 1
      attempt_close(K.attempts, id, rec[F_ATTEMPT], rec[F_LEASED], now, 'expired', false)
      rec[F_RECLAIMS] = reclaims
      rec[F_TOKEN] = false
      rec[F_EXPIRES] = false
      local outcome
      if reclaims > rec[F_MAXR] then
        outcome = 'dead'
        rec[F_STATE] = DEAD
        rec[F_FINISHED] = now
        redis.call('HSET', K.errors, id, string.format(
          '{"type":"LeaseExpired","message":"lease expired %d times"}', reclaims))
        redis.call('ZADD', K.dead, now, id)
      else
        outcome = 'requeued'
        make_ready(rec, id, front, K.counters, K.ready, K.index)
      end
      save(K.tasks, id, rec)
      if outcome == 'dead' and rec[F_PART] then unpark(K, rec[F_PART], now) end
      out[#out + 1] = id
      out[#out + 1] = rec[F_ATTEMPT]
      out[#out + 1] = outcome
    end
  end
end

-- @helper payload:
local function payload(payloads, id, rec)
  return rec[F_PAYLOAD] or redis.call('HGET', payloads, id)
end

-- @helper task_reply: fmt payload
-- Everything get() shows of a task, as one flat array (see lua.task_from), ending with 1 when a
-- cancel was asked for (its reason is in the error). K.contexts is the contexts hash.
local function task_reply(K, id, rec)
  return {
    id, STATES[rec[F_STATE]], rec[F_PRIO], rec[F_ATTEMPT], rec[F_RECLAIMS], rec[F_FAILURES],
    rec[F_MAXR], fmt(rec[F_CREATED]), fmt(rec[F_RUNAT]), rec[F_DEDUP], fmt(rec[F_LEASED]),
    fmt(rec[F_EXPIRES]), fmt(rec[F_FINISHED]),
    payload(K.payloads, id, rec), redis.call('HGET', K.progress, id),
    redis.call('HGET', K.checkpoints, id), redis.call('HGET', K.results, id),
    redis.call('HGET', K.errors, id), rec[F_PART] or false,
    redis.call('HGET', K.contexts, id),
    (rec[F_STATE] == CANCELLING or rec[F_STATE] == CANCELLED) and 1 or 0,
  }
end
