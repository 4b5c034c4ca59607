-- compact_events.lua: pack a run's event stream into its packed key, unless either changed since read.
--
-- Key layout (P = store prefix, R = run id; "{R}" is the run's hash tag):
--   KEYS[1]  P:run:{R}:events   stream  the run's entries since it was last packed (field "e": a row)
--   KEYS[2]  P:run:{R}:packed   string  the rows packed before, and each one's id, compressed
--
-- ARGV[1] how many entries the stream held when the client read it (XLEN)
-- ARGV[2] the id of its first entry then
-- ARGV[3] the id of its last entry then
-- ARGV[4] how long the packed value was then (0: none)
-- ARGV[5] the new packed value: the rows packed before, then the stream's, compressed by the client
--
-- Entries are only ever added at the end of the stream (or trimmed from its start), so when
-- it still holds the same count between the same first and last ids, and the packed value
-- is as long as it was, nothing changed since the read; anything else leaves both alone.
-- The stream is emptied, not deleted (XTRIM to 0 keeps the last id it gave): an append
-- after this (a retried run's) is given an id after every packed one. Both keys expire as
-- the stream did. One script: a reader (read_events.lua) sees the rows in the stream or in
-- the packed value, never in neither.
--
-- Returns: 1 when the stream was packed, 0 when it had changed

if redis.call('XLEN', KEYS[1]) ~= tonumber(ARGV[1]) or redis.call('STRLEN', KEYS[2]) ~= tonumber(ARGV[4]) then
  return 0
end
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #first == 0 or first[1][1] ~= ARGV[2] or last[1][1] ~= ARGV[3] then
  return 0
end
local ttl = redis.call('PTTL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[5])
redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return 1
