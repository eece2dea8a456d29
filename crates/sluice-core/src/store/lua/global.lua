-- global.lua: a fixed or sliding window counted in every region (`global: true`; see `regions.rs`).
--
-- Each region counts its own hits in the window keys its algorithm keeps (fixed_window.lua, sliding_window.lua), and
-- learns what the others counted from what they ship: a hash per window, `<window key>@regions`, one field per other
-- region holding that region's own count of the window (written by merge.lua, the larger count kept). A global tier
-- is its algorithm decided against the limit less what the other regions counted, so that it admits a hit only when
-- the sum of every region's count, as known here, leaves room for it:
--   fixed window    others = sum of the regions' counts of the current window
--   sliding window  others = the weighted estimate over the regions' counts of the current and previous windows
-- The tier reports `used` as that sum (this region's count + others); `remaining` is what the sum leaves. A global
-- tier counts no denial (decide.lua never counts one for it), and its retry time is its own window's: the regions'
-- counts that expire with it are not known here beyond what was shipped. A lone global tier's ordinary hit takes
-- compact_global.lua instead, which decides as this does.
-- Invariants: reads the regions' hashes, never writes them; this region's keys are written as the algorithm's own.

local REGIONS_SUFFIX = '@regions'

-- What the other regions counted in the window whose key is `wkey`: the sum of the hash's values.
local function regions_count(wkey)
  local n, all = 0, redis.call('HGETALL', wkey .. REGIONS_SUFFIX)
  for i = 2, #all, 2 do n = n + (tonumber(all[i]) or 0) end
  return n
end

-- The loader of the global form of the algorithm `name`, whose other regions' count at `now` is `others(...)`.
local function global_of(name, others)
  return function()
    local a = algorithm(name)
    local M = { commit = a.commit, refund = a.refund }
    function M.check(key, now, cost, limit, window, burst, force)
      local start = now - now % window
      local o = others(key, start, now, window)
      local s = a.check(key, now, cost, max0(limit - o), window, burst, force)
      s.used0, s.used = s.used0 + o, s.used + o
      -- A cost that fits the limit fits again once the window has passed, whatever the others counted.
      if s.retry == -1 and cost <= limit then s.retry = start + window - now end
      return s
    end
    return M
  end
end

L['global:fixed_window'] = global_of('fixed_window', function(key, start, _, window)
  return regions_count(window_of(key, start, window))
end)

L['global:sliding_window'] = global_of('sliding_window', function(key, start, now, window)
  local cur, prev = sw_keys(key, start, window)
  return sw_estimate(regions_count(prev), regions_count(cur), now - start, window)
end)
