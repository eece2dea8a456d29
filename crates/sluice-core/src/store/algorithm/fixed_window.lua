-- fixed_window.lua: at most `limit` hits per epoch-aligned window of `window` us. State, in one of two forms:
-- packed   (L.fixed_window) two numbers in the descriptor's packed state (decide.lua): the first microsecond of the
--          window counted and its count. Another window's count reads as 0.
-- counter  (L.counter) a descriptor whose one limit is a fixed window keeps a plain integer per window,
--          `<key>:<window>` (prelude.lua's `window_key`; sluice sends the key of the window it expects), or the
--          reference's key for the drop-in, expiring a second after its window ends; a passed window is another key.
-- Invariants: a cost of 0 writes nothing; a counter's TTL is set when a window's first count creates its key, never
-- extended. Denials are counted only when decide.lua says so (a lone counter, as in the reference; a forced hit,
-- whatever its cost). The count stops at MAX_COUNT. A settlement's refund lowers the count of the current window
-- only, never below 0.

-- The count of the window `wkey` (0 if it has none), and whether its key exists.
local function window_count(wkey)
  local n = tonumber(redis.call('GET', wkey))
  if n ~= nil then return n, true end
  return 0, false
end

-- Counts `cost` (`text`: Redis takes a string for less than a number) in `wkey` by one INCRBY, the first count setting
-- the expiry. Returns the count before.
local function count_in(wkey, now, cost, text, window)
  local n = redis.call('INCRBY', wkey, text) - cost
  if n == 0 then redis.call('PEXPIRE', wkey, px(window - now % window + WINDOW_KEY_GRACE_US)) end
  if n + cost > MAX_COUNT then redis.call('SET', wkey, string.format('%d', MAX_COUNT), 'KEEPTTL') end
  return n
end

function L.counter()
  local M = {}

  M.width, M.counts_denials = 1, true

  -- Sees the count of the window `now` is in (prelude.lua's interface).
  function M.check(j, now, cost, limit, window)
    local wkey = window_at(K[j], now, window)
    local n = window_count(wkey)
    return n + cost <= limit, n, -1, -1, wkey
  end

  -- Returns the time until the window ends.
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

  -- The fast form (batch.lua), hit: the commonest call, a plain counter's hit with nothing else to write, in the fewest
  -- commands and arguments: one INCRBY (a GET for a cost not counted), one PEXPIRE on the window's first count, two or
  -- three arguments, an integer back. sluice decides from it, the limit and the time exactly as check would (the
  -- differential test holds both paths to the same answers). `key`: the window's key, built by sluice; `window` (us);
  -- `cost`: 0 for a hit not counted (a cost of 0, or one above the limit, which can never fit), else at most the limit;
  -- `text`: the cost as spelled; `now`; `guess`: nil when sluice gave the time, else the time by sluice's clock the key
  -- was built for, `now` being the server's (the key is rebuilt if the server's window is another). Returns the
  -- window's count before the hit. Denials are counted as the reference does: sluice sends the cost, fitting or not.
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

  function M.refund(p, now, at, amount, _, window)
    local start = now - now % window
    if at - at % window ~= start or P[p] ~= start then return nil end
    local given = min(P[p + 1], amount)
    return given, function() P[p + 1] = P[p + 1] - given end
  end

  return M
end

-- The global form (prelude.lua's global_of): the others' count is read from the hash named after its one key.
L['global:fixed_window'] = global_of('fixed_window', 1, function(j, now, window)
  return regions_count(window_at(K[j], now, window))
end)
