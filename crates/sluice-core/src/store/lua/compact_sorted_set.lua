-- compact_sorted_set.lua: a hit on a descriptor with one sliding log or one concurrency limit and nothing else to write,
-- both a sorted set of places (a log's hit times, a concurrency limit's lease deadlines), in the fewest Redis commands
-- and arguments: a ZCOUNT of the live places and, when the hit fits, the expired ones dropped and its places added
-- (as the driver's commit does); when it does not, the newest place and the one that must leave before it fits. Three
-- integers back, from which sluice decides exactly as sliding_log.lua's or concurrency.lua's check would; the
-- differential test holds the two paths to the same answers.
--
-- Its key is the set's; its arguments (batch.lua reads them): 'l' (a log) or 'c' (a concurrency limit), the window,
-- the limit, the cost (bounded by the limit + 1), a concurrency limit's lease id, and the decision's time `now`.
--
-- Writes into answers[pos] to answers[pos + 2]: the live count, the newest score (-1 unless the hit was not counted
-- and there is one) and the score of the place that must leave before the hit fits (-1 unless it does not fit but
-- could).

local function compact_sorted_set(key, log, window, limit, cost, lease, now, pos)
  -- A log's places live until their time + window, a lease's until its deadline; any positive cost takes one lease.
  local since, slots = now, 1
  if log then since, slots = now - window, cost elseif cost == 0 then slots = 0 end
  local from = string.format('(%d', since)
  local count = redis.call('ZCOUNT', key, from, '+inf')
  answers[pos], answers[pos + 1], answers[pos + 2] = count, -1, -1
  if slots > 0 and count + slots <= limit then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', since))
    if log then
      sl_add(key, now, count, cost, window)
    else
      redis.call('ZADD', key, string.format('%d', now + window), lease)
      redis.call('PEXPIRE', key, string.format('%d', ceil_ms(window)))
    end
    return
  end
  if count > 0 then answers[pos + 1] = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) end
  if slots <= limit and count + slots > limit then
    local first = redis.call('ZRANGEBYSCORE', key, from, '+inf', 'WITHSCORES', 'LIMIT', count + slots - limit - 1, 1)
    answers[pos + 2] = tonumber(first[2])
  end
end
