-- sliding_window.lua: the two-window weighted counter. The count at time t is
--   floor(p * (window - elapsed) / window) + c
-- where c counts the current epoch-aligned window's hits, p the previous one's, and elapsed is t minus the current
-- window's start. It assumes the previous window's hits were spread evenly; the error bound is in the README.
-- State: three numbers in the descriptor's packed state (decide.lua): the first microsecond of the window counted
-- last, its count and the one before's. Read a window later, the count is the previous one's.
-- Invariants: a denied hit writes nothing unless forced (then c may pass the limit, up to MAX_SLIDING_COUNT); a cost
-- of 0 writes nothing. A settlement's refund lowers the count of the window the reservation was counted in (the
-- current or the previous), never below 0.

local function sw_estimate(p, c, elapsed, window)
  return floor(p * (window - elapsed) / window) + c
end

function L.sliding_window()
  local M = { width = 2, slots = 3 }

  -- The counts of the window `now` is in and of the one before it (c, p), from the state at P[p].
  local function counts(p, now, window)
    local start = now - now % window
    if P[p] == start then return P[p + 1], P[p + 2] end
    if P[p] == start - window then return 0, P[p + 1] end
    return 0, 0
  end

  -- Sees the counts of the current and the previous window (prelude.lua's interface).
  function M.check(p, now, cost, limit, window)
    local c, q = counts(p, now, window)
    return sw_estimate(q, c, now % window, window) + cost <= limit, c, q, -1
  end

  function M.left(c, q, _, now, limit, window)
    return max0(limit - sw_estimate(q, c, now % window, window))
  end

  local function store(p, now, window, c, q)
    P[p], P[p + 1], P[p + 2] = now - now % window, c, q
  end

  -- Returns the time until the count leaves the estimate.
  function M.commit(p, now, cost, _, window)
    local c, q = counts(p, now, window)
    store(p, now, window, min(c + cost, MAX_SLIDING_COUNT), q)
    return '', 2 * window - now % window
  end

  -- How long the state matters: until the last window that counted anything leaves the estimate.
  function M.lives(p, now, window)
    local c, q = counts(p, now, window)
    if c > 0 then return 2 * window - now % window end
    if q > 0 then return window - now % window end
    return 0
  end

  function M.refund(p, now, at, amount, _, window)
    local start = now - now % window
    local from = at - at % window
    local c, q = counts(p, now, window)
    if from == start and c > 0 then
      local given = min(c, amount)
      return given, function() store(p, now, window, c - given, q) end
    end
    if from == start - window and q > 0 then
      local given = min(q, amount)
      return given, function() store(p, now, window, c, q - given) end
    end
    return nil
  end

  return M
end

-- The global form (prelude.lua's global_of): the others' count is the weighted estimate over the hashes named after
-- its two keys, the current and previous windows' (names sluice sends for the windows its clock expects).
L['global:sliding_window'] = global_of('sliding_window', 2, function(j, now, window)
  local cur = window_at(K[j], now, window)
  local prev = K[j + 1]
  if cur ~= K[j] then prev = window_of(K[j], now - now % window - window, window) end
  return sw_estimate(regions_count(prev), regions_count(cur), now % window, window)
end)
