-- trim_run.lua: keep only the newest checkpoint of one finished run, if it still qualifies (retention).
--
-- Key layout (P = store prefix, R = run id; "{R}" is the hash tag, so these keys live in one
-- Redis Cluster slot; the script touches no other key, so no index entry changes and it runs
-- the same on one server and on a Cluster):
--   KEYS[1]  P:run:{R}:cp       list    checkpoint rows; list index = step
--   KEYS[2]  P:run:{R}:latest   hash    step, flow, status, segment, saved_at of the newest row
--   KEYS[3]  P:run:{R}:lease    hash    the run's lease (the key exists only while it is live)
--   KEYS[4]  P:run:{R}:calls    hash    call-record rows (read only)
--   KEYS[5 .. 4 + M]  P:marker:{R}:<kind>  the markers that say the run is live, M = ARGV[7]
--
-- ARGV[1] the cut-off (seconds since the epoch): the newest save must be older
-- ARGV[2] the flow-column prefix of the runs a trim never takes (tool loops: "loop:")
-- ARGV[3] the step of the newest checkpoint row the caller judged ("" if it judged none)
-- ARGV[4] that row's signature (its header's last field; "" with ARGV[3])
-- ARGV[5] that row's segment, signed ("": the last row's header says it)
-- ARGV[6] the records per segment that row accounts for, JSON [[segment, count], ...] ("": unknown)
-- ARGV[7] M, the number of marker keys
-- ARGV[8..] the statuses a trim takes (only those of a run that ended)
--
-- The run qualifies as prune_run.lua judges it (one of the statuses, saved before the
-- cut-off, no live lease, the newest row still the one the caller judged: read from the
-- row itself, not the latest hash; no live marker, and nothing in the call log beyond that
-- row), and also: it is not a tool loop, its list holds exactly step + 1 entries (the shape
-- save.lua insists on), and the entry before the newest still holds a row. Then every entry
-- but the newest is made an empty string: a trimmed row is blanked, not removed, so the
-- list index stays the step (save.lua, relist.lua and `history` count on it). A stored row
-- is never empty (it starts with its header), so the blanks are told apart, and they always
-- come first: a run retried after a trim appends after them. The list is rebuilt with LTRIM
-- and LPUSH (linear in its length), never deleted, so its expiry stays. The call records,
-- the lease, the latest hash, the events and the index entries are not touched.
--
-- Returns:
--   {"trimmed", rows}   rows = checkpoint rows blanked now
--   {"gone"}            no latest hash
--   {"kept", why}       another status or time, "loop", "held" (a live lease), "moved" (the
--                       newest row is not the one judged), "live" (a live marker), "shape"
--                       (the list is not step + 1 long), or "one" (nothing older is left)
--   {"kept", "beyond", row segment, segment, records, accounted}
--                       the call log goes on past the row (`beyond` in newest.lua)

-- newest_is, beyond and live_marker come from newest.lua, which the store puts before this script.

local last = redis.call('HMGET', KEYS[2], 'status', 'saved_at', 'flow', 'step')
if not last[1] then
  return {'gone'}
end
local chosen = false
for i = 8, #ARGV do
  if ARGV[i] == last[1] then
    chosen = true
  end
end
if not chosen or not (tonumber(last[2]) < tonumber(ARGV[1])) then
  return {'kept', last[1]}
end
if string.sub(last[3], 1, #ARGV[2]) == ARGV[2] then
  return {'kept', 'loop'}
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return {'kept', 'held'}
end
if ARGV[3] ~= '' and not newest_is(KEYS[1], ARGV[3], ARGV[4]) then
  return {'kept', 'moved'}
end
if live_marker(5, tonumber(ARGV[7])) then
  return {'kept', 'live'}
end
local past = beyond(KEYS[1], KEYS[4], ARGV[5], ARGV[6])
if past then
  return {'kept', 'beyond', past[1], past[2], past[3], past[4]}
end
local n = redis.call('LLEN', KEYS[1])
if n ~= tonumber(last[4]) + 1 then
  return {'kept', 'shape'}
end
if n < 2 or redis.call('LINDEX', KEYS[1], -2) == '' then
  return {'kept', 'one'}
end
local rows = n - 1 - #redis.call('LPOS', KEYS[1], '', 'COUNT', 0)
redis.call('LTRIM', KEYS[1], -1, -1)
local left = n - 1
while left > 0 do
  local blanks = {}
  for i = 1, math.min(left, 1000) do
    blanks[i] = ''
  end
  redis.call('LPUSH', KEYS[1], unpack(blanks))
  left = left - #blanks
end
return {'trimmed', tostring(rows)}
