-- queue.lua: the queue-coupled leaky bucket. An admitted hit (any positive cost) appends one entry, the descriptor's
-- entries as fields, to a Redis Stream while fewer than `limit` wait; workers read it with a consumer group and XDEL
-- what they finish, freeing the place. An entry waits at most `window` us: older ones count as abandoned and are
-- trimmed by the next append.
-- State: the stream. Entry ids are `<ms>-<seq>` by the decision's clock, so an entry's id is its age. The key expires
-- `window` after the last append, when every entry would be stale anyway.
-- Invariants: a denied hit writes nothing. How soon a full queue drains depends on the workers: `retry` is when its
-- oldest entry goes stale, an upper bound while workers run.

function L.queue()
  local M = {}

  -- The smallest id that is still waiting at `now`: entries with ms * 1000 + window <= now are stale.
  local function queue_cutoff(now, window)
    return floor(max(0, now - window) / 1000) + 1
  end

  local function ms_of(id)
    return tonumber(string.match(id, '^(%d+)-'))
  end

  -- Sees the waiting count, the newest entry's millisecond and that of the one that must go stale before the hit fits.
  M.width = 4

  function M.check(j, now, cost, limit, window)
    local waiting = redis.call('XREVRANGE', K[j], '+', string.format('%d', queue_cutoff(now, window)), 'COUNT', limit + 1)
    local len, slots, newest, leaving = #waiting, 0, -1, -1
    if cost > 0 then slots = 1 end
    if len > 0 then newest = ms_of(waiting[1][1]) end
    if slots <= limit and len + slots > limit then leaving = ms_of(waiting[limit - slots + 1][1]) end
    return len + slots <= limit, len, newest, leaving
  end

  function M.commit(j, now, _, _, window, _, _, _, _, _, _, _, fields)
    local key = K[j]
    redis.call('XTRIM', key, 'MINID', string.format('%d', queue_cutoff(now, window)))
    local ms = floor(now / 1000)
    local added = redis.pcall('XADD', key, string.format('%d-*', ms), unpack(fields))
    if type(added) == 'table' and added.err then
      -- The clock went back behind the stream's last id (entries may since be deleted): append right after that id.
      local info = redis.call('XINFO', 'STREAM', key)
      local last = '0-0'
      for i = 1, #info, 2 do
        if info[i] == 'last-generated-id' then last = info[i + 1] end
      end
      local last_ms, last_seq = string.match(last, '^(%d+)-(%d+)$')
      added = redis.call('XADD', key, last_ms .. '-' .. string.format('%d', tonumber(last_seq) + 1), unpack(fields))
    end
    redis.call('PEXPIRE', key, px(window))
    return added, floor(now / 1000) * 1000 + window - now
  end
  return M
end
