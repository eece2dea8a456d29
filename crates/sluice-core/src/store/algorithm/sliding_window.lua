-- sliding_window.lua: the two-window weighted counter. The count at time t is
--   floor(p * (window - elapsed) / window) + c
-- where c counts the hits of the current epoch-aligned window, p those of the previous one, and elapsed is t minus
-- the current window's start. It assumes the previous window's hits were spread evenly; the error bound is in the
-- README.
--
-- State: one integer string per window, `<key>:<window>` as a fixed window keeps it (prelude.lua's `window_key`: the
-- window's number in hex), read with a GET beside the previous window's and counted with INCRBY (SET with its expiry
-- on the window's first count). A window's key is read as the previous one all through the next window, so it
-- expires a second after that.
-- Invariants: a denied hit writes nothing, unless it is forced (then c may pass the limit, up to MAX_SLIDING_COUNT);
-- a cost of 0 writes nothing. A settlement's refund lowers the count of the window the reservation was counted in
-- (the current or the previous one), never below 0, and keeps the key's expiry.

local function sw_estimate(p, c, elapsed, window)
  return math.floor(p * (window - elapsed) / window) + c
end

-- The keys of the current window and of the one before of the descriptor whose keys start at K[j] (built for the
-- windows sluice's clock expects; see prelude.lua's window_at).
local function sw_at(j, now, window)
  local cur, prev = K[j], K[j + 1]
  local at = window_at(cur, now, window)
  if at == cur then return cur, prev end
  return at, window_of(cur, now - now % window - window, window)
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

-- The compact hit (batch.lua): a hit on a descriptor with one sliding window and nothing else to write, in the fewest
-- Redis commands and arguments: its two windows' keys, four or five arguments, a GET of each window's count and,
-- when the hit fits, one INCRBY, and two integers back. The decision itself (what is left, when to retry) is made by
-- sluice from those counts, exactly as M.check below would make it; the differential test holds the two
-- paths to the same answers.
--
-- Its keys are the current window's and the previous one's (built by sluice for the window it
-- expects; by the server's clock, rebuilt when the server's window is another, as a lone fixed window's); its
-- arguments (batch.lua reads them): the window, the limit, the cost (bounded by the limit + 1, and as the arguments
-- spell it) and the decision's time `now`.
--
-- Returns c, p: the counts of the current window and of the previous one the hit found.
--
-- A hit whose counter no other hit of the call shares is counted before it is checked (sliding_counted below).
--
-- As a lone bucket, a counter that several compact calls of one script call hit is read once and written once
-- (token_bucket.lua); a hit of such a counter in another window than the one read (the calls' times straddle an edge)
-- writes what the earlier hits counted and reads again.

-- Per counter read in this call (by its current window's key as sluice sent it: sluice shares a counter only among
-- calls that see it in one window): sw_read's state as the hits so far leave it, and what they counted (`added`).
local sliding_states = {}
-- Per counter to write (its state's `now` is the time of the last hit that counted in it): the answers whose hits
-- did.
local sliding_movers = {}
-- The counters this call shares (prelude.lua's keep).
local shared_slidings = {}

-- Writes what the hits of this call counted in the shared counter `key`, and forgets it.
local function sliding_write(key)
  local s, movers = sliding_states[key], sliding_movers[key]
  sliding_states[key], sliding_movers[key] = nil, nil
  if movers == nil then return end
  local ok, err = pcall(sw_add, s.written, s.added, s.now, s.window)
  if not ok then failed(movers, err) end
end

function shared_slidings.flush()
  for key in pairs(sliding_movers) do sliding_write(key) end
  sliding_states = {}
end

function shared_slidings.forget()
  sliding_states, sliding_movers = {}, {}
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
    keep(shared_slidings)
  end
  return s
end

-- A hit that may fit, on a counter that no other hit of this call shares:
-- counted first, by one INCRBY, then the previous window read, and the count taken back in the same call when the
-- estimate leaves no room for it (the script runs atomically: no reader sees a count taken back). A hit that fits
-- costs an INCRBY and a GET, with no read before the write, and the window's first count a PEXPIRE; one that does
-- not, one more INCRBY (or the DEL of the key it created). A previous window's key of the wrong type (or one this node
-- does not serve) takes the count back before its error goes up. Returns c, p as the compact hit does.
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
      moved(sliding_movers, key, pos)
    end
  end
  return c, p
end

function L.sliding_window()
  local M = {}

  M.width, M.keys = 2, 2

  -- Sees the counts of the current window and of the previous one (decide.lua's interface, prelude.lua).
  function M.check(j, now, cost, limit, window)
    local start = now - now % window
    local cur, prev = sw_at(j, now, window)
    local read = sw_read(cur, prev, start)
    return sw_estimate(read.p, read.c, now - start, window) + cost <= limit, read.c, read.p, -1, read
  end

  function M.left(c, p, _, now, limit, window)
    return max0(limit - sw_estimate(p, c, now % window, window))
  end

  -- Counts `cost` in the current window seen; returns the time until the count leaves the estimate.
  function M.commit(_, now, cost, _, window, _, _, _, _, _, read)
    sw_add(read, cost, now, window)
    return '', 2 * window - now % window
  end

  -- Gives back up to `amount` (down to 0) of the count the hit at `at` went into: the current window's or the
  -- previous one's. The key keeps its expiry.
  function M.refund(j, now, at, amount, limit, window)
    local start = now - now % window
    local from = at - at % window
    if from ~= start and from ~= start - window then return nil end
    local cur, prev = sw_at(j, now, window)
    local s = sw_read(cur, prev, start)
    local n, target = s.c, s.cur
    if from ~= start then n, target = s.p, s.prev end
    if n == 0 then return nil end
    local given = math.min(n, amount)
    return given, function()
      redis.call('SET', target, string.format('%d', n - given), 'KEEPTTL')
    end
  end
  M.hit = compact_sliding_window
  return M
end

-- The global form (`global: true`, prelude.lua's global_of): the limit less the weighted estimate over what the other
-- regions counted in the current and previous windows. Its compact hit is as fixed_window.lua's global form's.
local function compact_global_sliding(cur, prev, window, limit, cost, times, now, pos, shared)
  local start = now - now % window
  local key = cur
  local wcur = window_of(cur, start, window)
  if wcur ~= cur then
    cur, prev = wcur, window_of(cur, start - window, window)
  end
  local s = sliding_state(key, cur, prev, start, window, now, shared)
  local elapsed = now - start
  local others = s.others
  if others == nil then
    others = sw_estimate(regions_count(prev), regions_count(cur), elapsed, window)
    s.others = others
  end
  local c, p = s.c, s.p
  local fits = global_fits(sw_estimate(p, c, elapsed, window), max0(limit - others), cost, times)
  if fits > 0 then
    local added = fits * cost
    if not shared then
      sw_add(s, added, now, window, string.format('%d', added))
    else
      s.c, s.added, s.now = math.min(c + added, MAX_SLIDING_COUNT), s.added + added, now
      moved(sliding_movers, key, pos)
    end
  end
  answers[pos], answers[pos + 1], answers[pos + 2] = c, p, others
end

L['global:sliding_window'] = global_of('sliding_window', function(j, now, window)
  local cur, prev = sw_at(j, now, window)
  return sw_estimate(regions_count(prev), regions_count(cur), now % window, window)
end, function(M)
  M.hit = compact_global_sliding
end)
