-- fixed_window.lua: at most `limit` hits per epoch-aligned window of `window` us.
--
-- State: one integer string per window, `<key>:<window>` (prelude.lua's `window_key`: the window's number in hex;
-- sluice sends the key of the window it expects), counted with INCRBY, which expires a second after its window ends.
-- The commonest call, the compact hit below, is one INCRBY on it (and one PEXPIRE on the window's first count); a
-- window that has passed is simply another key. Invariants: a cost of 0 writes nothing; the TTL is set when a window's
-- first count creates its key and never extended. Denials are counted only when decide.lua says so (a lone fixed
-- window, as in the reference, but never a cost above the limit, which can never fit; a forced hit, whatever its cost).
-- The count stops at MAX_COUNT. A settlement's refund lowers the count of the current window only, never below 0, and
-- keeps the key's expiry.

-- The count of the window `wkey` (0 if it has none), and whether its key exists.
local function window_count(wkey)
  local n = tonumber(redis.call('GET', wkey))
  if n ~= nil then return n, true end
  return 0, false
end

-- Counts `cost` (`text`, as the arguments spell it: Redis takes a string for less than a number) in the window `wkey`
-- of `window` us by one INCRBY; the window's first count sets its expiry, and the count stops at MAX_COUNT. Returns
-- the count before.
local function count_in(wkey, now, cost, text, window)
  local n = redis.call('INCRBY', wkey, text) - cost
  if n == 0 then redis.call('PEXPIRE', wkey, ceil_ms(window - now % window + WINDOW_KEY_GRACE_US)) end
  if n + cost > MAX_COUNT then redis.call('SET', wkey, string.format('%d', MAX_COUNT), 'KEEPTTL') end
  return n
end

function L.fixed_window()
  local M = {}

  M.width, M.counts_denials = 1, true

  -- Sees the count of the window `now` is in (decide.lua's interface, prelude.lua).
  function M.check(j, now, cost, limit, window)
    local wkey = window_at(K[j], now, window)
    local n = window_count(wkey)
    return n + cost <= limit, n, -1, -1, wkey
  end

  -- Counts `cost` in the window at once, by one INCRBY, and sees the count before it: a hit that fits, the common
  -- case, costs one command and no read before it (and the window's first count a PEXPIRE). The count stops at
  -- MAX_COUNT. `text` is the cost as the arguments spell it (Redis takes a string for less than a number).
  function M.take(j, now, cost, limit, window, _, _, text)
    local wkey = K[j]
    if guess ~= nil then wkey = window_at(wkey, now, window) end
    local n = count_in(wkey, now, cost, text, window)
    return n + cost <= limit, n, -1, -1, wkey
  end

  -- Takes back what take counted: the count as it was (a window it started goes; one that held 0 reads the same).
  function M.undo(_, _, _, _, _, _, _, n, _, _, wkey)
    if n == 0 then
      redis.call('DEL', wkey)
    else
      redis.call('SET', wkey, string.format('%d', n), 'KEEPTTL')
    end
  end

  -- Keeps what take counted; returns the time until the window ends.
  function M.kept(_, now, _, _, window)
    return '', window - now % window
  end

  function M.left(n, _, _, _, limit)
    return max0(limit - n)
  end

  -- Counts `cost` in the window seen (past the limit if decide.lua says so), up to MAX_COUNT; the window's first
  -- count sets its expiry, later ones keep it. Returns the time until the window ends.
  function M.commit(_, now, cost, _, window, _, _, n, _, _, wkey)
    local reset = window - now % window
    local count = string.format('%d', math.min(n + cost, MAX_COUNT))
    if n > 0 then
      redis.call('SET', wkey, count, 'KEEPTTL')
    else
      redis.call('SET', wkey, count, 'PX', ceil_ms(reset + WINDOW_KEY_GRACE_US))
    end
    return '', reset
  end

  -- Gives back up to `amount` (down to 0) if the hit at `at` was counted in the current window; the key keeps its
  -- expiry.
  function M.refund(j, now, at, amount, limit, window)
    local start = now - now % window
    if at - at % window ~= start then return nil end
    local wkey = window_at(K[j], now, window)
    local n, exists = window_count(wkey)
    if not exists then return nil end
    local given = math.min(n, amount)
    return given, function()
      redis.call('SET', wkey, string.format('%d', n - given), 'KEEPTTL')
    end
  end

  -- The compact forms (batch.lua).
  --
  -- hit: the most common call, a hit on a descriptor with one fixed-window limit and nothing else to write, in the
  -- fewest Redis commands and arguments: one INCRBY of the window's count (a GET for a cost that is not counted), one
  -- PEXPIRE on the window's first count, two or three arguments, and an integer back. The decision itself
  -- (whether the hit fits, what is left, when to retry) is made by sluice from that integer, the limit and the time,
  -- exactly as check above would make it; the differential test holds the two paths to the same answers.
  --
  -- Its key is the window's key (prelude.lua's `window_key`: the counter's key, ':', the window's number), built by
  -- sluice; its arguments (batch.lua reads them): the window in microseconds, the cost to count (0 for a hit that is
  -- not counted: a cost of 0, or one above the limit, which can never fit; a positive cost is at most the limit), the
  -- decision's time `now` (`text` is the cost as the arguments spell it: Redis takes a string for less than a
  -- number), and `guess`: nil when sluice gave the time, else the time by sluice's clock the key was
  -- built for, `now` being the server's; if the server's window is another (the two clocks straddle a window's edge),
  -- the key is rebuilt for the server's window.
  --
  -- Returns the window's count before the hit. Denials are counted as the reference counts them: sluice sends the cost
  -- whether or not it will fit. A count past MAX_COUNT stays there.
  function M.hit(key, window, cost, text, now, guess)
    local start = now - now % window
    if guess ~= nil and start ~= guess - guess % window then key = window_of(key, start, window) end
    if cost == 0 then return (window_count(key)) end
    return count_in(key, now, cost, text, window)
  end

  return M
end

-- The global form's compact hit, on a descriptor with one global window (`global: true`, a fixed window here, a sliding
-- one in sliding_window.lua) and nothing else to write, in the fewest Redis commands and arguments: the other regions'
-- counts read from their hash (`<window key>@regions`, the sum of its values), the window's own count read and, when
-- the hit fits, written (a lone fixed window's both at once, by one INCRBY); integers back. The decision itself (what
-- is left, when to retry, the sum reported as used) is made by sluice from those integers, the limit and the time,
-- exactly as the global form's check would make it (and the memory store, by the same `global_check` in
-- `store/algorithm.rs`); the differential test holds the paths to the same answers.
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
-- before a descriptor of the decision loop's form (prelude.lua's flush): the hits are decided one after the other on the
-- counts the previous ones left, exactly as serial hits. A write that fails turns the answers of the hits it carried
-- into its error. Invariants: as the global form's: never counts a denial (nor a cost of 0), never writes the regions'
-- hashes; the window's own key holds what its algorithm's commit writes. A lone unshared fixed window's hit that may
-- fit is counted by INCRBY before it is decided, and a denial then sets the count back (deletes the key it created) in
-- the same call: a denial leaves the count as it found it, but costs one more write than a read.

-- Per shared fixed window of this call (by its key as sluice sent it): its count as the hits so far leave it, what it
-- was read as, and the others' count; and the places of the hits that counted in it. `shared_globals` writes and
-- forgets them (prelude.lua's keep).
local global_fixed, global_fixed_movers = {}, {}
local shared_globals = {}

-- Writes the count `g` holds, as the commit above writes it (its first count sets the expiry, from the time
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
  if not ok then failed(movers, err) end
end

function shared_globals.flush()
  for key in pairs(global_fixed_movers) do global_fixed_write(key) end
  global_fixed = {}
end

function shared_globals.forget()
  global_fixed, global_fixed_movers = {}, {}
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
    keep(shared_globals)
  end
  local n = g.n
  local fits = global_fits(n, max0(limit - g.others), cost, times)
  if fits > 0 then
    g.n = n + fits * cost
    g.first = g.first or now
    moved(global_fixed_movers, key, pos)
  end
  answers[pos], answers[pos + 1] = n, g.others
end

-- The global form (`global: true`, prelude.lua's global_of): the limit less what the other regions counted in the
-- window.
L['global:fixed_window'] = global_of('fixed_window', function(j, now, window)
  return regions_count(window_at(K[j], now, window))
end, function(M)
  M.hit = compact_global_fixed
end)
