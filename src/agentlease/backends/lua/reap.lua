#!lua
-- reap: requeue (or dead-letter, past max_reclaims) expired leases of one queue, oldest expiry
-- first, at most cap of them, in one atomic step. The cost is proportional to the expired leases:
-- live ones are never read. The caller repeats while a full batch comes back. A dead task frees
-- its partition (see unpark in _lib.lua).
--
-- helpers: clock reap
-- KEYS: 1 tasks, 2 errors, 3 counters, 4 ready, 5 index (leases by expiry, queued tasks), 6 dead,
--       7 waiting, 8 busy (partition -> busy tasks), 9 parked, 10 hot (partition -> minus its
--       parked tasks), 11 attempts (task id -> its attempt history), 12 cancelled (cancelled
--       tasks by finished_at)
-- ARGV: 1 to the front ('1') or the back ('0'), 2 cap
-- Returns: reaped, flat, 3 values each: id, attempt, 'requeued' | 'dead' | 'cancelled'.
local K = {tasks = KEYS[1], errors = KEYS[2], counters = KEYS[3], ready = KEYS[4],
           index = KEYS[5], dead = KEYS[6], waiting = KEYS[7], busy = KEYS[8], parked = KEYS[9],
           hot = KEYS[10], attempts = KEYS[11], cancelled = KEYS[12]}
local front, cap = ARGV[1] == '1', tonumber(ARGV[2])
local out = {}
local now = clock()
reap(K, redis.call('ZRANGEBYSCORE', K.index, '(0', now, 'LIMIT', 0, cap), now, front, out)
return out
