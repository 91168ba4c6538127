#!lua
-- claim: lease up to n ready tasks of one queue, in one atomic step.
--
-- On the way: promote due scheduled and retry-waiting tasks to ready (at most cap), and reap
-- expired leases (at most cap): to the front of their priority, or dead-lettered past
-- max_reclaims. Then pop the n first ready tasks (priority, then front, then sequence) and lease
-- each with the token the caller drew for it, attempt + 1, and an expiry on the store's clock.
--
-- helpers: clock fmt load save member zrem reap payload
-- KEYS: 1 tasks, 2 payloads, 3 checkpoints, 4 errors, 5 counters, 6 ready, 7 waiting,
--       8 leases, 9 age, 10 dead
-- ARGV: 1 n, 2 lease_for seconds, 3 max_total seconds, 4 progress_timeout seconds ('' for none),
--       5 reap to the front ('1') or the back ('0'), 6 n tokens of 32 characters, concatenated,
--       7 cap on promotions and on reaps
-- Returns: {now, jobs, reaped}: now as a string; jobs flat, 9 values per job in pick order:
--          id, token, attempt, expires_at, payload, checkpoint (nil if none), priority,
--          failures, reclaims; reaped flat, 3 values each: id, attempt, 'requeued' | 'dead'.
local tasks, payloads, checkpoints, counters = KEYS[1], KEYS[2], KEYS[3], KEYS[5]
local ready, waiting, leases, age = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local n, tokens, cap = tonumber(ARGV[1]), ARGV[6], tonumber(ARGV[7])
local now = clock()

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
      redis.call('ZADD', age, rec[F_CREATED], id)
      save(tasks, id, rec)
    end
  end
  zrem(waiting, due)
  if failed > 0 then redis.call('HINCRBY', counters, 'failed', -failed) end
end

local reaped = {}
local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, cap)
if #expired > 0 then
  reap({tasks = tasks, errors = KEYS[4], counters = counters, ready = ready, leases = leases,
        age = age, dead = KEYS[10]}, expired, now, ARGV[5] == '1', reaped)
end

local jobs = {}
local popped = redis.call('ZPOPMIN', ready, n)
if #popped == 0 then return {fmt(now), jobs, reaped} end
-- The lease's expiry (agentlease._policy.lease.lease_expiry, progress deadline from now).
local ptimeout = tonumber(ARGV[4]) or false
local deadline = now + tonumber(ARGV[3])
local expires = math.min(now + tonumber(ARGV[2]), deadline)
if ptimeout then expires = math.min(expires, now + ptimeout) end
local expires_s = fmt(expires)
local picked = {}
for i = 1, #popped, 2 do
  local id = string.sub(popped[i], 26)
  local rec = load(tasks, id)
  local j = (i + 1) / 2
  local token = string.sub(tokens, j * 32 - 31, j * 32)
  local attempt = rec[F_ATTEMPT] + 1
  rec[F_STATE] = LEASED
  rec[F_ATTEMPT] = attempt
  rec[F_TOKEN] = token
  rec[F_LEASED] = now
  rec[F_EXPIRES] = expires
  rec[F_DEADLINE] = deadline
  rec[F_PTIMEOUT] = ptimeout
  rec[F_PROGRESSED] = now
  save(tasks, id, rec)
  redis.call('ZADD', leases, expires, id)
  picked[j] = id
  local checkpoint = false
  if rec[F_CHECKPOINTED] then checkpoint = redis.call('HGET', checkpoints, id) end
  local b = #jobs
  jobs[b + 1] = id
  jobs[b + 2] = token
  jobs[b + 3] = attempt
  jobs[b + 4] = expires_s
  jobs[b + 5] = payload(payloads, id, rec)
  jobs[b + 6] = checkpoint
  jobs[b + 7] = rec[F_PRIO]
  jobs[b + 8] = rec[F_FAILURES]
  jobs[b + 9] = rec[F_RECLAIMS]
end
zrem(age, picked)
return {fmt(now), jobs, reaped}
