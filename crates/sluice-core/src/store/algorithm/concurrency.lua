-- concurrency.lua: at most `limit` requests in flight. An admitted hit (any positive cost) holds one lease until the
-- caller releases it (ZREM, the Release RPC) or its deadline, `window` us after admission: a crashed caller never
-- leaks capacity. State: a sorted set of leases, member = lease id, score = deadline, expiring with the latest.
-- Invariants: a denied hit writes nothing; expired leases are removed only by an admitted hit.

function L.concurrency()
  local M = {}

  -- Sees the live count, the latest deadline (read by `unwritten`) and the deadline that must pass before the hit fits.
  M.width = 3

  function M.check(j, now, cost, limit)
    local slots = 0
    if cost > 0 then slots = 1 end
    local count, leaving = live_in(K[j], string.format('(%d', now), slots, limit)
    return count + slots <= limit, count, -1, leaving
  end

  M.unwritten = newest_in

  function M.commit(j, now, _, _, window, _, _, _, _, _, _, id)
    local key = K[j]
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    redis.call('ZADD', key, now + window, id)
    redis.call('PEXPIRE', key, px(window))
    return id, window
  end
  return M
end
