-- compact_sliding_window.lua: a hit on a descriptor with one sliding window and nothing else to write, in the fewest
-- Redis commands and arguments: its two windows' keys, four or five arguments, a GET of each window's count and,
-- when the hit fits, one INCRBY, and two integers back. The decision itself (what is left, when to retry) is made by
-- sluice from those counts, exactly as sliding_window.lua's check would make it; the differential test holds the two
-- paths to the same answers.
--
-- Its keys are the current window's and the previous one's (sliding_window.lua's, built by sluice for the window it
-- expects; by the server's clock, rebuilt when the server's window is another, as a lone fixed window's); its
-- arguments (batch.lua reads them): the window, the limit, the cost (bounded by the limit + 1, and as the arguments
-- spell it) and the decision's time `now`.
--
-- Returns c, p: the counts of the current window and of the previous one the hit found.
--
-- A hit whose counter no other hit of the call shares is counted before it is checked (sliding_counted below).
--
-- As a lone bucket, a counter that several compact calls of one script call hit is read once and written once
-- (compact_bucket.lua); a hit of such a counter in another window than the one read (the calls' times straddle an edge)
-- writes what the earlier hits counted and reads again.

-- Per counter read in this call (by its current window's key as sluice sent it: sluice shares a counter only among
-- calls that see it in one window): sw_read's state as the hits so far leave it, and what they counted (`added`).
local sliding_states = {}
-- Per counter to write (its state's `now` is the time of the last hit that counted in it): the answers whose hits
-- did.
local sliding_movers = {}

-- Writes what the hits of this call counted in the shared counter `key`, and forgets it.
local function sliding_write(key)
  local s, movers = sliding_states[key], sliding_movers[key]
  sliding_states[key], sliding_movers[key] = nil, nil
  if movers == nil then return end
  local ok, err = pcall(sw_add, s.written, s.added, s.now, s.window)
  if not ok then compact_failed(movers, err) end
end

-- The window's state for `key`: read from `cur` and `prev`, or, when hits on one key share it (`shared`), the state
-- the earlier hits of this call left (written out first when its window has passed).
local function sliding_state(key, cur, prev, start, window, now, shared)
  local s
  if shared then
    s = sliding_states[key]
    if s ~= nil and s.start ~= start then
      sliding_write(key)
      s = nil
    end
  end
  if s == nil then
    local read = sw_read(cur, prev, start)
    if not shared then
      return read
    end
    s = { start = start, c = read.c, p = read.p, added = 0, written = read, now = now, window = window }
    sliding_states[key] = s
  end
  return s
end

-- A hit that may fit, on a counter that no other hit of this call shares:
-- counted first, by one INCRBY, then the previous window read, and the count taken back in the same call when the
-- estimate leaves no room for it (the script runs atomically: no reader sees a count taken back). A hit that fits
-- costs an INCRBY and a GET, with no read before the write, and the window's first count a PEXPIRE; one that does
-- not, one more INCRBY (or the DEL of the key it created). A previous window's key of the wrong type (or one this node
-- does not serve) takes the count back before its error goes up. Returns c, p as compact_sliding_window does.
local function sliding_counted(cur, prev, start, window, limit, cost, text, now)
  local c = redis.call('INCRBY', cur, text) - cost
  local p = redis.pcall('GET', prev)
  local fits = type(p) ~= 'table'
  if fits then
    p = tonumber(p) or 0
    fits = sw_estimate(p, c, now - start, window) + cost <= limit
  end
  if not fits then
    if c == 0 then redis.call('DEL', cur) else redis.call('INCRBY', cur, '-' .. text) end
    if type(p) == 'table' then error(p, 0) end
  elseif c == 0 then
    -- The window's first count (or the first since a refund took it back to 0): its expiry, as sw_add gives it.
    redis.call('PEXPIRE', cur, ceil_ms(start + 2 * window - now + WINDOW_KEY_GRACE_US))
  end
  return c, p
end

local function compact_sliding_window(cur, prev, window, limit, cost, text, now, guess, pos, shared)
  local start = now - now % window
  local key = cur
  if guess ~= nil and start ~= guess - guess % window then
    cur, prev = window_of(cur, start, window), window_of(cur, start - window, window)
  end
  if not shared and cost > 0 and cost <= limit then
    return sliding_counted(cur, prev, start, window, limit, cost, text, now)
  end
  local s = sliding_state(key, cur, prev, start, window, now, shared)
  local c, p = s.c, s.p
  if cost > 0 and cost <= limit and sw_estimate(p, c, now - start, window) + cost <= limit then
    if not shared then
      sw_add(s, cost, now, window, text)
    else
      s.c, s.added, s.now = math.min(c + cost, MAX_SLIDING_COUNT), s.added + cost, now
      compact_moved(sliding_movers, key, pos)
    end
  end
  return c, p
end
