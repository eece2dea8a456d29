-- bucketed_window.lua: a window of `window` us split into `burst` epoch-aligned sub-windows of `window / burst` us
-- each; a window's count is the sum of the sub-windows it spans, the current one included, so it is exact to one
-- sub-window (a sub-window stops counting `window` after it starts).
--
-- State: one integer string per sub-window, `<key>:<start>` (`start` its first microsecond, a decimal integer),
-- counted with INCRBY. sluice names the counter by the sub-window's length, so several tiers of one descriptor with
-- the same sub-window (1 000 a second, 5 000 per 10 s, 7 000 per 15 s) read the same counts and share them: within
-- one decision (decide.lua numbers them, `decision`) a counter is incremented once, by the first of its tiers, and
-- each tier makes sure the sub-window's key lives until its window no longer counts it.
-- Invariants: a cost of 0 writes nothing; a sub-window's key lives at least until the longest window of its tiers
-- stops counting it, so its TTL never changes an answer. Forced hits and settlements never reach it (it is not one of
-- the counting algorithms).

-- Per counter written in this call: the decision that wrote it, and the TTL (ms) it was given there.
local bucket_written = {}

function L.bucketed_window()
  local M = {}

  -- The counts of the sub-windows the window spans at `now`, oldest first, and the current one's start.
  local function counts(key, now, window, buckets)
    local width = math.floor(window / buckets)
    if width < 1 then width = 1 end
    local current = now - now % width
    local c = {}
    for back = buckets - 1, 0, -1 do
      local start = current - back * width
      local n = 0
      if start >= 0 then n = tonumber(redis.call('GET', key .. ':' .. string.format('%d', start))) or 0 end
      c[#c + 1] = n
    end
    return c, current, width
  end

  function M.check(key, now, cost, limit, window, burst)
    local c, current, width = counts(key, now, window, burst)
    local n = 0
    for i = 1, #c do n = n + c[i] end
    local ok = n + cost <= limit
    local last = #c
    local function leaves(i) return max0(current - (last - i) * width + window - now) end
    local reset0 = 0
    for i = last, 1, -1 do
      if c[i] > 0 then reset0 = leaves(i); break end
    end
    local retry = 0
    if cost > limit then
      retry = -1
    elseif not ok then
      retry = max0(current + window - now)
      local left = n
      for i = 1, last do
        left = left - math.min(c[i], left)
        if left + cost <= limit then retry = leaves(i); break end
      end
    end
    local reset1 = reset0
    if cost > 0 then reset1 = max0(current + window - now) end
    return {
      ok = ok, used0 = n, used = n + cost, rem0 = max0(limit - n), rem1 = max0(limit - n - cost),
      reset0 = reset0, reset1 = reset1, retry = retry, current = current,
    }
  end

  function M.commit(key, s, now, cost, limit, window)
    local skey = key .. ':' .. string.format('%d', s.current)
    local ttl = ceil_ms(s.current + window - now)
    local seen = bucket_written[skey]
    if seen == nil or seen[1] ~= decision then
      redis.call('INCRBY', skey, string.format('%d', cost))
      redis.call('PEXPIRE', skey, ttl)
      bucket_written[skey] = { decision, ttl }
    elseif ttl > seen[2] then
      redis.call('PEXPIRE', skey, ttl)
      seen[2] = ttl
    end
    return ''
  end

  return M
end
