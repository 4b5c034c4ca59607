-- unfinished.lua: list a flow's unfinished runs on a standalone server (not Cluster).
--
-- On one server save.lua keeps the index exact, in the same atomic step as each save, and
-- scores each entry with the time (server clock, seconds) at which the run's keys expire:
-- "+inf" while the run is paused or when runs never expire. An entry whose time passed
-- names a run Redis has expired; it is dropped here.
--
--   KEYS[1]  P:unfinished:<flow>   zset   run id -> expiry time of the run's keys
--
-- Returns: the run ids, soonest expiry first.

local t = redis.call('TIME')
local now = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
return redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf')
