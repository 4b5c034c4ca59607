-- record_call.lua: append one call record to a run's call log, numbered and fenced.
--
-- Key layout (P = store prefix, R = run id; "{R}" is the hash tag, so all four keys of a
-- run live in one Redis Cluster slot):
--   KEYS[1]  P:run:{R}:cp       list    checkpoint rows; list index = step
--   KEYS[2]  P:run:{R}:latest   hash    step, flow, status, segment, saved_at of the newest row
--   KEYS[3]  P:run:{R}:calls    hash    "<segment>:<seq>" -> call-record row
--   KEYS[4]  P:run:{R}:next     hash    "<segment>" -> number of records in that segment
--
-- ARGV[1] segment   ARGV[2] seq   ARGV[3] kind   ARGV[4] row (the encoded record, bytes as given)
-- ARGV[5] ttl in seconds; "0" means the run's keys never expire
-- With a lease move (lease_move.lua): KEYS[5] the run's lease key, ARGV[6..9] the move.
--
-- The rules (the same as agentflow/exec/checkpoints/_rules.py check_call): the run must
-- have a checkpoint; a "started" record is refused when the run ended (done/failed/cancelled) or when
-- its segment is not the latest checkpoint's segment (the writer was fenced off); every
-- record's seq must equal the number of records its segment already has, and no record may
-- be stored at that position already (records are append-only).
--
-- Expiry: every key of the run expires ttl seconds after this write, except while the
-- run is paused, when its keys are made persistent.
--
-- Returns:
--   {"ok"}
--   {"missing"}                               the run has no checkpoint
--   {"refused", step, status, segment, next}  the latest checkpoint and the segment's next seq
--   {"held", owner, token, expires_at}         a move: another token's live lease (nothing written)

if KEYS[5] then
  local refusal = lease_refusal(KEYS[5], ARGV[6])
  if refusal then
    return refusal
  end
end

local last = redis.call('HMGET', KEYS[2], 'step', 'status', 'segment')
if not last[1] then
  return {'missing'}
end

local count = tonumber(redis.call('HGET', KEYS[4], ARGV[1]) or '0')
local ended = last[2] == 'done' or last[2] == 'failed' or last[2] == 'cancelled'
local fenced = ARGV[3] == 'started' and (ended or last[3] ~= ARGV[1])
-- Append-only: a position that holds a record is never written again, even when the counts
-- hash was set back (it is unsigned: one HSET rewinds it).
local taken = redis.call('HEXISTS', KEYS[3], ARGV[1] .. ':' .. ARGV[2]) == 1
if fenced or taken or tonumber(ARGV[2]) ~= count then
  return {'refused', last[1], last[2], last[3], tostring(count)}
end

redis.call('HSET', KEYS[3], ARGV[1] .. ':' .. ARGV[2], ARGV[4])
redis.call('HSET', KEYS[4], ARGV[1], tostring(count + 1))
if KEYS[5] then
  lease_apply(KEYS[5], ARGV[7], ARGV[8], ARGV[9])
end

for i = 1, 4 do
  if last[2] == 'paused' or ARGV[5] == '0' then
    redis.call('PERSIST', KEYS[i])
  else
    redis.call('EXPIRE', KEYS[i], ARGV[5])
  end
end
return {'ok'}
