-- read_events.lua: a run's packed rows and the stream's entries after a cursor, read at one instant.
--
-- Key layout (P = store prefix, R = run id; "{R}" is the run's hash tag):
--   KEYS[1]  P:run:{R}:events   stream  entries since the run's events were last packed
--   KEYS[2]  P:run:{R}:packed   string  the rows packed before (compact_events.lua)
--
-- ARGV[1] the XRANGE start: "-", or "(<cursor>" for the entries after a cursor
-- ARGV[2] the most entries to return
--
-- The packed value comes whole (a few KiB for a finished run); the reader keeps its rows
-- after the cursor. Every packed row's id is before every entry the stream holds.
--
-- Returns: {the packed value or false, the XRANGE reply}

return {redis.call('GET', KEYS[2]), redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])}
