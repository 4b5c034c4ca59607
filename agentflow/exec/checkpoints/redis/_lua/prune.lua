-- prune.lua: remove stale members from one run index, unless they were re-added meanwhile.
--
-- Index keys (P = store prefix; not in any run's hash slot, so this script touches
-- exactly one of them per call, which is always allowed on Redis Cluster):
--   P:runs                  sorted set   run id -> saved_at of its newest save (every flow)
--   P:runs:<flow>           sorted set   run id -> saved_at of its newest save
--   P:unfinished:<flow>     sorted set   run id -> saved_at; runs last saved running or paused
--
-- KEYS[1]  the index
-- ARGV     pairs: run id, the score the caller read with it
--
-- A member is removed only if its score is still the one the caller read: a saver that
-- re-added the run after the caller's check changed the score, and keeps its entry.
--
-- Returns the number of members removed.

local removed = 0
for i = 1, #ARGV, 2 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[i + 1]) then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return removed
