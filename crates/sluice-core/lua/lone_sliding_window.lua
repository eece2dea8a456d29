-- lone_sliding_window.lua: a hit on a descriptor with one sliding window and nothing else to write, in the fewest
-- Redis commands and arguments: the HMGET of the window's counts, the HSET and PEXPIRE that count the hit when it fits
-- and costs something, four or five arguments, and two integers back. The decision itself (what is left, when to
-- retry) is made by sluice from those counts, exactly as sliding_window.lua's check would make it; the differential
-- test holds the two paths to the same answers.
--
-- Its key is the counter's (the same hash {w, c, p} as sliding_window.lua's); its arguments (batch.lua reads them):
-- the window, the limit, the cost (bounded by the limit + 1) and the decision's time `now`.
--
-- Returns { c, p }: the counts of the current window and of the previous one the hit found.

local function lone_sliding_window(key, window, limit, cost, now)
  local start = now - now % window
  local f = redis.call('HMGET', key, 'w', 'c', 'p')
  local w, c, p = tonumber(f[1]), tonumber(f[2]) or 0, tonumber(f[3]) or 0
  if w == start then
    -- same window
  elseif w == start - window then
    p, c = c, 0
  else
    p, c = 0, 0
  end
  if cost > 0 and cost <= limit then
    local est = math.floor(p * (window - (now - start)) / window) + c
    if est + cost <= limit then
      redis.call('HSET', key, 'w', start, 'c', string.format('%d', math.min(c + cost, MAX_SLIDING_COUNT)), 'p',
        string.format('%d', p))
      redis.call('PEXPIRE', key, ceil_ms(start + 2 * window - now))
    end
  end
  return { c, p }
end
