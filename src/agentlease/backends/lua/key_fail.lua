#!lua
-- key_fail: store an action's permanent failure on its reserved key, fenced, in one atomic step:
-- state failed, finished = now, no holder, purge = now + window.
--
-- helpers: key_finish
-- KEYS: 1 the key's hash
-- ARGV: 1 token, 2 request nonce, 3 error JSON, 4 window seconds
-- Returns: {'ok'}, {'replayed'} or {'lost', current fence, state} as for key_complete.lua.
return key_finish(KEYS[1], 'failed', 'error', ARGV[3], ARGV[1], ARGV[2], tonumber(ARGV[4]))
