#!lua
-- claim: lease up to n ready tasks of one queue, in one atomic step.
--
-- On the way: promote due scheduled and retry-waiting tasks to ready (at most cap), and reap
-- expired leases (at most cap): to the front of their priority, or dead-lettered past
-- max_reclaims (a dead task frees its partition: see unpark in _lib.lua). Then pop the n first
-- ready tasks (priority, then front, then sequence) and lease each with the token the caller
-- drew for it, attempt + 1, and an expiry on the store's clock.
--
-- Both searches are skipped while the clock is before the counters' 'wake' time, a lower bound
-- of the scores of waiting and of the leases in the index (see the lower_wake helper): a claim
-- with nothing due reads one hash field instead of searching two ZSETs. A claim that searches
-- sets 'wake' again from the first of those scores, and every claim lowers it to the expiry it
-- grants. A leased task's index entry takes the place of its queued one (see _lib.lua).
--
-- helpers: clock save_head attempt_open
-- KEYS: 1 tasks, 2 payloads, 3 checkpoints, 4 errors, 5 counters, 6 ready, 7 waiting,
--       8 index, 9 dead, 10 busy (partition -> busy tasks), 11 parked, 12 hot (partition ->
--       minus its parked tasks), 13 contexts, 14 attempts (task id -> its attempt history),
--       15 cancelled (cancelled tasks by finished_at: a reaped lease a cancel was asked for)
-- ARGV: 1 the terms, separated by single spaces: n, lease_for seconds, max_total seconds,
--       progress_timeout seconds ('-' for none), reap to the front (1) or the back (0), cap on
--       promotions and on reaps; 2 n tokens of 32 characters, concatenated; 3 the holder (the
--       claiming worker's id, recorded in each task's attempt history; '' for none)
-- Returns: {seconds, microseconds, expires_at, jobs, reaped}: now as TIME's two integers;
--          expires_at of the leases granted, as an exact '%.17g' string (nil if none); jobs
--          flat, 9 values per job in pick order: id, attempt, payload, checkpoint (nil if none),
--          priority, failures, reclaims, context (nil if none), run_at (when the task became
--          due, an exact '%.17g' string) (the j-th job holds the j-th token); reaped flat, 3
--          values each: id, attempt, 'requeued' | 'dead' | 'cancelled'.
-- A queue none of whose tasks ever had a context has no contexts hash: one EXISTS per claim,
-- then no read per job.
local tasks, payloads, checkpoints, counters = KEYS[1], KEYS[2], KEYS[3], KEYS[5]
local ready, waiting, index = KEYS[6], KEYS[7], KEYS[8]
local n, lease_for, max_total, ptimeout, front, cap =
  string.match(ARGV[1], '^(%d+) (%S+) (%S+) (%S+) ([01]) (%d+)$')
local tokens, holder, attempts = ARGV[2], ARGV[3], KEYS[14]
local now, time = clock()
local reaped = {}
local stored = redis.call('HGET', counters, 'wake')
local wake = stored and tonumber(stored)
local woke = not wake or now >= wake
if woke then
  -- helpers here: load save member zrem reap
  -- Promote due waiting tasks (every member of waiting is scheduled or failed).
  local due = redis.call('ZRANGEBYSCORE', waiting, '-inf', now, 'LIMIT', 0, cap)
  if #due > 0 then
    local failed = 0
    for _, id in ipairs(due) do
      local rec = load(tasks, id)
      if rec and (rec[F_STATE] == SCHEDULED or rec[F_STATE] == FAILED) then
        if rec[F_STATE] == FAILED then failed = failed + 1 end
        rec[F_STATE] = QUEUED
        redis.call('ZADD', ready, 0, member(rec, id))
        redis.call('ZADD', index, -rec[F_CREATED], id)
        save(tasks, id, rec)
      end
    end
    zrem(waiting, due)
    if failed > 0 then redis.call('HINCRBY', counters, 'failed', -failed) end
  end
  local expired = redis.call('ZRANGEBYSCORE', index, '(0', now, 'LIMIT', 0, cap)
  if #expired > 0 then
    reap({tasks = tasks, errors = KEYS[4], counters = counters, ready = ready, waiting = waiting,
          index = index, dead = KEYS[9], busy = KEYS[10], parked = KEYS[11], hot = KEYS[12],
          attempts = attempts, cancelled = KEYS[15]},
         expired, now, front == '1', reaped)
  end
  -- Nothing left is due before the first of those scores (which is now or earlier when a
  -- search stopped at cap, so that the next claim searches again).
  wake = math.huge
  local heads = {redis.call('ZRANGE', waiting, 0, 0, 'WITHSCORES')[2],
                 redis.call('ZRANGEBYSCORE', index, '(0', '+inf', 'WITHSCORES', 'LIMIT', 0, 1)[2]}
  for _, head in pairs(heads) do wake = math.min(wake, tonumber(head)) end
end

local jobs = {}
local popped = redis.call('ZPOPMIN', ready, n)
if #popped == 0 then
  -- A queue nothing was enqueued to has no counters, and gets none.
  if woke and redis.call('EXISTS', counters) == 1 then
    redis.call('HSET', counters, 'wake', wake)
  end
  return {time[1], time[2], false, jobs, reaped}
end
-- The lease's expiry (agentlease._policy.lease.lease_expiry, progress deadline from now).
ptimeout = tonumber(ptimeout) or false
local deadline = now + tonumber(max_total)
local expires = math.min(now + tonumber(lease_for), deadline)
if ptimeout then expires = math.min(expires, now + ptimeout) end
if woke or expires < wake then
  redis.call('HSET', counters, 'wake', math.min(wake, expires))
end
-- One exact string serves as the leases' score in the index and as the reply.
local expires_s = string.format('%.17g', expires)
local count = #popped / 2
if count == 1 then
  local id = string.sub(popped[1], 26)
  local raw = redis.call('HGET', tasks, id)
  -- The head of the record (the lease's values, up to the last progress), then what the job
  -- needs; the head is written back, the rest kept as it is (see save_head).
  local off, _, attempt, _, _, req, finished = cmsgpack.unpack_limit(raw, 10, 3)
  local _, prio, failures, reclaims, checkpointed, inline, _, _, _, _, run_at =
    cmsgpack.unpack_limit(raw, 10, off)
  attempt = attempt + 1
  save_head(tasks, id, raw, off, LEASED, attempt, string.sub(tokens, 1, 32), expires, req,
            finished, now, deadline, ptimeout, now)
  redis.call('ZADD', index, expires_s, id)
  attempt_open(attempts, id, holder)
  local checkpoint = false
  if checkpointed then checkpoint = redis.call('HGET', checkpoints, id) end
  local context = false
  if redis.call('EXISTS', KEYS[13]) == 1 then context = redis.call('HGET', KEYS[13], id) end
  jobs = {id, attempt, inline or redis.call('HGET', payloads, id), checkpoint, prio, failures,
          reclaims, context, string.format('%.17g', run_at)}
  return {time[1], time[2], expires_s, jobs, reaped}
end
-- A batch: the records are read with one HMGET and written back with one HSET, the index with
-- one ZADD (in chunks of 1000: unpack() is bounded by Lua's stack). Of a record's head (state,
-- attempt, token, expires_at, request nonce, finished_at, leased_at, deadline, progress timeout,
-- last progress) only attempt, token, nonce and finished_at differ between the tasks: the rest
-- is encoded once for the batch.
-- The rest is encoded here with MessagePack's own fixed forms: an attempt below 128 is one byte
-- (a positive fixint), two falses are two bytes 0xc2, and a token is its string header (as
-- cmsgpack writes it for 32 bytes) and its 32 characters: the same bytes cmsgpack.pack gives.
local ids = {}
for j = 1, count do ids[j] = string.sub(popped[2 * j - 1], 26) end
local leased, until_ = cmsgpack.pack(LEASED), cmsgpack.pack(expires)
local since = cmsgpack.pack(now, deadline, ptimeout, now)
local token_header = string.sub(cmsgpack.pack(string.sub(tokens, 1, 32)), 1, -33)
local records, scores = {}, {}
local contexts = redis.call('EXISTS', KEYS[13]) == 1
for c = 1, count, 1000 do
  local last = math.min(c + 999, count)
  local raws = redis.call('HMGET', tasks, unpack(ids, c, last))
  for j = c, last do
    local id, raw = ids[j], raws[j - c + 1]
    local off, _, attempt, _, _, req, finished = cmsgpack.unpack_limit(raw, 10, 3)
    local _, prio, failures, reclaims, checkpointed, inline, _, _, _, _, run_at =
      cmsgpack.unpack_limit(raw, 10, off)
    attempt = attempt + 1
    local packed_attempt, nonce_finished
    if attempt < 128 then
      packed_attempt = string.char(attempt)
    else
      packed_attempt = cmsgpack.pack(attempt)
    end
    if req or finished then
      nonce_finished = cmsgpack.pack(req, finished)
    else
      nonce_finished = '\194\194'
    end
    records[2 * j - 1] = id
    records[2 * j] = string.sub(raw, 1, 3) .. leased .. packed_attempt .. token_header
                     .. string.sub(tokens, j * 32 - 31, j * 32) .. until_ .. nonce_finished
                     .. since .. string.sub(raw, off + 1)
    scores[2 * j - 1] = expires_s
    scores[2 * j] = id
    attempt_open(attempts, id, holder)
    local checkpoint = false
    if checkpointed then checkpoint = redis.call('HGET', checkpoints, id) end
    local b = #jobs
    jobs[b + 1] = id
    jobs[b + 2] = attempt
    jobs[b + 3] = inline or redis.call('HGET', payloads, id)
    jobs[b + 4] = checkpoint
    jobs[b + 5] = prio
    jobs[b + 6] = failures
    jobs[b + 7] = reclaims
    jobs[b + 8] = contexts and redis.call('HGET', KEYS[13], id)
    jobs[b + 9] = string.format('%.17g', run_at)
  end
end
for c = 1, #records, 1000 do
  redis.call('HSET', tasks, unpack(records, c, math.min(c + 999, #records)))
  redis.call('ZADD', index, unpack(scores, c, math.min(c + 999, #scores)))
end
return {time[1], time[2], expires_s, jobs, reaped}
