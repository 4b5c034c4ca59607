-- append_events.lua: append events to a run's stream, bounded, expiring with the run.
--
-- Key layout (P = store prefix, R = run id; "{R}" is the hash tag, so both keys live in
-- the run's Redis Cluster slot):
--   KEYS[1]  P:run:{R}:events   stream  one entry per event, field "e" = the encoded row
--   KEYS[2]  P:run:{R}:latest   hash    the run's newest checkpoint (read for its TTL only)
--
-- ARGV[1] the store's ttl_s (0: keys never expire)
-- ARGV[2] how many entries to keep (trimmed with MAXLEN ~: a few more may stay)
-- ARGV[3..] the encoded event rows, in order
--
-- Each XADD takes the next stream id ("*"): the ids are the cursors, in append order.
-- The stream then expires as the run's other keys do: when the latest hash has no expiry
-- (a paused run), the stream loses its own; otherwise it expires ttl_s from now.
--
-- Returns: the id of the last entry added

local last = ''
for i = 3, #ARGV do
  last = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'e', ARGV[i])
end
local ttl = tonumber(ARGV[1])
if redis.call('TTL', KEYS[2]) == -1 or ttl == 0 then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('EXPIRE', KEYS[1], ttl)
end
return last
