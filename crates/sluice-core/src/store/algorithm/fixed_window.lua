-- fixed_window.lua: at most `limit` hits per epoch-aligned window of `window` us.
--
-- State: one integer string per window, `<key>:<window>` (prelude.lua's `window_key`: the window's number in hex
-- under a compact key, its first microsecond in decimal in the full layout; sluice sends the key of the window it
-- expects), counted with INCRBY, which expires a second after its window ends. The commonest call,
-- compact_fixed_window.lua, is one INCRBY on it (and one PEXPIRE on the window's first count); a window that has passed
-- is simply another key.
-- Counters of the previous form, a hash {w = start of the window it counts, n = hits counted in it} at `<key>`
-- itself, are still read: a window whose own key does not exist yet counts the hash's `n` when the hash is of the
-- same window, and its first write folds that count into the window's key and deletes the hash (`legacy` below).
-- Invariants: a cost of 0 writes nothing; the TTL is set when a window's first count creates its key and never
-- extended. Denials are counted only when decide.lua says so (a lone fixed window, as in the reference, but never a
-- cost above the limit, which can never fit; a forced hit, whatever its cost). The count stops at MAX_COUNT. A
-- settlement's refund lowers the count of the current window only, never below 0, and keeps the key's expiry.

-- How long a window's key outlives its window: no later window reads it (each has its own key), and a TTL of a few
-- milliseconds (a first hit just before the window ends) could lapse before the next hit of the same window when the
-- decision's time is given to the script rather than read from the server's clock.
local WINDOW_KEY_GRACE_US = 1000000

-- The key of the window of `window` us starting at `start`, from `key`, the key of the window sluice expects (its
-- clock's; the server's may be across an edge, and that window then gets its own key), and the counter's own key
-- (`key` without its window), where the previous form kept its hash, if one may be there (previous_at).
-- A window key of envoyproxy/ratelimit's layout (`KeyLayout::Reference` in store/key.rs) is the counter's key, which
-- ends with '_', then the window's start in seconds; such a counter has no own key (nil), and no previous form.
local function window_of(key, start, window)
  local base = string.match(key, '^(.*):%x+$')
  if base == nil then
    local at
    base, at = string.match(key, '^(.*_)(%d+)$')
    if base == nil then error('not a window key: ' .. key, 0) end
    local seconds = (start - start % 1000000) / 1000000
    if tonumber(at) == seconds then return key, nil end
    return base .. string.format('%d', seconds), nil
  end
  return window_key(base, start, window), previous_at(base)
end

-- The count a hash of the previous form at `base` holds for the window starting at `start` (0 if none), and whether
-- there is such a hash to fold into the window's key.
local function legacy(base, start)
  if base == nil then return 0, false end
  local f = redis.call('HMGET', base, 'w', 'n')
  if tonumber(f[1]) == start then return tonumber(f[2]) or 0, true end
  return 0, false
end

-- The count of the window `wkey` (starting at `start`; `base` the counter's own key): its key's, or the previous
-- form's; whether its key exists; whether a hash of the previous form must be folded in.
local function window_count(wkey, base, start)
  local n = tonumber(redis.call('GET', wkey))
  if n ~= nil then return n, true, false end
  local old, found = legacy(base, start)
  return old, false, found
end

function L.fixed_window()
  local M = {}

  function M.check(key, now, cost, limit, window)
    local start = now - now % window
    local wkey, base = window_of(key, start, window)
    local n, exists, folds = window_count(wkey, base, start)
    local reset = start + window - now
    local ok = n + cost <= limit
    local retry = 0
    if cost > limit then retry = -1 elseif not ok then retry = reset end
    return {
      ok = ok, used0 = n, used = n + cost, rem0 = max0(limit - n), rem1 = max0(limit - n - cost),
      reset0 = reset, reset1 = reset, retry = retry, n = n, wkey = wkey, base = base, exists = exists, folds = folds,
    }
  end

  function M.commit(key, s, now, cost)
    if cost == 0 then return '' end
    local count = string.format('%d', math.min(s.n + cost, MAX_COUNT))
    if s.exists then
      redis.call('SET', s.wkey, count, 'KEEPTTL')
    else
      redis.call('SET', s.wkey, count, 'PX', ceil_ms(s.reset0 + WINDOW_KEY_GRACE_US))
      if s.folds then redis.call('DEL', s.base) end
    end
    return ''
  end

  -- Gives back up to `amount` (down to 0) if the hit at `at` was counted in the current window; the key keeps its
  -- expiry.
  function M.refund(key, now, at, amount, limit, window)
    local start = now - now % window
    if at - at % window ~= start then return nil end
    local wkey, base = window_of(key, start, window)
    local n, exists, folds = window_count(wkey, base, start)
    if not exists and not folds then return nil end
    local given = math.min(n, amount)
    return given, function()
      if exists then
        redis.call('SET', wkey, string.format('%d', n - given), 'KEEPTTL')
      else
        redis.call('SET', wkey, string.format('%d', n - given), 'PX', ceil_ms(start + window - now + WINDOW_KEY_GRACE_US))
        redis.call('DEL', base)
      end
    end
  end
  return M
end
