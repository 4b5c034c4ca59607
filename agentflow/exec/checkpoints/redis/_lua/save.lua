-- save.lua: store one checkpoint of a run, as a compare-and-set.
--
-- Key layout (P = store prefix, R = run id; "{R}" is the hash tag, so all four keys of a
-- run live in one Redis Cluster slot):
--   KEYS[1]  P:run:{R}:cp       list    checkpoint rows; list index = step
--   KEYS[2]  P:run:{R}:latest   hash    step, flow, status, segment, saved_at of the newest row
--   KEYS[3]  P:run:{R}:calls    hash    "<segment>:<seq>" -> call-record row
--   KEYS[4]  P:run:{R}:next     hash    "<segment>" -> number of records in that segment
-- On a standalone server (not Cluster) the indexes come too, so the save updates them atomically:
--   KEYS[5]  P:runs             zset    run id -> saved_at
--   KEYS[6]  P:runs:<flow>      zset    run id -> saved_at
--   KEYS[7]  P:unfinished:<flow> zset   run id -> when its keys expire (+inf while paused)
--
-- ARGV[1] step      ARGV[2] flow      ARGV[3] status     ARGV[4] segment
-- ARGV[5] saved_at  ARGV[6] row (the encoded checkpoint, bytes as given)
-- ARGV[7] ttl in seconds; "0" means the run's keys never expire
-- ARGV[8] run id
-- ARGV[9] n: how many call records to append before the checkpoint (0 for a plain save);
--         then four values per record: segment, seq, kind, row
-- With a lease move (lease_move.lua): the run's lease key after every other KEY, and the move's
-- four values after the records' (ARGV[10 + 4n] to ARGV[13 + 4n]). A move may carry events:
-- then the run's stream (P:run:{R}:events) is the KEY before the lease key, and ARGV[14 + 4n]
-- is how many entries to keep (MAXLEN ~), followed by the encoded event rows, in order; they
-- are added (as append_events.lua adds them) once the save is stored, never when it is refused,
-- and the stream expires with the run's other keys.
--
-- The rule (the same as agentflow/exec/checkpoints/_rules.py check_save): step 0 only for
-- a run the store does not have; otherwise the run must be of the same flow, must not have
-- ended for good (done/cancelled; a failed run takes the claim of a retry), and step must be exactly latest + 1. A run without its latest hash
-- but with any other key left (rows kept after the hash was deleted or evicted) is not one
-- the store does not have: its step 0 is refused and nothing is touched
-- (_rules.py check_no_stored_rows). That check runs only for a step 0.
--
-- Expiry: every key of the run expires ttl seconds after this write, except while the
-- run is paused, when its keys are made persistent.
--
-- The records follow record_call.lua's rules, checked against the latest checkpoint as it
-- stands before this save, and are all checked before anything is written: the records and
-- the checkpoint are stored together or not at all.
--
-- Returns:
--   {"ok"}
--   {"refused"}                              no run stored and step is not 0
--   {"rows"}                                 step 0, no latest hash, but rows of the run are stored
--   {"refused", step, flow, status}          the stored latest, which the save breaks
--   {"corrupt", rows, step}                  the row list does not end at the latest step
--   {"call", i, step, status, segment, next} record i is refused (as record_call.lua would)
--   {"call-missing", i}                      record i is for a run with no checkpoint
--   {"held", owner, token, expires_at}       a move: another token's live lease (nothing written)

local last = redis.call('HMGET', KEYS[2], 'step', 'flow', 'status', 'segment')

local n = tonumber(ARGV[9] or '0')
local move = 10 + n * 4
local lease_key = nil
if ARGV[move] then
  lease_key = KEYS[#KEYS]
  local refusal = lease_refusal(lease_key, ARGV[move])
  if refusal then
    return refusal
  end
end
local events_key = nil
if lease_key and ARGV[move + 4] then
  events_key = KEYS[#KEYS - 1]
end
local indexed = #KEYS - (lease_key and 1 or 0) - (events_key and 1 or 0) == 7
if n > 0 then
  if not last[1] then
    return {'call-missing', '1'}
  end
  local segment_of_latest = last[4]
  local ended = last[3] == 'done' or last[3] == 'failed' or last[3] == 'cancelled'
  local counts = {}
  for i = 1, n do
    local base = 9 + (i - 1) * 4
    local segment, seq, kind = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3]
    if counts[segment] == nil then
      counts[segment] = tonumber(redis.call('HGET', KEYS[4], segment) or '0')
    end
    local fenced = kind == 'started' and (ended or segment_of_latest ~= segment)
    -- Append-only: a position that holds a record is never written again, whatever the
    -- (unsigned, rewindable) counts hash says.
    local taken = redis.call('HEXISTS', KEYS[3], segment .. ':' .. seq) == 1
    if fenced or taken or tonumber(seq) ~= counts[segment] then
      return {'call', tostring(i), last[1], last[3], segment_of_latest, tostring(counts[segment])}
    end
    counts[segment] = counts[segment] + 1
  end
end

if not last[1] then
  if ARGV[1] ~= '0' then
    return {'refused'}
  end
  -- Rows of an earlier run with this id are kept, never overwritten: the caller must delete it.
  if redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[4]) > 0 then
    return {'rows'}
  end
else
  local final = last[3] == 'done' or last[3] == 'cancelled'  -- a failed run takes a retry's claim
  if last[2] ~= ARGV[2] or final or tonumber(ARGV[1]) ~= tonumber(last[1]) + 1 then
    return {'refused', last[1], last[2], last[3]}
  end
  local rows = redis.call('LLEN', KEYS[1])
  if rows ~= tonumber(last[1]) + 1 then
    return {'corrupt', tostring(rows), last[1]}
  end
end

for i = 1, n do
  local base = 9 + (i - 1) * 4
  redis.call('HSET', KEYS[3], ARGV[base + 1] .. ':' .. ARGV[base + 2], ARGV[base + 4])
  redis.call('HINCRBY', KEYS[4], ARGV[base + 1], 1)
end

redis.call('RPUSH', KEYS[1], ARGV[6])
redis.call('HSET', KEYS[2], 'step', ARGV[1], 'flow', ARGV[2], 'status', ARGV[3],
  'segment', ARGV[4], 'saved_at', ARGV[5])

if lease_key then
  lease_apply(lease_key, ARGV[move + 1], ARGV[move + 2], ARGV[move + 3])
end

if indexed then
  redis.call('ZADD', KEYS[5], ARGV[5], ARGV[8])
  redis.call('ZADD', KEYS[6], ARGV[5], ARGV[8])
  if ARGV[3] == 'running' or ARGV[3] == 'paused' then
    -- Scored by when the run's keys expire (server clock), so listing needs no per-run read.
    local expires = '+inf'
    if ARGV[3] ~= 'paused' and ARGV[7] ~= '0' then
      local t = redis.call('TIME')
      expires = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[7])
    end
    redis.call('ZADD', KEYS[7], expires, ARGV[8])
  else
    redis.call('ZREM', KEYS[7], ARGV[8])
  end
end

local expiring = {KEYS[1], KEYS[2], KEYS[3], KEYS[4]}
if events_key then
  for i = move + 5, #ARGV do
    redis.call('XADD', events_key, 'MAXLEN', '~', ARGV[move + 4], '*', 'e', ARGV[i])
  end
  expiring[5] = events_key
end
for _, key in ipairs(expiring) do
  if ARGV[3] == 'paused' or ARGV[7] == '0' then
    redis.call('PERSIST', key)
  else
    redis.call('EXPIRE', key, ARGV[7])
  end
end
return {'ok'}
