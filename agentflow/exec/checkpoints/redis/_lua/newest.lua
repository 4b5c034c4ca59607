-- newest.lua: a function the retention scripts share; the store puts this file before each of
-- them (prune_run.lua, trim_run.lua) when it loads them, as one script.
--
-- Whether the list's last row is at `step` (the list holds step + 1 rows, as save.lua keeps
-- it) and its header names that step and the signature `sig`.
local function newest_is(cp, step, sig)
  if redis.call('LLEN', cp) ~= tonumber(step) + 1 then
    return false
  end
