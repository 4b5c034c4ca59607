-- newest.lua: functions the retention scripts share; the store puts this file before each of
-- them (prune_run.lua, trim_run.lua) when it loads them, as one script.

-- The header of the list's last row, decoded (nil when it is not a row header).
local function newest_head(cp)
  local row = redis.call('LINDEX', cp, -1)
  if not row then
    return nil
  end
  local ok, head = pcall(cjson.decode, string.match(row, '^[^\n]*'))
  if ok and type(head) == 'table' then
    return head
  end
  return nil
end

-- Whether the list's last row is at `step` (the list holds step + 1 rows, as save.lua keeps
-- it) and its header names that step and the signature `sig`.
local function newest_is(cp, step, sig)
  if redis.call('LLEN', cp) ~= tonumber(step) + 1 then
    return false
  end
  local head = newest_head(cp)
  return head ~= nil and tonumber(head[3]) == tonumber(step) and head[9] == sig
end

-- What the run's call log (the calls hash, "<segment>:<seq>" -> row) holds beyond the row
-- judged, or nil when nothing (`rules.beyond_judged`, which words the reply):
--   segment   the judged row's segment (signed, from the caller; "" to read the last row's
--             header, the stored row itself)
--   accounted "" (the caller knows no count: segments are compared only) or a JSON array
--             of [segment, count] pairs: the records the judged row accounts for
-- Returns {row segment, segment found, its records, what the row accounts for of it (-1: a
-- segment newer than the row's)}. A field that names no segment counts as a record past
-- every segment: it is not a record this store wrote, and the run is left.
local function beyond(cp, calls, segment, accounted)
  local mine = tonumber(segment)
  if not mine then
    local head = newest_head(cp)
    mine = head and tonumber(head[6]) or -1
  end
  local counts = {}
  local odd = 0
  for _, field in ipairs(redis.call('HKEYS', calls)) do
    local s = tonumber(string.match(field, '^(%d+):%d+$'))
    if s then
      counts[s] = (counts[s] or 0) + 1
    else
      odd = odd + 1
    end
  end
  local ahead = nil
  for s, _ in pairs(counts) do
    if s > mine and (ahead == nil or s < ahead) then
      ahead = s
    end
  end
  if ahead then
    return {mine, ahead, counts[ahead], -1}
  end
  if odd > 0 then
    return {mine, mine + 1, odd, -1}
  end
  if accounted == '' then
    return nil
  end
  local known = {}
  for _, pair in ipairs(cjson.decode(accounted)) do
    known[tonumber(pair[1])] = tonumber(pair[2])
  end
  local first = nil
  for s, n in pairs(counts) do
    if s >= mine and n > (known[s] or 0) and (first == nil or s < first) then
      first = s
    end
  end
  if first then
    return {mine, first, counts[first], known[first] or 0}
  end
  return nil
end

-- Whether one of the markers KEYS[from .. from + n - 1] exists: a marker's key expires when
-- it lapses (as a lease's), so its existence is a live marker (a cancel request waiting).
local function live_marker(from, n)
  for i = from, from + n - 1 do
    if redis.call('EXISTS', KEYS[i]) == 1 then
      return true
    end
  end
  return false
end
