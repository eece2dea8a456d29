-- lone_sliding_window.lua: a hit on a descriptor with one sliding window and nothing else to write, in the fewest
-- Redis commands and arguments: four or five arguments and two integers back. The decision itself (what is left,
-- when to retry) is made by sluice from those counts, exactly as sliding_window.lua's check would make it; the
-- differential test holds the two paths to the same answers.
--
-- Its key is the counter's (the same hash {w, c, p} as sliding_window.lua's); its arguments (batch.lua reads them):
-- the window, the limit, the cost (bounded by the limit + 1) and the decision's time `now`.
--
-- Returns { c, p }: the counts of the current window and of the previous one the hit found.
--
-- As a lone bucket, a counter that several lone calls of one script call hit is read once and written once
-- (lone_bucket.lua).

-- Per counter read in this call: { w, c, p } as stored, then as the hits so far leave it.
local sliding_states = {}
-- Per counter to write: the time of the last hit that counted in it, and the descriptors whose hits did.
local sliding_writes, sliding_movers = {}, {}

local function lone_sliding_window(key, window, limit, cost, now, i, shared)
  local start = now - now % window
  local s
  if shared then s = sliding_states[key] end
  if s == nil then
    local f = redis.call('HMGET', key, 'w', 'c', 'p')
    s = { tonumber(f[1]), tonumber(f[2]) or 0, tonumber(f[3]) or 0 }
    if shared then sliding_states[key] = s end
  end
  local c, p = sw_counts(s[1], s[2], s[3], start, window)
  if cost > 0 and cost <= limit then
    if sw_estimate(p, c, now - start, window) + cost <= limit then
      local counted = math.min(c + cost, MAX_SLIDING_COUNT)
      if not shared then
        redis.call('HSET', key, 'w', start, 'c', string.format('%d', counted), 'p', string.format('%d', p))
        redis.call('PEXPIRE', key, ceil_ms(start + 2 * window - now))
      else
        s[1], s[2], s[3] = start, counted, p
        sliding_writes[key] = { now, window }
        lone_moved(sliding_movers, key, i)
      end
    end
  end
  return { c, p }
end
