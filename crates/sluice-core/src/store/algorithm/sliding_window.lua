-- sliding_window.lua: the two-window weighted counter. The count at time t is
--   floor(p * (window - elapsed) / window) + c
-- where c counts the hits of the current epoch-aligned window, p those of the previous one, and elapsed is t minus
-- the current window's start. It assumes the previous window's hits were spread evenly; the error bound is in the
-- README.
--
-- State: one integer string per window, `<key>:<window>` as a fixed window keeps it (prelude.lua's `window_key`: the
-- window's number in hex), read with a GET beside the
-- previous window's and counted with INCRBY (SET with its expiry on the window's first count). A window's key is read as the previous one all through the next window,
-- so it expires a second after that.
-- Invariants: a denied hit writes nothing, unless it is forced (then c may pass the limit, up to MAX_SLIDING_COUNT);
-- a cost of 0 writes nothing. A settlement's refund lowers the count of the window the reservation was counted in
-- (the current or the previous one), never below 0, and keeps the key's expiry.

local function sw_estimate(p, c, elapsed, window)
  return math.floor(p * (window - elapsed) / window) + c
end

-- The keys of the counter `base`'s window starting at `start` and of the one before.
local function sw_keys(base, start, window)
  return window_key(base, start, window), window_key(base, start - window, window)
end

-- The counter whose windows starting at `start` and before have the keys `cur` and `prev`: their counts (c, p), and
-- whether each key is missing (fresh, pfresh). Two GETs cost Redis less than one MGET's table.
local function sw_read(cur, prev, start)
  local c, p = tonumber(redis.call('GET', cur)), tonumber(redis.call('GET', prev))
  return { start = start, cur = cur, prev = prev, c = c or 0, p = p or 0, fresh = c == nil, pfresh = p == nil }
end

-- Counts `cost` in the current window of the counter `s` read (at most up to MAX_SLIDING_COUNT); `text`, if given,
-- is the cost as the script's arguments spelled it (Redis takes a string for less than a number).
local function sw_add(s, cost, now, window, text)
  local c = s.c + cost
  if c > MAX_SLIDING_COUNT then c = MAX_SLIDING_COUNT end
  if s.fresh then
    redis.call('SET', s.cur, string.format('%d', c), 'PX', ceil_ms(s.start + 2 * window - now + WINDOW_KEY_GRACE_US))
    s.fresh = false
  elseif c == s.c + cost then
    redis.call('INCRBY', s.cur, text or cost)
  else
    redis.call('SET', s.cur, string.format('%d', c), 'KEEPTTL')
  end
  s.c = c
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
    local cur, prev = sw_keys(key, start, window)
    local read = sw_read(cur, prev, start)
    local c, p = read.c, read.p
    local elapsed = now - start
    local est = sw_estimate(p, c, elapsed, window)
    local s = { read = read, used0 = est, used = est + cost }
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
    if cost > 0 then sw_add(s.read, cost, now, window) end
    return ''
  end

  -- Gives back up to `amount` (down to 0) of the count the hit at `at` went into: the current window's or the
  -- previous one's. The key keeps its expiry.
  function M.refund(key, now, at, amount, limit, window)
    local start = now - now % window
    local from = at - at % window
    if from ~= start and from ~= start - window then return nil end
    local cur, prev = sw_keys(key, start, window)
    local s = sw_read(cur, prev, start)
    local n, target = s.c, s.cur
    if from ~= start then n, target = s.p, s.prev end
    if n == 0 then return nil end
    local given = math.min(n, amount)
    return given, function()
      redis.call('SET', target, string.format('%d', n - given), 'KEEPTTL')
    end
  end
  return M
end
