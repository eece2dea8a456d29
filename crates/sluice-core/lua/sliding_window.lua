-- sliding_window.lua: the two-window weighted counter. The count at time t is
--   floor(p * (window - elapsed) / window) + c
-- where c counts the hits of the current epoch-aligned window, p those of the previous one, and elapsed is t minus
-- the current window's start. It assumes the previous window's hits were spread evenly; the error bound is in the
-- README.
--
-- State: a hash {w = current window start, c, p}. It expires two windows after w, when it no longer matters.
-- Invariants: a denied hit writes nothing, unless it is forced (then c may pass the limit, up to MAX_SLIDING_COUNT);
-- a cost of 0 writes nothing. A settlement's refund lowers the count of the window the reservation was counted in
-- (the current or the previous one), never below 0, and keeps the key's expiry.

local function sw_estimate(p, c, elapsed, window)
  return math.floor(p * (window - elapsed) / window) + c
end

-- The counts of the current window (starting at `start`) and of the previous one, from a hash {w, c, p}: its own if
-- it is of this window, its current count as the previous one if it is of the window before, else nothing.
local function sw_counts(w, c, p, start, window)
  if w == start then return c, p end
  if w == start - window then return 0, c end
  return 0, 0
end

function L.sliding_window()
  local M = {}

  -- The first offset e in [lo, hi) of a window where the estimate with (p, c) is at most `need`, or nil. The estimate
  -- never grows with e, so a binary search finds it exactly.
  local function sw_first_fit(p, c, window, lo, hi, need)
    if lo >= hi or sw_estimate(p, c, hi - 1, window) > need then return nil end
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if sw_estimate(p, c, mid, window) <= need then hi = mid else lo = mid + 1 end
    end
    return lo
  end

  function M.check(key, now, cost, limit, window)
    local start = now - now % window
    local f = redis.call('HMGET', key, 'w', 'c', 'p')
    local c, p = sw_counts(tonumber(f[1]), tonumber(f[2]) or 0, tonumber(f[3]) or 0, start, window)
    local elapsed = now - start
    local est = sw_estimate(p, c, elapsed, window)
    local s = { start = start, c = c, p = p, used0 = est, used = est + cost }
    s.ok = est + cost <= limit
    s.rem0 = max0(limit - est)
    s.rem1 = max0(limit - est - cost)
    local function until_empty(cc, pp)
      if cc > 0 then return start + 2 * window - now end
      if pp > 0 then return start + window - now end
      return 0
    end
    s.reset0 = until_empty(c, p)
    s.reset1 = until_empty(c + cost, p)
    if cost > limit then
      s.retry = -1
    elseif s.ok then
      s.retry = 0
    else
      local e = sw_first_fit(p, c, window, elapsed, window, limit - cost)
      if e ~= nil then
        s.retry = e - elapsed
      else
        e = sw_first_fit(c, 0, window, 0, window, limit - cost)
        if e ~= nil then s.retry = window - elapsed + e else s.retry = 2 * window - elapsed end
      end
    end
    return s
  end

  function M.commit(key, s, now, cost, limit, window)
    if cost == 0 then return '' end
    local c = math.min(s.c + cost, MAX_SLIDING_COUNT)
    redis.call('HSET', key, 'w', s.start, 'c', string.format('%d', c), 'p', string.format('%d', s.p))
    redis.call('PEXPIRE', key, ceil_ms(s.start + 2 * window - now))
    return ''
  end

  -- Gives back up to `amount` (down to 0) of the count the hit at `at` went into: the current window's if it was
  -- counted in the current window, the previous window's if in that one (which the hash holds as c while it has not
  -- rolled over, as p after). The key keeps its expiry.
  function M.refund(key, now, at, amount, limit, window)
    local start = now - now % window
    local from = at - at % window
    local f = redis.call('HMGET', key, 'w', 'c', 'p')
    local w = tonumber(f[1])
    local field, i
    if w == nil then
      return nil
    elseif from == start and w == start then
      field, i = 'c', 2
    elseif from == start - window and w == start then
      field, i = 'p', 3
    elseif from == start - window and w == from then
      field, i = 'c', 2
    else
      return nil
    end
    local n = tonumber(f[i]) or 0
    local given = math.min(n, amount)
    return given, function() redis.call('HSET', key, field, string.format('%d', n - given)) end
  end
  return M
end
