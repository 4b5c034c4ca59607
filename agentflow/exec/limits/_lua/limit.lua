-- limit.lua: take, renew or release a slot of a shared limit, or close the limit; on the server's clock.
--
-- Keys (P = the backend's prefix, L = the limit's name, K = the tenant key; "{L/K}" is the
-- hash tag, so the three keys of one limit and key live in one slot of a Redis Cluster):
--   KEYS[1]  P:limit:{L/K}:held    zset   holder token -> when its slot lapses (ms, server clock)
--   KEYS[2]  P:limit:{L/K}:starts  zset   start token  -> when it started (ms)
--   KEYS[3]  P:limit:{L/K}:closed  string until when a 429 closed the limit (ms)
--
-- ARGV[1] what to do: "take", "start", "renew", "release" or "close"
-- ARGV[2] token (take, start, renew, release)
-- ARGV[3] concurrency (0: none)          ARGV[4] hold in ms
-- ARGV[5] rate (0: none)                 ARGV[6] the rate's window in ms
-- ARGV[7] close: for how long, in ms
--
-- Now is the server's TIME in ms. A holder whose time has passed is gone (a killed process's
-- slot comes back by itself); a start older than the window no longer counts. Each key is
-- set to expire when nothing in it counts any more, so an idle limit leaves nothing behind.
--
-- take: closed -> {"closed", ms left}; every slot held -> {"concurrency", ms until the
--       oldest hold lapses}; the window full -> {"rate", ms until its oldest start leaves
--       it}; else the slot and the start are taken together -> {"taken", 0}.
-- renew: the token's live slot -> {"held", 0} (held another hold); else {"lost", 0}.
-- start: the token's start, if it still counts, is stamped now -> {"started", 0}.
-- release: the token's slot is deleted -> {"released", 0} (its start still counts).
-- close: closed until max(now + ms, an existing back-off) -> {"closed", ms left}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op, token = ARGV[1], ARGV[2]
local conc, hold = tonumber(ARGV[3]), tonumber(ARGV[4])
local rate, window = tonumber(ARGV[5]), tonumber(ARGV[6])

if op == 'release' then
  redis.call('ZREM', KEYS[1], token)
  return {'released', 0}
end

if op == 'start' then
  local began = tonumber(redis.call('ZSCORE', KEYS[2], token))
  if rate > 0 and began ~= nil and began > now - window then
    redis.call('ZADD', KEYS[2], 'XX', now, token)
    redis.call('PEXPIRE', KEYS[2], window)
  end
  return {'started', 0}
end

if op == 'renew' then
  local ends = tonumber(redis.call('ZSCORE', KEYS[1], token))
  if ends == nil or ends <= now then
    return {'lost', 0}
  end
  redis.call('ZADD', KEYS[1], now + hold, token)
  redis.call('PEXPIRE', KEYS[1], hold)
  return {'held', 0}
end

local closed = tonumber(redis.call('GET', KEYS[3]))
if op == 'close' then
  local untl = now + tonumber(ARGV[7])
  if closed ~= nil and closed > untl then
    untl = closed
  end
  redis.call('SET', KEYS[3], string.format('%.0f', untl), 'PX', math.max(1, untl - now))
  return {'closed', untl - now}
end

-- take
if closed ~= nil and closed > now then
  return {'closed', closed - now}
end
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= conc then
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {'concurrency', tonumber(oldest[2]) - now}
  end
end
if rate > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
  if redis.call('ZCARD', KEYS[2]) >= rate then
    local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return {'rate', tonumber(oldest[2]) + window - now}
  end
end
if conc > 0 then
  redis.call('ZADD', KEYS[1], now + hold, token)
  redis.call('PEXPIRE', KEYS[1], hold)
end
if rate > 0 then
  redis.call('ZADD', KEYS[2], now, token)
  redis.call('PEXPIRE', KEYS[2], window)
end
return {'taken', 0}
