-- concurrency.lua: at most `limit` requests in flight. An admitted hit holds one lease until the caller releases it
-- (ZREM by the Release RPC) or until its deadline, `window` us after admission, so a crashed caller never leaks
-- capacity. Any positive cost takes one lease.
--
-- State: a sorted set of leases, member = lease id, score = deadline. It expires with the latest deadline.
-- Invariants: a denied hit writes nothing; expired leases are removed only by an admitted hit.

function L.concurrency()
  local M = {}

  function M.check(key, now, cost, limit, window)
    local live = string.format('(%d', now)
    local count = redis.call('ZCOUNT', key, live, '+inf')
    local slots = 0
    if cost > 0 then slots = 1 end
    local s = { used0 = count, used = count + slots }
    s.ok = count + slots <= limit
    s.rem0 = max0(limit - count)
    s.rem1 = max0(limit - count - slots)
    s.reset0 = 0
    if count > 0 then
      local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      s.reset0 = tonumber(last[2]) - now
    end
    s.reset1 = s.reset0
    if slots > 0 then s.reset1 = window end
    if slots > limit then
      s.retry = -1
    elseif s.ok then
      s.retry = 0
    else
      local first = redis.call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', count + slots - limit - 1, 1)
      s.retry = tonumber(first[2]) - now
    end
    return s
  end

  function M.commit(key, s, now, cost, limit, window, burst, id)
    if cost == 0 then return '' end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    redis.call('ZADD', key, now + window, id)
    redis.call('PEXPIRE', key, ceil_ms(window))
    return id
  end
  return M
end
