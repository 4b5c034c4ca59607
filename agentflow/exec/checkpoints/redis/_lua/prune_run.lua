-- prune_run.lua: delete one finished run whole, if it still qualifies (retention).
--
-- Key layout (P = store prefix, R = run id; "{R}" is the hash tag, so the run's keys and its
-- markers live in one Redis Cluster slot):
--   KEYS[1]  P:run:{R}:cp       list    checkpoint rows
--   KEYS[2]  P:run:{R}:latest   hash    step, flow, status, segment, saved_at of the newest row
--   KEYS[3]  P:run:{R}:calls    hash    call-record rows
--   KEYS[4]  P:run:{R}:next     hash    record count per segment
--   KEYS[5]  P:run:{R}:lease    hash    the run's lease (the key exists only while it is live)
--   KEYS[6]  P:run:{R}:events   stream  the run's events (`redis._events`)
--   KEYS[7]  P:run:{R}:packed   string  its events before, packed once the run ended
--   KEYS[8 .. 7 + M]  P:marker:{R}:<kind>  the markers that say the run is live (a cancel
--            request: `rules.LIVE_MARKERS`), M = ARGV[8]; each exists only while live
-- On a standalone server (not Cluster) the indexes come too, so the run leaves them in the
-- same atomic step:
--   KEYS[8 + M]   P:runs              zset   run id -> saved_at
--   KEYS[9 + M]   P:runs:<flow>       zset   run id -> saved_at
--   KEYS[10 + M]  P:unfinished:<flow> zset   unfinished runs
--
-- ARGV[1] the cut-off (seconds since the epoch): the newest save must be older
-- ARGV[2] run id (the index member)
-- ARGV[3] the flow the caller read (the index keys are named after it)
-- ARGV[4] the step of the newest checkpoint row the caller judged ("" if it judged none)
-- ARGV[5] that row's signature (its header's last field; "" with ARGV[4])
-- ARGV[6] that row's segment, signed ("": the last row's header says it)
-- ARGV[7] the records per segment that row accounts for, JSON [[segment, count], ...] ("": unknown)
-- ARGV[8] M, the number of marker keys
-- ARGV[9..] the statuses a prune takes (only those of a run that ended)
--
-- The run qualifies when its latest hash names the flow the caller read, one of the
-- statuses and a saved_at before the cut-off, and no live lease holds it: a lease's key
-- expires when the lease lapses, so its existence is a live holder. When the caller judged
-- a row, the run also qualifies only while that row is still the newest one: the list holds
-- exactly step + 1 rows and its last row's header names that step and signature. That is
-- read from the row itself, not from the latest hash, whose fields anyone who can write to
-- the server can set: a save that came after the caller's judgement (a retry's claim)
-- appended another row, and the run is kept. Nothing may lie beyond that row either: no
-- live marker of the run, and no call record the row does not account for (`beyond` in
-- newest.lua: a segment newer than the row's, or more records in a segment than it counted).
-- A run whose later rows were popped off its list (RPOP) and whose latest hash and index
-- were set back (HSET, ZADD) still holds its later segment's records: it is kept, and the
-- reply says why. Then every key of the run is deleted at once: no reader and no writer
-- sees a part of it, and a script is never cut off halfway. A run whose latest hash is
-- missing is left alone: if rows of it remain, a step 0 over them is still refused (save.lua).
--
-- Returns:
--   {"pruned", rows, saved_at}   deleted; rows = checkpoint rows (not the blanks of a trim) + call records
--   {"gone"}                     no latest hash
--   {"kept", why}                another flow, status or time; held by a live lease; "live" (a
--                                live marker); or "moved" (the newest row is not the one judged)
--   {"kept", "beyond", row segment, segment, records, accounted}
--                                the call log goes on past the row (`beyond` in newest.lua)

-- newest_is, beyond and live_marker come from newest.lua, which the store puts before this script.

local m = tonumber(ARGV[8])
local last = redis.call('HMGET', KEYS[2], 'status', 'saved_at', 'flow')
if not last[1] then
  return {'gone'}
end
if last[3] ~= ARGV[3] then
  return {'kept', 'flow'}
end
local chosen = false
for i = 9, #ARGV do
  if ARGV[i] == last[1] then
    chosen = true
  end
end
if not chosen or not (tonumber(last[2]) < tonumber(ARGV[1])) then
  return {'kept', last[1]}
end
if redis.call('EXISTS', KEYS[5]) == 1 then
  return {'kept', 'held'}
end
if ARGV[4] ~= '' and not newest_is(KEYS[1], ARGV[4], ARGV[5]) then
  return {'kept', 'moved'}
end
if live_marker(8, m) then
  return {'kept', 'live'}
end
local past = beyond(KEYS[1], KEYS[3], ARGV[6], ARGV[7])
if past then
  return {'kept', 'beyond', past[1], past[2], past[3], past[4]}
end
-- a trimmed run's blanked rows (trim_run.lua) are not rows any more: not counted
local blanks = #redis.call('LPOS', KEYS[1], '', 'COUNT', 0)
local rows = redis.call('LLEN', KEYS[1]) - blanks + redis.call('HLEN', KEYS[3])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
if #KEYS == 10 + m then
  redis.call('ZREM', KEYS[8 + m], ARGV[2])
  redis.call('ZREM', KEYS[9 + m], ARGV[2])
  redis.call('ZREM', KEYS[10 + m], ARGV[2])
end
return {'pruned', tostring(rows), last[2]}
