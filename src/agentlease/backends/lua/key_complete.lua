#!lua
-- key_complete: store an action's result on its reserved key, fenced, in one atomic step:
-- state done, finished = now, no holder, purge = now + window.
--
-- helpers: key_finish
-- KEYS: 1 the key's hash
-- ARGV: 1 token, 2 request nonce, 3 result JSON ('' for none), 4 window seconds
-- Returns: {'ok'}; {'replayed'} when this same request was already applied (a retry after a
--          lost reply); {'lost', current fence, state} when the reservation is not held (both
--          nil when the key is absent or past purge).
return key_finish(KEYS[1], 'done', 'result', ARGV[3], ARGV[1], ARGV[2], tonumber(ARGV[4]))
