-- sliding_log.lua: exactly at most `limit` hits in any interval of `window` us; a hit at time t holds a place until
-- t + window. State: a sorted set, one member per hit, score = its time, member "<time>:<n>" (unique: within one time
-- the live count only grows), expiring when its newest hit leaves the interval.
-- Invariants: a denied hit writes nothing; expired members are removed only by an admitted hit.

-- Logs `cost` hits at `now` after the `live` places still in the interval, and keeps the set until the interval passes.
local function sl_add(key, now, live, cost, window)
  -- In batches: Lua's unpack takes a few thousand values at most, and a cost may be up to the limit (10 000).
  local i = 1
  while i <= cost do
    local args = {}
    for j = i, min(cost, i + 499) do
      args[#args + 1] = now
      args[#args + 1] = string.format('%d:%d', now, live + j)
    end
    redis.call('ZADD', key, unpack(args))
    i = i + 500
  end
  redis.call('PEXPIRE', key, px(window))
end

function L.sliding_log()
  local M = {}

  -- Sees the live count, the newest hit's time (read by `unwritten`) and the time that must leave before the hit fits.
  M.width = 3

  function M.check(j, now, cost, limit, window)
    local count, leaving = live_in(K[j], string.format('(%d', now - window), cost, limit)
    return count + cost <= limit, count, -1, leaving
  end

  M.unwritten = newest_in

  -- The places left once the expired ones go are the live ones check counted.
  function M.commit(j, now, cost, _, window, _, _, count)
    local key = K[j]
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
    sl_add(key, now, count, cost, window)
    return '', window
  end
  return M
end
