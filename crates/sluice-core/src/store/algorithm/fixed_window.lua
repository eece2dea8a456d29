-- fixed_window.lua: at most `limit` hits per epoch-aligned window of `window` us.
--
-- State, in one of two forms:
-- packed   (L.fixed_window) two numbers in its descriptor's packed state (decide.lua): the first microsecond of the
--          window counted and its count. A count of another window reads as 0.
-- counter  (L.counter) a descriptor whose one limit is a fixed window counted here alone keeps a plain integer per
--          window, `<key>:<window>` (prelude.lua's `window_key`: the window's number in hex; sluice sends the key of
--          the window it expects), or the reference's key for the drop-in, counted with INCRBY and expiring a second
--          after its window ends. The commonest call, the counter's hit below, is one INCRBY (and one PEXPIRE on the
--          window's first count); a window that has passed is simply another key.
-- Invariants: a cost of 0 writes nothing; a counter's TTL is set when a window's first count creates its key and never
-- extended. Denials are counted only when decide.lua says so (a lone counter, as in the reference, but never a cost
-- above the limit, which can never fit; a forced hit, whatever its cost). The count stops at MAX_COUNT. A
-- settlement's refund lowers the count of the current window only, never below 0.

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
  if n == 0 then redis.call('PEXPIRE', wkey, px(window - now % window + WINDOW_KEY_GRACE_US)) end
  if n + cost > MAX_COUNT then redis.call('SET', wkey, string.format('%d', MAX_COUNT), 'KEEPTTL') end
  return n
end

function L.counter()
  local M = {}

  M.width, M.counts_denials = 1, true

  -- Sees the count of the window `now` is in (decide.lua's interface, prelude.lua).
  function M.check(j, now, cost, limit, window)
    local wkey = window_at(K[j], now, window)
    local n = window_count(wkey)
    return n + cost <= limit, n, -1, -1, wkey
  end

  -- Counts `cost` in the window seen (past the limit if decide.lua says so), up to MAX_COUNT; the window's first
  -- count sets its expiry, later ones keep it. Returns the time until the window ends.
  function M.commit(_, now, cost, _, window, _, _, n, _, _, wkey)
    local reset = window - now % window
    local count = string.format('%d', min(n + cost, MAX_COUNT))
    if n > 0 then
      redis.call('SET', wkey, count, 'KEEPTTL')
    else
      redis.call('SET', wkey, count, 'PX', px(reset + WINDOW_KEY_GRACE_US))
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
    local given = min(n, amount)
    return given, function()
      redis.call('SET', wkey, string.format('%d', n - given), 'KEEPTTL')
    end
  end

  -- The fast form (batch.lua), hit: the most common call, a hit on a plain counter with nothing else to write, in the
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


function L.fixed_window()
  local M = { width = 1, slots = 2, counts_denials = true }

  -- The count of the window `now` is in, from the state at P[p].
  local function count(p, now, window)
    if P[p] == now - now % window then return P[p + 1] end
    return 0
  end

  function M.check(p, now, cost, limit, window)
    local n = count(p, now, window)
    return n + cost <= limit, n, -1, -1
  end

  -- Counts `cost` in the window `now` is in, up to MAX_COUNT; returns the time until the window ends.
  function M.commit(p, now, cost, _, window)
    local start = now - now % window
    P[p], P[p + 1] = start, min(count(p, now, window) + cost, MAX_COUNT)
    return '', start + window - now
  end

  -- How long the state matters: until its window ends, if it counted anything.
  function M.lives(p, now, window)
    if P[p + 1] > 0 then return P[p] + window - now end
    return 0
  end

  -- Gives back up to `amount` (down to 0) if the hit at `at` was counted in the current window.
  function M.refund(p, now, at, amount, _, window)
    local start = now - now % window
    if at - at % window ~= start or P[p] ~= start then return nil end
    local given = min(P[p + 1], amount)
    return given, function() P[p + 1] = P[p + 1] - given end
  end

  return M
end

-- The global form (`global: true`, prelude.lua's global_of): the limit less what the other regions counted in the
-- window, read from the hash named after the window (its one key, a name sluice sends).
L['global:fixed_window'] = global_of('fixed_window', 1, function(j, now, window)
  return regions_count(window_at(K[j], now, window))
end)
