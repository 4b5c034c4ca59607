-- lease_move.lua: what save.lua and record_call.lua share when their write also moves the
-- run's lease (`LeaseMoving`); the store puts this file before each of them when it loads
-- them, as one script.
--
-- A write that moves the lease names the lease key as its script's last KEY, and the move
-- as four values after the script's own ARGV: the bearer's token, the token that holds the
-- lease afterwards ('' gives it up), that holder's owner name, and the lease's ttl in ms.
-- The lease is judged and written as lease.lua judges and writes it (the server's TIME;
-- the key expires the millisecond before the lease lapses).

-- The live lease of another token than `bearer`, as {'held', owner, token, expires_at}:
-- the write must not happen. nil: the lease is free, lapsed or the bearer's.
local function lease_refusal(key, bearer)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local held = redis.call('HMGET', key, 'owner', 'token', 'expires_at')
  local live = held[3] and tonumber(held[3]) ~= nil and tonumber(held[3]) > now
  if live and held[2] ~= bearer then
    return {'held', held[1], held[2], held[3]}
  end
  return nil
end

-- Write the lease for token `to` (owner, now + ttl_ms), or delete it when `to` is ''.
local function lease_apply(key, to, owner, ttl_ms)
  if to == '' then
    redis.call('DEL', key)
    return
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local expires = string.format('%.0f', now + tonumber(ttl_ms))
  redis.call('HSET', key, 'owner', owner, 'token', to, 'expires_at', expires)
  redis.call('PEXPIREAT', key, string.format('%.0f', tonumber(expires) - 1))
end
