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
    local n = redis.call('INCRBY', wkey, text) - cost
    if n == 0 then redis.call('PEXPIRE', wkey, ceil_ms(window - now % window + WINDOW_KEY_GRACE_US)) end
    if n + cost > MAX_COUNT then redis.call('SET', wkey, string.format('%d', MAX_COUNT), 'KEEPTTL') end
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
    local n = redis.call('INCRBY', key, text)
    if n == cost then
      -- The window's first count: set the window's expiry.
      redis.call('PEXPIRE', key, ceil_ms(start + window - now + WINDOW_KEY_GRACE_US))
    end
    if n > MAX_COUNT then redis.call('SET', key, string.format('%d', MAX_COUNT), 'KEEPTTL') end
    return n - cost
  end

  -- What windows 1 to `upto` of the `hits` call at ARGV[a] counted, taken back (`fresh[j]` set where window j
  -- was created by its count).
  local function windows_undo(keys, a, upto, fresh)
    for j = 1, upto do
      local text = ARGV[a + 3 * j]
      if number(text) > 0 and redis.call('INCRBY', keys[j], '-' .. text) == 0 and fresh[j] then
        redis.call('DEL', keys[j])
      end
    end
  end

  -- Per window of the `hits` call under way, what a window's first count leaves to finish (what is left of the
  -- window): kept from call to call and cleared as it is used, so that a hit allocates nothing.
  local windows_fresh = {}

  -- hits: several fixed windows on one descriptor (a second, a minute and an hour of one caller), decided together, all
  -- or nothing, as decide.lua decides them: one INCRBY of each window's count by its cost, taken back (an INCRBY of
  -- minus the cost, and a DEL of a count the hit created) when the hit does not fit every window, so that a hit that
  -- fits, the common case, costs one command per window and no read before it (a GET for a window whose cost is 0). A
  -- window's first count sets the window's expiry. Its keys are the windows' keys (as a lone fixed window's); its
  -- arguments, at ARGV[a] on: the number of windows t, then per window the window, the limit and the cost (bounded by
  -- the limit + 1; 0 checks the window without counting in it). `now` and `guess` as above.
  --
  -- Writes the windows' counts before the hit into answers[pos] to answers[pos + t - 1]; sluice decides from them: the
  -- hit fits when every window's count plus its cost is at most its limit, and was counted when it fits and some cost
  -- is positive. Denials count nothing: the script runs atomically, so no one sees a count it takes back. With
  -- `written`, a hit that fits and was counted then calls written(rkey, a, t, now, ttl) (a reservation writes its
  -- record: reserve below); if that fails, the hit is taken back and the error raised, so a descriptor is still counted
  -- whole or not at all.
  function M.hits(keys, a, now, guess, pos, written, rkey, ttl)
    local t = number(ARGV[a])
    local fits, positive, fresh, any = true, false, windows_fresh, false
    for j = 1, t do fresh[j] = nil end
    for j = 1, t do
      local window, b = number(ARGV[a + 3 * j - 2]), a + 3 * j
      local start = now - now % window
      local key = keys[j]
      if guess ~= nil and start ~= guess - guess % window then
        key = window_of(key, start, window)
        keys[j] = key
      end
      local text = ARGV[b]
      local cost = number(text)
      -- A key of the wrong type, or one this node does not serve: what the earlier windows counted is taken back first,
      -- so a descriptor is counted whole or not at all.
      local n
      if cost > 0 then n = redis.pcall('INCRBY', key, text) else n = redis.pcall('GET', key) end
      if type(n) == 'table' and n.err then
        windows_undo(keys, a, j - 1, fresh)
        error(n, 0)
      end
      n = tonumber(n)
      if cost > 0 then
        positive = true
        n = n - cost
      end
      if n == nil then
        n = 0
      elseif cost > 0 and n == 0 then
        -- The window's first count: what is left of the window, for its expiry once the hit is known to fit.
        fresh[j] = start + window - now
        any = true
      end
      answers[pos + j - 1] = n
      if n + cost > number(ARGV[b - 1]) then fits = false end
    end
    if not positive then return end
    if not fits then return windows_undo(keys, a, t, fresh) end
    if written ~= nil then
      local ok, err = pcall(written, rkey, a, t, now, ttl)
      if not ok then
        windows_undo(keys, a, t, fresh)
        error(err, 0)
      end
    end
    if not any then return end
    for j = 1, t do
      local f = fresh[j]
      if f ~= nil then redis.call('PEXPIRE', keys[j], ceil_ms(f + WINDOW_KEY_GRACE_US)) end
    end
  end

  -- reserve and settle: a cost budget's two calls on a descriptor whose limits are all fixed windows, in the
  -- fewest commands: a reservation is `hits`' INCRBYs and the record's write; a settlement reads the record,
  -- moves each window by the difference between the actual cost and the estimate (one INCRBY, of a negative amount for
  -- a refund), and deletes the record. sluice decides from the counts, as decide.lua's modes 'reserve' and 'settle'
  -- decide on fixed windows (the differential test holds the two paths to the same answers).
  --
  -- The record is prelude.lua's (record_write): each window's estimate, in order, joined by ',', when it was charged,
  -- and when it expires by the decision's clock.

  -- Writes a reservation's record `rkey` for the windows whose arguments `hits` read from ARGV[a] on (the
  -- costs sluice sends are decimal integers, as the record keeps them), charged at `now`, for `ttl` milliseconds.
  local function write_reservation(rkey, a, t, now, ttl)
    local e = ARGV[a + 3]
    if t > 1 then
      local costs = {}
      for j = 1, t do costs[j] = ARGV[a + 3 * j] end
      e = table.concat(costs, ',')
    end
    record_write(rkey, e, now, ttl)
  end

  -- A reservation: as `hits` (its arguments at ARGV[a] on: t, then per window the window, the limit and the
  -- cost), then the record's TTL in microseconds at ARGV[a + 3t + 1]. A hit that fits and counts something also writes
  -- the record `rkey`, after the windows and before their first counts' expiries; a record that cannot be written
  -- takes the hit back. Writes the windows' counts before the hit as `hits` does.
  function M.reserve(keys, rkey, a, now, guess, pos)
    local t = number(ARGV[a])
    M.hits(keys, a, now, guess, pos, write_reservation, rkey, ceil_ms(number(ARGV[a + 3 * t + 1])))
  end

  -- One window of a settlement: its window's key `key` (for the server's clock), the window, the estimate and the
  -- actual cost, the time `at` the reservation was charged. Counts a larger actual cost as a forced hit of the
  -- difference, or gives a smaller one back with an INCRBY of minus the difference, set right where fewer were counted.
  -- Returns what came back, the window's count after (nil: not written, to be read), and what to take back if a later
  -- window fails (the count added, and whether the key was created); and in `fresh[j]` what to finish once every window
  -- is written.
  local function settle_window(j, key, window, estimate, actual, at, now, fresh)
    local start = now - now % window
    if actual > estimate then
      local c = actual - estimate
      local n = redis.call('INCRBY', key, string.format('%d', c))
      -- Perhaps the window's first count: it sets the expiry, below.
      if n == c then fresh[j] = start + window - now end
      return 0, n, c, n == c
    end
    if estimate <= actual or at - at % window ~= start then return 0, nil, 0, false end
    local r = estimate - actual
    local n = redis.call('INCRBY', key, string.format('%d', -r))
    if n >= 0 then return r, n, -r, false end
    if n > -r then
      -- Fewer than r were counted: all of them come back.
      redis.call('INCRBY', key, string.format('%d', -n))
      return n + r, 0, -(n + r), false
    end
    -- The window counted nothing: its key held 0, or the INCRBY created it. Either way it goes, which reads the same.
    redis.call('DEL', key)
    return 0, 0, 0, false
  end

  local settle_done, settle_fresh = {}, {}

  -- A settlement: its arguments at ARGV[a] on, t, then per window the window, the limit (unused here) and the actual
  -- cost; its keys the windows' (for sluice's clock, rebuilt for the server's as `hits` does) and the record's.
  --
  -- Writes into answers[pos] 1 if the record was found live with one estimate per window (else 0, and nothing is
  -- written), then per window from answers[pos + 1] on: its estimate, what was given back (a refund reaches only the
  -- window the reservation was counted in, if it is still the current one, and never below 0), and the window's count
  -- after the settlement, which sluice reports as a peek of cost 1.
  --
  -- A window charged more counts the difference as a forced hit (its first count sets the expiry); one charged less
  -- gives it back. A command refused (a key of the wrong type) takes back what the earlier windows did, before the
  -- record is deleted: a settlement is whole or not at all.
  function M.settle(keys, rkey, a, now, guess, pos)
    local t = number(ARGV[a])
    for j = 0, 3 * t do answers[pos + j] = 0 end
    local e, at = live_reservation(rkey, now, t, false)
    if e == nil then return end
    -- What the windows did, to take back if a later one fails: the key, the count added, whether the key was created
    -- (with more than one window); and what a window's first count leaves to finish.
    local done, fresh = settle_done, settle_fresh
    for j = 1, #done do done[j] = nil end
    for j = 1, t do fresh[j] = nil end
    for j = 1, t do
      local window = number(ARGV[a + 3 * j - 2])
      local key = keys[j]
      if guess ~= nil and now - now % window ~= guess - guess % window then
        key = window_of(key, now - now % window, window)
        keys[j] = key
      end
      local ok, given, after, added, created = pcall(settle_window, j, key, window, e[j], number(ARGV[a + 3 * j]), at,
        now, fresh)
      if not ok then
        for i = #done - 2, 1, -3 do
          if done[i + 1] ~= 0 and redis.call('INCRBY', done[i], string.format('%d', -done[i + 1])) == 0 and done[i + 2] then
            redis.call('DEL', done[i])
          end
        end
        error(given, 0)
      end
      if t > 1 then done[#done + 1], done[#done + 2], done[#done + 3] = key, added, created end
      answers[pos + 3 * j - 2], answers[pos + 3 * j - 1], answers[pos + 3 * j] = e[j], given, after or false
    end
    redis.call('DEL', rkey)
    answers[pos] = 1
    for j = 1, t do
      local f, n = fresh[j], answers[pos + 3 * j]
      if f ~= nil then redis.call('PEXPIRE', keys[j], ceil_ms(f + WINDOW_KEY_GRACE_US)) end
      if n and n > MAX_COUNT then
        redis.call('SET', keys[j], string.format('%d', MAX_COUNT), 'KEEPTTL')
        n = MAX_COUNT
      end
      if not n then n = window_count(keys[j]) end
      answers[pos + 3 * j] = n
    end
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
