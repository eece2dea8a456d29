-- fixed_window.lua: at most `limit` hits per epoch-aligned window of `window` us.
--
-- State: one integer string per window, `<key>:<window>` (prelude.lua's `window_key`: the window's number in hex;
-- sluice sends the key of the window it expects), counted with INCRBY, which expires a second after its window ends. The commonest call,
-- compact_fixed_window.lua, is one INCRBY on it (and one PEXPIRE on the window's first count); a window that has passed
-- is simply another key.
-- Invariants: a cost of 0 writes nothing; the TTL is set when a window's first count creates its key and never
-- extended. Denials are counted only when decide.lua says so (a lone fixed window, as in the reference, but never a
-- cost above the limit, which can never fit; a forced hit, whatever its cost). The count stops at MAX_COUNT. A
-- settlement's refund lowers the count of the current window only, never below 0, and keeps the key's expiry.

-- How long a window's key outlives its window: no later window reads it (each has its own key), and a TTL of a few
-- milliseconds (a first hit just before the window ends) could lapse before the next hit of the same window when the
-- decision's time is given to the script rather than read from the server's clock.
local WINDOW_KEY_GRACE_US = 1000000

-- The key of the window of `window` us starting at `start`, from `key`, the key of the window sluice expects (its
-- clock's; the server's may be across an edge, and that window then gets its own key).
-- A window key of envoyproxy/ratelimit's layout (`KeyLayout::Reference` in store/key.rs) is the counter's key, which
-- ends with '_', then the window's start in seconds.
local function window_of(key, start, window)
  local base = string.match(key, '^(.*):%x+$')
  if base == nil then
    local at
    base, at = string.match(key, '^(.*_)(%d+)$')
    if base == nil then error('not a window key: ' .. key, 0) end
    local seconds = (start - start % 1000000) / 1000000
    if tonumber(at) == seconds then return key end
    return base .. string.format('%d', seconds)
  end
  return window_key(base, start, window)
end

-- The count of the window `wkey` (0 if it has none), and whether its key exists.
local function window_count(wkey)
  local n = tonumber(redis.call('GET', wkey))
  if n ~= nil then return n, true end
  return 0, false
end

function L.fixed_window()
  local M = {}

  function M.check(key, now, cost, limit, window)
    local start = now - now % window
    local wkey = window_of(key, start, window)
    local n, exists = window_count(wkey)
    local reset = start + window - now
    local ok = n + cost <= limit
    local retry = 0
    if cost > limit then retry = -1 elseif not ok then retry = reset end
    return {
      ok = ok, used0 = n, used = n + cost, rem0 = max0(limit - n), rem1 = max0(limit - n - cost),
      reset0 = reset, reset1 = reset, retry = retry, n = n, wkey = wkey, exists = exists,
    }
  end

  function M.commit(key, s, now, cost)
    if cost == 0 then return '' end
    local count = string.format('%d', math.min(s.n + cost, MAX_COUNT))
    if s.exists then
      redis.call('SET', s.wkey, count, 'KEEPTTL')
    else
      redis.call('SET', s.wkey, count, 'PX', ceil_ms(s.reset0 + WINDOW_KEY_GRACE_US))
    end
    return ''
  end

  -- Gives back up to `amount` (down to 0) if the hit at `at` was counted in the current window; the key keeps its
  -- expiry.
  function M.refund(key, now, at, amount, limit, window)
    local start = now - now % window
    if at - at % window ~= start then return nil end
    local wkey = window_of(key, start, window)
    local n, exists = window_count(wkey)
    if not exists then return nil end
    local given = math.min(n, amount)
    return given, function()
      redis.call('SET', wkey, string.format('%d', n - given), 'KEEPTTL')
    end
  end
  return M
end
