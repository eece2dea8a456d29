-- fixed_window.lua: at most `limit` hits per epoch-aligned window of `window` us.
--
-- State: a hash {w = start of the window it counts, n = hits counted in it}. A hash from another window counts as
-- empty. The key expires when its window ends.
-- Invariants: a cost of 0 writes nothing; the TTL is set when a window's first hit creates the count and never
-- extended. Denials are counted only when decide.lua says so (a lone fixed window, as in the reference, but never a
-- cost above the limit, which can never fit; a forced hit, whatever its cost). The count stops at MAX_COUNT. A
-- settlement's refund lowers the count of the current window only, never below 0, and keeps the key's expiry.

function L.fixed_window()
  local M = {}

  function M.check(key, now, cost, limit, window)
    local start = now - now % window
    local f = redis.call('HMGET', key, 'w', 'n')
    local n = 0
    if tonumber(f[1]) == start then n = tonumber(f[2]) end
    local reset = start + window - now
    local ok = n + cost <= limit
    local retry = 0
    if cost > limit then retry = -1 elseif not ok then retry = reset end
    return {
      ok = ok, used0 = n, used = n + cost, rem0 = max0(limit - n), rem1 = max0(limit - n - cost),
      reset0 = reset, reset1 = reset, retry = retry, start = start, n = n,
    }
  end

  function M.commit(key, s, now, cost)
    if cost == 0 then return '' end
    redis.call('HSET', key, 'w', string.format('%d', s.start), 'n', string.format('%d', math.min(s.n + cost, MAX_COUNT)))
    if s.n == 0 then redis.call('PEXPIRE', key, ceil_ms(s.reset0)) end
    return ''
  end

  -- Gives back up to `amount` (down to 0) if the hit at `at` was counted in the current window; the key keeps its
  -- expiry.
  function M.refund(key, now, at, amount, limit, window)
    local start = now - now % window
    if at - at % window ~= start then return nil end
    local f = redis.call('HMGET', key, 'w', 'n')
    if tonumber(f[1]) ~= start then return nil end
    local n = tonumber(f[2]) or 0
    local given = math.min(n, amount)
    return given, function() redis.call('HSET', key, 'n', string.format('%d', n - given)) end
  end
  return M
end
