#!lua flags=no-writes
-- dead: the dead-lettered tasks of one queue, most recent first, in one snapshot.
--
-- helpers: load task_reply
-- KEYS: 1 tasks, 2 payloads, 3 results, 4 progress, 5 checkpoints, 6 errors, 7 counters, 8 dead,
--       9 contexts
-- ARGV: 1 limit
-- Returns: a list of tasks, each as get.lua returns one; nil if nothing was ever enqueued to the
--          queue.
local K = {tasks = KEYS[1], payloads = KEYS[2], results = KEYS[3], progress = KEYS[4],
           checkpoints = KEYS[5], errors = KEYS[6], contexts = KEYS[9]}
local counters, dead = KEYS[7], KEYS[8]
if redis.call('EXISTS', counters) == 0 then return false end
local out = {}
for _, id in ipairs(redis.call('ZREVRANGE', dead, 0, tonumber(ARGV[1]) - 1)) do
  out[#out + 1] = task_reply(K, id, load(K.tasks, id))
end
return out
