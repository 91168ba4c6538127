-- Helpers shared by the shared-state scripts (record_write.lua, counter_add.lua, locks_*.lua),
-- prepended like those of _lib.lua.
--
-- A versioned record is one hash, <prefix>:rec:{<key>} (the key is its own hash tag, so records
-- spread over a cluster and a script touches that one hash), with the fields:
--   f:<name>  the JSON of the record's field <name>
--   _v        the version (absent record: 0), +1 at every write
--   _f        the highest fencing token a write has shown (absent or never fenced: 0)
--   _u        the time of the last write (a fmt() string)
--
-- A bounded counter is the string <prefix>:ctr:{<name>} (its own hash tag); its holds and its
-- version live beside it under the same tag, so a script that touches the counter, its holds and
-- its version stays on one shard:
--   <prefix>:ctr:{<name>}:h   hash: token -> the hold's units while it lives; 'c' or 'r' once it
--                             was committed or released (a tombstone, kept until the hold's
--                             expiry, so a resent commit or release recognises its own work)
--   <prefix>:ctr:{<name>}:x   zset: token -> expires_at, exactly the tokens of :h
--   <prefix>:ctr:{<name>}:v   string: the counter's version (absent: 0), +1 by every script
--                             that changes the stored value (layout 3; counter_bump)
-- A hold's units are in the counter's value while it lives. Every script that reads or changes
-- the value first gives back the units of the holds that ran out (counter_sweep).
--
-- A name of a state space, "<space>|<name>" (layout 3), is placed in the space's hash tag
-- {<prefix>:sp:<space>}, so that every record and counter of one space (and a plan's receipt) is
-- on one shard: the record <prefix>:rec:{<prefix>:sp:<space>}:<name>, the counter
-- <prefix>:ctr:{<prefix>:sp:<space>}:<name> and its <prefix>:ctr:h:{...}:<name>,
-- <prefix>:ctr:x:{...}:<name>, <prefix>:ctr:v:{...}:<name> (the part after the tag is the whole
-- name, which may hold ':': the kind goes before the tag). The scripts are given these keys and
-- never build one.
--
-- A retry budget is the hash <prefix>:bud:{<key>} and a circuit breaker the hash
-- <prefix>:brk:{<key>} (each its own hash tag, so one script touches one key on one shard):
--   budget:   c  calls recorded, r  retries granted
--   breaker:  s  state ('closed', 'open', 'half_open'; absent: closed), f  consecutive failures,
--             n  the fence of the latest half-open trial, u  until: the end of the cool-down
--             while open, of the trial's turn while half-open (0 while closed; a '%.17g' string)
-- Every write sets the key's expiry to now + ttl (PEXPIREAT), so Redis deletes a budget or a
-- breaker ttl after its last write and an expired one reads as absent. The decisions are those of
-- agentlease/backends/_budgets.py.
--
-- Every lock shares the hash tag {<prefix>:locks}, so that a set of any names is one script on
-- one shard (all the locks of a store live on one shard of a cluster):
--   :owner    hash: name -> owner, from acquisition until release or sweep (an expired lock
--             keeps its owner until then; it counts as free)
--   :expiry   zset: name -> expires_at, exactly the names of :owner (the sweep reads only the
--             expired)
--   :fence    hash: name -> the last fencing token drawn (never deleted: tokens only rise)
--   :freed    hash: name -> the request nonce of the release that freed it last (a resent
--             release recognises its own work)
-- A lock is held when it has an owner and now < expires_at.

-- @helper batched:
-- redis.call(cmd, key, args...) over args in chunks of 1000 (unpack() is bounded by Lua's stack;
-- an even chunk keeps name/value pairs together), the array replies joined in order.
local function batched(cmd, key, args)
  local out = {}
  for i = 1, #args, 1000 do
    local reply = redis.call(cmd, key, unpack(args, i, math.min(i + 999, #args)))
    if type(reply) == 'table' then
      for _, v in ipairs(reply) do out[#out + 1] = v end
    end
  end
  return out
end

-- @helper lock_names:
-- ARGV from position first on: the lock names.
local function lock_names(first)
  local names = {}
  for i = first, #ARGV do names[#names + 1] = ARGV[i] end
  return names
end

-- @helper lock_read: batched
-- Who holds each of names at now: per name, its owner (false if free: no owner, or its lease ran
-- out) and, when held, its expires_at.
local function lock_read(owners, expiry, names, now)
  local who = batched('HMGET', owners, names)
  local when = batched('ZMSCORE', expiry, names)
  local held, expires = {}, {}
  for i = 1, #names do
    local e = tonumber(when[i])
    if who[i] and e and now < e then
      held[i], expires[i] = who[i], e
    else
      held[i] = false
    end
  end
  return held, expires
end

-- @helper counter_bump:
-- Raise the counter's version (its key: version) by one: a script calls it once its stored value
-- changed, so that two reads at one version saw one value (no ABA). Returns the new version.
local function counter_bump(version)
  return redis.call('INCRBY', version, 1)
end

-- @helper counter_sweep: batched counter_bump
-- The counter's value after deleting its holds that ran out by now (expires_at <= now) and
-- taking their units out of it (a tombstone has none); the version goes up by one if that
-- changed the value. The cost is proportional to the expired holds: live ones are never read.
-- Each hold's units go back by DECRBY of the stored string, so Redis does the arithmetic on
-- exact integers (a sum in Lua would be a double).
local function counter_sweep(counter, holds, expiry, version, now)
  local gone = redis.call('ZRANGEBYSCORE', expiry, '-inf', now)
  if #gone == 0 then return tonumber(redis.call('GET', counter)) or 0 end
  local units = batched('HMGET', holds, gone)
  local value = false
  for i = 1, #gone do
    local n = tonumber(units[i])
    if n and n ~= 0 then value = redis.call('DECRBY', counter, units[i]) end
  end
  batched('HDEL', holds, gone)
  batched('ZREM', expiry, gone)
  if value then
    counter_bump(version)
    return value
  end
  return tonumber(redis.call('GET', counter)) or 0
end

-- @helper expire_after:
-- Set key to expire ttl seconds (an ARGV string) after now: PEXPIREAT, rounded up to the ms
-- (a ttl of 0 or less deletes it at once: it has expired).
local function expire_after(key, now, ttl)
  redis.call('PEXPIREAT', key, string.format('%.0f', math.ceil((now + tonumber(ttl)) * 1000)))
end

-- @helper breaker_reply:
-- A breaker's state as the breaker scripts return it: {state, failures, fence, retry_after (a
-- '%.17g' string: seconds until a trial may be admitted, 0 if closed or due), trial (1 or 0)}.
local function breaker_reply(state, failures, fence, untl, now, trial)
  local wait = 0
  if state ~= 'closed' and untl > now then wait = untl - now end
  return {state, failures, fence, string.format('%.17g', wait), trial}
end
