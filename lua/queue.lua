-- queue.lua: the queue-coupled leaky bucket. An admitted hit appends one entry to a Redis Stream (the descriptor's
-- entries as fields) while the stream holds fewer than `limit` entries; workers read it with a consumer group at
-- their own pace and XDEL what they finished, which frees the place. Any positive cost appends one entry.
--
-- State: the stream. It expires `window` us after the last append, so an abandoned queue goes away.
-- Invariants: a denied hit writes nothing. How soon a full queue drains depends on the workers, so a non-empty
-- queue reports `window` (its idle lifetime) as the time until it is empty and as the retry time: an upper bound
-- while workers run.

A.queue = {}

function A.queue.check(key, now, cost, limit, window)
  local len = redis.call('XLEN', key)
  local slots = 0
  if cost > 0 then slots = 1 end
  local s = { used0 = len, used = len + slots }
  s.ok = len + slots <= limit
  s.rem0 = max0(limit - len)
  s.rem1 = max0(limit - len - slots)
  s.reset0 = 0
  if len > 0 then s.reset0 = window end
  s.reset1 = s.reset0
  if slots > 0 then s.reset1 = window end
  if slots > limit then s.retry = -1 elseif s.ok then s.retry = 0 else s.retry = s.reset0 end
  return s
end

function A.queue.commit(key, s, now, cost, limit, window, burst, id, fields)
  if cost == 0 then return '' end
  local entry = redis.call('XADD', key, '*', unpack(fields))
  redis.call('PEXPIRE', key, ceil_ms(window))
  return entry
end
