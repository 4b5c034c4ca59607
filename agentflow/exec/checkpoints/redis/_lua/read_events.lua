-- read_events.lua: a run's packed rows and the stream's entries after a cursor, read at one instant.
--
-- Key layout (P = store prefix, R = run id; "{R}" is the run's hash tag):
--   KEYS[1]  P:run:{R}:events   stream  entries since the run's events were last packed
--   KEYS[2]  P:run:{R}:packed   string  the rows packed before (compact_events.lua)
--
-- ARGV[1] the XRANGE start: "-", or "(<cursor>" for the entries after a cursor
-- ARGV[2] the most entries to return
-- ARGV[3] the longest packed value the reader takes (bytes)
--
-- The packed value comes whole (a few KiB for a finished run); the reader keeps its rows
-- after the cursor. Every packed row's id is before every entry the stream holds. A packed
-- value longer than ARGV[3] is not one the store wrote: its length comes instead of it (an
-- integer), so nothing of it is sent or inflated.
--
-- Returns: {the packed value, its length when it is too long, or false; the XRANGE reply}

local size = redis.call('STRLEN', KEYS[2])
local packed = false
if size > tonumber(ARGV[3]) then
  packed = size
elseif size > 0 then
  packed = redis.call('GET', KEYS[2])
end
return {packed, redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])}
