-- token_bucket.lua: a bucket of `burst` tokens refilled continuously at `limit` per `window`, as GCRA; also the leaky
-- bucket (burst 1 by default: hits evenly spaced).
-- State: one number in the descriptor's packed state (decide.lua), the theoretical arrival time (TAT, us): when the
-- bucket would be full again (0, or any time past, for a full one). The emission interval is ceil(window / limit) us,
-- so the sustained rate is never above the configured one.
-- Invariants: a denied hit writes nothing unless forced: then the TAT moves by its cost, at most burst + 1 tokens, even
-- past the tolerance (a debt that later hits see, draining at the refill rate), up to MAX_DEBT_US past an empty bucket
-- (a debt already past that, after the clock stepped back, is kept). A cost of 0 writes nothing. A settlement's refund
-- moves the TAT back, never before now.

function L.token_bucket()
  local M = { width = 1, slots = 1, burst = true }

  local function interval_of(limit, window)
    local rate = max(limit, 1)
    return floor((window + rate - 1) / rate)
  end

  -- Sees the arrival time, `now` when earlier or none (prelude.lua's interface). A cost above the bucket never fits: it
  -- is not priced (its product could leave the exact range).
  function M.check(p, now, cost, limit, window, burst)
    local interval = interval_of(limit, window)
    local tat = max(P[p], now)
    return cost <= burst and tat + cost * interval - now <= burst * interval, tat, -1, -1
  end

  function M.left(tat, _, _, now, limit, window, burst)
    local interval = interval_of(limit, window)
    return max0(floor((now + burst * interval - tat) / interval))
  end

  function M.commit(p, now, cost, limit, window, burst, force)
    local interval = interval_of(limit, window)
    local tat = max(P[p], now)
    local new = tat + cost * interval
    if force then
      new = max(min(tat + min(cost, burst + 1) * interval, now + burst * interval + MAX_DEBT_US), tat)
    end
    P[p] = new
    return '', new - now
  end

  -- How long the record is kept: until the bucket is full again, rounded up to a multiple of a full bucket's refill
  -- time (at least a second), so hits within one such span keep the packed key's expiry (a write with an expiry costs
  -- Redis about twice one without). A record read after its arrival time is a full bucket all the same.
  function M.lives(p, now, window, limit, burst)
    if P[p] <= now then return 0 end
    local q = max(burst * interval_of(limit, window), 1000000)
    return P[p] - P[p] % q + q - now
  end

  -- Only as many tokens as the arrival time is past `now` are priced, so the product stays exact whatever the amount.
  function M.refund(p, now, _, amount, limit, window)
    local interval = interval_of(limit, window)
    local tat = P[p]
    if tat <= now then return nil end
    -- Back to `now` at most: then only the whole tokens the arrival time was past `now` came back.
    local new, given = now, floor((tat - now) / interval)
    if amount < floor((tat - now + interval - 1) / interval) then new, given = tat - amount * interval, amount end
    return given, function() P[p] = new end
  end

  return M
end
L.leaky_bucket = L.token_bucket
