-- compact_global.lua: a hit on a descriptor with one global window (`global: true`, a fixed or a sliding window; see
-- global.lua) and nothing else to write, in the fewest Redis commands and arguments: the other regions' counts read
-- from their hash (`<window key>@regions`, the sum of its values), the window's own count read and, when the hit
-- fits, written (a lone fixed window's both at once, by one INCRBY); integers back. The decision itself (what is left,
-- when to retry, the sum reported as used) is made by sluice from those integers, the limit and the time, exactly as
-- global.lua's check would make it (and the memory store, by the same `global_check` in `store/algorithm.rs`); the
-- differential test holds the paths to the same answers.
--
-- Keys (as the plain compact forms build them, by sluice's clock, and rebuilt here for the server's window): a fixed
-- window's key; a sliding window's current and previous windows' keys. Arguments (batch.lua reads them): 'gw' (a
-- fixed window) or 'gs' (a sliding one), in capitals when shared (below), the window, the limit, the cost (bounded by
-- the limit + 1), `times`, how many identical hits the call carries (sluice sends a hot key's identical hits of one
-- script call as one call: they are decided one after the other, each counted while it fits, so that as many as fit
-- are counted at once, and sluice tells each hit's answer from the first's), then the time.
--
-- Writes into answers[pos] on: a fixed window's count before the (first) hit and the others' count of its window (2
-- places); a sliding window's current and previous counts before the (first) hit and the others' weighted estimate (3
-- places).
--
-- As a lone bucket, a counter that several compact calls of one script call hit (a hot key; sluice shares a counter
-- only among calls that see it in one window) is read once, the others' hash too, and written once, at the end or
-- before a descriptor of the driver's form (batch.lua's flush_compact): the hits are decided one after the other on
-- the counts the previous ones left, exactly as serial hits. A write that fails turns the answers of the hits it
-- carried into its error.
-- Invariants: as global.lua's: never counts a denial (nor a cost of 0), never writes the regions' hashes; the window's
-- own key holds what its algorithm's commit writes. A lone unshared fixed window's hit that may fit is counted by
-- INCRBY before it is decided, and a denial then sets the count back (deletes the key it created) in the same call:
-- a denial leaves the count as it found it, but costs one more write than a read.

-- Per shared fixed window of this call (by its key as sluice sent it): its count as the hits so far leave it, what it was read as,
-- and the others' count; and the places of the hits that counted in it.
local global_fixed, global_fixed_movers = {}, {}

-- Writes the count `g` holds, as fixed_window.lua's commit writes it (its first count sets the expiry, from the time
-- of the hit that made it).
local function global_fixed_commit(g)
  local count = string.format('%d', math.min(g.n, MAX_COUNT))
  if g.exists then
    redis.call('SET', g.wkey, count, 'KEEPTTL')
  else
    redis.call('SET', g.wkey, count, 'PX', ceil_ms(g.start + g.window - g.first + WINDOW_KEY_GRACE_US))
  end
end

-- Writes what the hits of this call counted in the shared fixed window `key`, and forgets it.
local function global_fixed_write(key)
  local g, movers = global_fixed[key], global_fixed_movers[key]
  global_fixed[key], global_fixed_movers[key] = nil, nil
  if movers == nil then return end
  local ok, err = pcall(global_fixed_commit, g)
  if not ok then compact_failed(movers, err) end
end

-- How many of `times` hits of `cost` count on `used` (a count, or a sliding window's estimate) where `room` fits: each
-- while it fits; once one does not, none after it does.
local function global_fits(used, room, cost, times)
  if cost <= 0 or room <= used then return 0 end
  return math.min(times, math.floor((room - used) / cost))
end

local function compact_global_fixed(key, window, limit, cost, times, now, pos, shared)
  local start = now - now % window
  if not shared then
    -- Decided and written in the fewest commands, with nothing to remember (no table: the commonest call over many
    -- keys). The others' count first: a hit that cannot fit what they leave only reads the window's count. One that
    -- may fit is counted at once, by one INCRBY as a lone regional window is, and set back in the same call if it did
    -- not fit after all (or only some of `times` did): the script runs atomically, so no reader ever sees the count
    -- it took back.
    local wkey = window_of(key, start, window)
    local others = regions_count(wkey)
    local room = max0(limit - others)
    if cost <= 0 or cost > room then
      answers[pos], answers[pos + 1] = window_count(wkey), others
      return
    end
    local added = cost * times
    local n = redis.call('INCRBY', wkey, string.format('%d', added)) - added
    -- The window's first count: the expiry is set below.
    local fresh = n == 0
    local fits = global_fits(n, room, cost, times)
    if fits < times then
      local count = n + fits * cost
      if count == 0 then
        redis.call('DEL', wkey)
        fresh = false
      else
        redis.call('SET', wkey, string.format('%d', count), 'KEEPTTL')
      end
    end
    if fresh then redis.call('PEXPIRE', wkey, ceil_ms(start + window - now + WINDOW_KEY_GRACE_US)) end
    answers[pos], answers[pos + 1] = n, others
    return
  end
  local g = global_fixed[key]
  if g ~= nil and g.start ~= start then
    global_fixed_write(key)
    g = nil
  end
  if g == nil then
    local wkey = window_of(key, start, window)
    local n, exists = window_count(wkey)
    g = { wkey = wkey, start = start, window = window, n = n, exists = exists, others = regions_count(wkey) }
    global_fixed[key] = g
  end
  local n = g.n
  local fits = global_fits(n, max0(limit - g.others), cost, times)
  if fits > 0 then
    g.n = n + fits * cost
    g.first = g.first or now
    compact_moved(global_fixed_movers, key, pos)
  end
  answers[pos], answers[pos + 1] = n, g.others
end

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
      compact_moved(sliding_movers, key, pos)
    end
  end
  answers[pos], answers[pos + 1], answers[pos + 2] = c, p, others
end
