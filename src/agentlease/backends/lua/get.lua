#!lua flags=no-writes
-- get: read one task of one queue in one consistent snapshot.
--
-- helpers: load task_reply
-- KEYS: 1 tasks, 2 payloads, 3 results, 4 progress, 5 checkpoints, 6 errors, 7 contexts,
--       8 attempts
-- ARGV: 1 task id
-- Returns: the task, flat: id, state, priority, attempt, reclaims, failures, max_reclaims,
--          created_at, run_at, dedup key, leased_at, expires_at, finished_at, payload, progress,
--          checkpoint, result, error, partition, context, cancelled (1 once a cancel was
--          asked for, else 0), ended attempts (JSON; times as strings), the worker of the last
--          claim (absent values nil);
--          nil if no such task.
local K = {tasks = KEYS[1], payloads = KEYS[2], results = KEYS[3], progress = KEYS[4],
           checkpoints = KEYS[5], errors = KEYS[6], contexts = KEYS[7]}
local rec = load(K.tasks, ARGV[1])
if not rec then return false end
local reply = task_reply(K, ARGV[1], rec)
reply[22] = redis.call('HGET', KEYS[8], ARGV[1])
reply[23] = redis.call('HGET', KEYS[8], '>' .. ARGV[1])
return reply
