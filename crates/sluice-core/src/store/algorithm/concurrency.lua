-- concurrency.lua: at most `limit` requests in flight. An admitted hit holds one lease until the caller releases it
-- (ZREM by the Release RPC) or until its deadline, `window` us after admission, so a crashed caller never leaks
-- capacity. Any positive cost takes one lease.
--
-- State: a sorted set of leases, member = lease id, score = deadline. It expires with the latest deadline.
-- Invariants: a denied hit writes nothing; expired leases are removed only by an admitted hit.

function L.concurrency()
  local M = {}

  -- Sees the live count, the latest deadline (read by `unwritten`: a hit written leaves it its own) and the deadline
  -- that must pass before the hit fits (decide.lua's interface, prelude.lua).
  M.width = 3

  function M.check(j, now, cost, limit)
    local key = K[j]
    local live = string.format('(%d', now)
    local count = redis.call('ZCOUNT', key, live, '+inf')
    local slots, leaving = 0, -1
    if cost > 0 then slots = 1 end
    if slots <= limit and count + slots > limit then
      leaving = tonumber(redis.call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', count + slots - limit - 1,
        1)[2])
    end
    return count + slots <= limit, count, -1, leaving
  end

  function M.unwritten(j, count, latest, leaving)
    if count > 0 then latest = tonumber(redis.call('ZRANGE', K[j], -1, -1, 'WITHSCORES')[2]) end
    return count, latest, leaving
  end

  function M.left(count, _, _, _, limit)
    return max0(limit - count)
  end

  function M.commit(j, now, _, _, window, _, _, _, _, _, _, id)
    local key = K[j]
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    redis.call('ZADD', key, now + window, id)
    redis.call('PEXPIRE', key, ceil_ms(window))
    return id, window
  end
  return M
end
