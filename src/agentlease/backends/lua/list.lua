#!lua flags=no-writes
-- list: one page of the tasks of one queue in one state, read through that state's index, in one
-- snapshot: queued in claim order (the ready ZSET, by member), leased by lease expiry (the
-- index's positive scores), done and dead most recently finished first (their ZSETs by
-- finished_at). A later page starts after the cursor's position: its member (queued), or its
-- score and task id (ties on a score are ordered by id, as Redis orders members of one score;
-- those tied with the cursor and before it are skipped, the only entries read and not shown).
-- Done tasks of key layout 1 not yet indexed by a purge (see purge.lua) are not listed.
--
-- helpers: load task_reply
-- KEYS: 1 tasks, 2 payloads, 3 results, 4 progress, 5 checkpoints, 6 errors, 7 contexts,
--       8 the state's index (ready, index, done or dead)
-- ARGV: 1 state ('queued', 'leased', 'done' or 'dead'), 2 limit, 3 the cursor's member or score
--       ('' for the first page), 4 the cursor's task id
-- Returns: {1 if more may follow else 0, then per task: its position (member or score), the
--          task as get.lua returns it}.
local K = {tasks = KEYS[1], payloads = KEYS[2], results = KEYS[3], progress = KEYS[4],
           checkpoints = KEYS[5], errors = KEYS[6], contexts = KEYS[7]}
local index = KEYS[8]
local state, limit, at, after = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local found = {}
if state == 'queued' then
  local from = '-'
  if at ~= '' then from = '(' .. at end
  for _, m in ipairs(redis.call('ZRANGEBYLEX', index, from, '+', 'LIMIT', 0, limit + 1)) do
    found[#found + 1] = {m, string.sub(m, 26)}
  end
else
  local desc = state ~= 'leased'
  local offset = 0
  local cut = tonumber(at)
  while #found <= limit do
    local batch
    if desc then
      local top = '+inf'
      if at ~= '' then top = at end
      batch = redis.call('ZREVRANGEBYSCORE', index, top, '-inf', 'WITHSCORES',
                         'LIMIT', offset, limit + 1)
    else
      local low = '(0'
      if at ~= '' then low = at end
      batch = redis.call('ZRANGEBYSCORE', index, low, '+inf', 'WITHSCORES',
                         'LIMIT', offset, limit + 1)
    end
    if #batch == 0 then break end
    offset = offset + #batch / 2
    for i = 1, #batch, 2 do
      local id, score = batch[i], batch[i + 1]
      local skip = false
      if cut and tonumber(score) == cut then
        if desc then skip = id >= after else skip = id <= after end
      end
      if not skip and #found <= limit then found[#found + 1] = {score, id} end
    end
  end
end
local out = {0}
if #found > limit then out[1] = 1 end
for i = 1, math.min(#found, limit) do
  local id = found[i][2]
  out[#out + 1] = found[i][1]
  out[#out + 1] = task_reply(K, id, load(K.tasks, id))
end
return out
