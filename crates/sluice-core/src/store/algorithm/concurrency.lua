-- concurrency.lua: at most `limit` requests in flight. An admitted hit holds one lease until the caller releases it
-- (ZREM by the Release RPC) or until its deadline, `window` us after admission, so a crashed caller never leaks
-- capacity. Any positive cost takes one lease.
--
-- State: a sorted set of leases, member = lease id, score = deadline. It expires with the latest deadline.
-- Invariants: a denied hit writes nothing; expired leases are removed only by an admitted hit.

-- The compact hit (batch.lua): a hit on a descriptor with one concurrency limit and nothing else to write, in the
-- fewest Redis commands and arguments: a ZCOUNT of the live places and, when the hit fits, the expired ones dropped and
-- its lease added (as commit does); when it does not, the newest place and the one that must leave before it fits.
-- Three integers back, from which sluice decides exactly as check would; the differential test holds the two paths to
-- the same answers. Its key is the set's; its arguments (batch.lua reads them): the window, the limit, the cost
-- (bounded by the limit + 1), the lease id and the decision's time `now`. Writes into answers[pos] to answers[pos + 2]:
-- the live count, the newest score (-1 unless the hit was not counted and there is one) and the score of the place that
-- must leave before the hit fits (-1 unless it does not fit but could).
local function compact_lease(key, window, limit, cost, lease, now, pos)
  local slots = 0
  if cost > 0 then slots = 1 end
  local from = string.format('(%d', now)
  local count = redis.call('ZCOUNT', key, from, '+inf')
  answers[pos], answers[pos + 1], answers[pos + 2] = count, -1, -1
  if slots > 0 and count + slots <= limit then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
    redis.call('ZADD', key, string.format('%d', now + window), lease)
    redis.call('PEXPIRE', key, string.format('%d', ceil_ms(window)))
    return
  end
  blocking_places(key, from, count, slots, limit, pos)
end

function L.concurrency()
  local M = {}

  -- Sees the live count, the latest deadline and the deadline that must pass before the hit fits (decide.lua's
  -- interface, prelude.lua).
  function M.check(key, now, cost, limit)
    local live = string.format('(%d', now)
    local count = redis.call('ZCOUNT', key, live, '+inf')
    local slots, latest, leaving = 0, -1, -1
    if cost > 0 then slots = 1 end
    if count > 0 then latest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) end
    if slots <= limit and count + slots > limit then
      leaving = tonumber(redis.call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', count + slots - limit - 1,
        1)[2])
    end
    return count + slots <= limit, count, latest, leaving
  end

  function M.left(count, _, _, _, limit)
    return max0(limit - count)
  end

  function M.commit(key, now, _, _, window, _, _, _, _, _, _, id)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    redis.call('ZADD', key, now + window, id)
    redis.call('PEXPIRE', key, ceil_ms(window))
    return id, window
  end
  M.hit = compact_lease
  return M
end
