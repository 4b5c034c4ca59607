-- lease.lua: take, renew or release a run's lease, judged on the server's clock.
--
-- Key (P = store prefix, R = run id; "{R}" is the run's hash tag, so the lease lives in the
-- slot of the run's other keys, and this script touches that one slot):
--   KEYS[1]  P:run:{R}:lease   hash   owner, token, expires_at (ms since the epoch, server clock)
--   KEYS[2]  P:run:{R}:cp      list   (take only, optional) the run's checkpoint rows
--   KEYS[3]  P:run:{R}:next    hash   (with KEYS[2]) call records per segment
--   KEYS[4]  P:run:{R}:calls   hash   (with KEYS[2]) the call records themselves (only counted)
--   KEYS[5]  P:marker:{R}:<kind>  hash  (with KEYS[2], optional) a marker about the run, read as it stands
--
-- ARGV[1] what to do: "take", "renew" or "release"
-- ARGV[2] token
-- ARGV[3] ttl in ms (take, renew)
-- ARGV[4] owner (take)
--
-- Now is the server's TIME, in whole ms. A lease is live while now < expires_at; a lapsed
-- one is free, whatever the hash still says. The key is set to expire at expires_at - 1
-- (PEXPIREAT): Redis keeps a key while its clock is at or before that instant, so the key
-- exists exactly as long as the lease is live, and a plain read of it (the store's
-- `leases`) sees only live leases.
--
-- take:    free, lapsed or this token's -> written (owner and token from ARGV, expiry now +
--          ttl); another token's live lease -> left as it is and returned.
-- renew:   this token's live lease -> expiry now + ttl (owner kept); else nothing.
-- release: this token's lease -> deleted (said "released" if it was live, else "lapsed").
-- With KEYS[2] to KEYS[4], a take that wrote the lease also reads the run's head in the same
-- instant (the store's `take_lease_reading_head`): the newest checkpoint row (false if none),
-- how many records the run holds (HLEN of the calls hash: the counts hash is unsigned and
-- can be set back, the records cannot be undone without a delete), the marker's value, token
-- and expires_at (false each when KEYS[5] is not given or holds no live marker: its key
-- expires with it), and the counts hash, flattened, after the lease's four fields.
--
-- Returns:
--   {"held", owner, token, expires_at}   take, renew: the lease as it stands afterwards
--   {"held", owner, token, expires_at, newest, records, m_value, m_token, m_expires, segment, count, ...}
--                                        take with KEYS[2..4] (and KEYS[5]), written
--   {"lost"}                             renew: the token holds no live lease
--   {"released"} / {"lapsed"} / {"other"} release: deleted live / deleted lapsed / not this token's

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('HMGET', KEYS[1], 'owner', 'token', 'expires_at')
local live = held[3] and tonumber(held[3]) ~= nil and tonumber(held[3]) > now
local op, token = ARGV[1], ARGV[2]

if op == 'release' then
  if held[2] ~= token then
    return {'other'}
  end
  redis.call('DEL', KEYS[1])
  if live then
    return {'released'}
  end
  return {'lapsed'}
end

local owner
if op == 'take' then
  if live and held[2] ~= token then
    return {'held', held[1], held[2], held[3]}
  end
  owner = ARGV[4]
else
  if not live or held[2] ~= token then
    return {'lost'}
  end
  owner = held[1]
end

local expires = string.format('%.0f', now + tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'owner', owner, 'token', token, 'expires_at', expires)
redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', tonumber(expires) - 1))
if op == 'take' and KEYS[2] then
  local reply = {'held', owner, token, expires, redis.call('LINDEX', KEYS[2], -1), redis.call('HLEN', KEYS[4])}
  local marker = {false, false, false}
  if KEYS[5] then
    marker = redis.call('HMGET', KEYS[5], 'owner', 'token', 'expires_at')
  end
  for _, part in ipairs(marker) do
    reply[#reply + 1] = part
  end
  for _, part in ipairs(redis.call('HGETALL', KEYS[3])) do
    reply[#reply + 1] = part
  end
  return reply
end
return {'held', owner, token, expires}
