-- relist.lua: rebuild a run's listing entry from its newest checkpoint row, rows untouched.
--
-- Key layout (P = store prefix, R = run id; "{R}" is the hash tag, so all four keys of a
-- run live in one Redis Cluster slot):
--   KEYS[1]  P:run:{R}:cp       list    checkpoint rows; list index = step
--   KEYS[2]  P:run:{R}:latest   hash    step, flow, status, segment, saved_at of the newest row
--   KEYS[3]  P:run:{R}:calls    hash    "<segment>:<seq>" -> call-record row
--   KEYS[4]  P:run:{R}:next     hash    "<segment>" -> number of records in that segment
-- On a standalone server (not Cluster) the indexes of the row's flow come too, as in save.lua:
--   KEYS[5]  P:runs             zset    run id -> saved_at
--   KEYS[6]  P:runs:<flow>      zset    run id -> saved_at
--   KEYS[7]  P:unfinished:<flow> zset   run id -> when its keys expire (+inf while paused)
--
-- ARGV[1] the newest checkpoint row as the caller read it (bytes)
-- ARGV[2] step      ARGV[3] flow      ARGV[4] status     ARGV[5] segment
-- ARGV[6] saved_at  (ARGV[2..6] are the fields in clear of that row's header)
-- ARGV[7] ttl in seconds; "0" means the run's keys never expire
-- ARGV[8] run id
--
-- The script never decodes a row: it only checks that the list still ends with the row the
-- caller read (else the caller reads it again) and that the list holds exactly step + 1 rows,
-- the shape save.lua insists on. Then, when the latest hash and (standalone) the index
-- entries already say what save.lua would have written for that row, nothing is touched.
-- Otherwise they are written as save.lua writes them, with its expiry rule: every key of the
-- run expires ttl seconds from now, except while the run is paused, when its keys are made
-- persistent. No checkpoint or call row is written.
--
-- Returns:
--   {"gone"}             the run has no checkpoint row
--   {"moved"}            the list no longer ends with ARGV[1] (a save or a delete came between)
--   {"corrupt", rows}    the list holds `rows` rows, not step + 1
--   {"same"}             the entry already matched; nothing was written
--   {"relisted"}         the entry was written

local rows = redis.call('LLEN', KEYS[1])
if rows == 0 then
  return {'gone'}
end
if redis.call('LINDEX', KEYS[1], -1) ~= ARGV[1] then
  return {'moved'}
end
if rows ~= tonumber(ARGV[2]) + 1 then
  return {'corrupt', tostring(rows)}
end

local unfinished = ARGV[4] == 'running' or ARGV[4] == 'paused'
local last = redis.call('HMGET', KEYS[2], 'step', 'flow', 'status', 'segment', 'saved_at')
local same = tonumber(last[1]) == tonumber(ARGV[2]) and last[2] == ARGV[3] and last[3] == ARGV[4]
  and tonumber(last[4]) == tonumber(ARGV[5]) and tonumber(last[5]) == tonumber(ARGV[6])
if same and #KEYS == 7 then
  same = tonumber(redis.call('ZSCORE', KEYS[5], ARGV[8])) == tonumber(ARGV[6])
    and tonumber(redis.call('ZSCORE', KEYS[6], ARGV[8])) == tonumber(ARGV[6])
    and (redis.call('ZSCORE', KEYS[7], ARGV[8]) ~= false) == unfinished
end
if same then
  return {'same'}
end

redis.call('HSET', KEYS[2], 'step', ARGV[2], 'flow', ARGV[3], 'status', ARGV[4],
  'segment', ARGV[5], 'saved_at', ARGV[6])

if #KEYS == 7 then
  redis.call('ZADD', KEYS[5], ARGV[6], ARGV[8])
  redis.call('ZADD', KEYS[6], ARGV[6], ARGV[8])
  if unfinished then
    local expires = '+inf'
    if ARGV[4] ~= 'paused' and ARGV[7] ~= '0' then
      local t = redis.call('TIME')
      expires = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[7])
    end
    redis.call('ZADD', KEYS[7], expires, ARGV[8])
  else
    redis.call('ZREM', KEYS[7], ARGV[8])
  end
end

for i = 1, 4 do
  if ARGV[4] == 'paused' or ARGV[7] == '0' then
    redis.call('PERSIST', KEYS[i])
  else
    redis.call('EXPIRE', KEYS[i], ARGV[7])
  end
end
return {'relisted'}
