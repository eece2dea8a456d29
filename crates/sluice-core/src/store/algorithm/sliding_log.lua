-- sliding_log.lua: exactly at most `limit` hits in any interval of `window` us. A hit at time t occupies one place
-- until t + window.
--
-- State: a sorted set, one member per hit, score = its time, member "<time>:<n>" (unique: within one time the live
-- count only grows). It expires when its newest hit leaves the interval.
-- Invariants: a denied hit writes nothing; expired members are removed only by an admitted hit.

-- Logs `cost` hits at `now` in `key`, whose `live` places are the ones still in the interval (the others dropped), and
-- keeps the set until the interval has passed.
local function sl_add(key, now, live, cost, window)
  -- In batches: Lua's unpack takes a few thousand values at most, and a cost may be up to the limit (10 000).
  local i = 1
  while i <= cost do
    local args = {}
    for j = i, math.min(cost, i + 499) do
      args[#args + 1] = now
      args[#args + 1] = string.format('%d:%d', now, live + j)
    end
    redis.call('ZADD', key, unpack(args))
    i = i + 500
  end
  redis.call('PEXPIRE', key, ceil_ms(window))
end

-- The compact hit (batch.lua): a hit on a descriptor with one sliding log and nothing else to write, in the fewest
-- Redis commands and arguments: a ZCOUNT of the live places and, when the hit fits, the expired ones dropped and its
-- hits added (as commit does); when it does not, the newest place and the one that must leave before it fits. Three
-- integers back, from which sluice decides exactly as check would; the differential test holds the two paths to the
-- same answers. Its key is the set's; its arguments (batch.lua reads them): the window, the limit, the cost (bounded by
-- the limit + 1), and the decision's time `now`. Writes into answers[pos] to answers[pos + 2]: the live count, the
-- newest score (-1 unless the hit was not counted and there is one) and the score of the place that must leave before
-- the hit fits (-1 unless it does not fit but could).
local function compact_log(key, window, limit, cost, _, now, pos)
  local since = now - window
  local from = string.format('(%d', since)
  local count = redis.call('ZCOUNT', key, from, '+inf')
  answers[pos], answers[pos + 1], answers[pos + 2] = count, -1, -1
  if cost > 0 and count + cost <= limit then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', since))
    sl_add(key, now, count, cost, window)
    return
  end
  blocking_places(key, from, count, cost, limit, pos)
end

function L.sliding_log()
  local M = {}

  -- Sees the live count, the newest hit's time and the time that must leave before the hit fits (decide.lua's
  -- interface, prelude.lua).
  function M.check(key, now, cost, limit, window)
    local since = string.format('(%d', now - window)
    local count = redis.call('ZCOUNT', key, since, '+inf')
    local newest, leaving = -1, -1
    if count > 0 then newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) end
    if cost <= limit and count + cost > limit then
      leaving = tonumber(redis.call('ZRANGEBYSCORE', key, since, '+inf', 'WITHSCORES', 'LIMIT', count + cost - limit - 1,
        1)[2])
    end
    return count + cost <= limit, count, newest, leaving
  end

  function M.left(count, _, _, _, limit)
    return max0(limit - count)
  end

  function M.commit(key, now, cost, _, window)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
    sl_add(key, now, redis.call('ZCARD', key), cost, window)
    return '', window
  end
  M.hit = compact_log
  return M
end
