-- bucketed_window.lua: a window of `window` us split into `burst` epoch-aligned sub-windows of `window / burst` us; its
-- count is the sum of the sub-windows it spans, the current one included: exact to one sub-window (a sub-window stops
-- counting `window` after it starts).
-- State: one hash at the counter's key: per sub-window kept, its first microsecond (decimal) -> its count; 't', their
-- sum; 'o', a start no kept sub-window is older than; 'l', the newest kept one's start; 's', the longest window, in
-- sub-windows, of the limits counting in it. sluice names the counter by the sub-window's length, so tiers of one
-- descriptor with the same sub-window (1 000 a second, 5 000 per 10 s) share its counts: in one decision the first
-- of them increments it, and the key lives until the longest window no longer counts its newest sub-window.
-- A hit that fits reads four fields when every kept sub-window is in its window ('t' the count, 'l' the newest
-- non-empty); otherwise it reads its window's sub-windows, and so does a hit that does not fit, to tell when it would.
-- Invariants: a cost of 0 writes nothing; a newer sub-window's first count deletes those no limit's window spans (the
-- hash keeps at most the longest window's), and a count finding nothing spanned starts the hash afresh. Forced hits
-- and settlements never reach it (not a counting algorithm).

-- Per counter written in the decision under way (prelude.lua's `decision`): the TTL (ms) and longest window (in
-- sub-windows) it was given, and whether its expiry moves in this decision.
local bucket_written, written_in = {}, nil

function L.bucketed_window()
  local M = {}

  local function width_of(window, buckets)
    local width = floor(window / buckets)
    if width < 1 then width = 1 end
    return width
  end

  -- The counts of the sub-windows of `key` from `from` to `to` (each `width` apart), oldest first.
  local function counts(key, from, to, width)
    local fields = {}
    for start = from, to, width do fields[#fields + 1] = string.format('%d', start) end
    if #fields == 0 then return {} end
    local c = redis.call('HMGET', key, unpack(fields))
    for i = 1, #fields do c[i] = tonumber(c[i]) or 0 end
    return c
  end

  local function sum(c)
    local n = 0
    for i = 1, #c do n = n + c[i] end
    return n
  end

  -- Sees the count, its newest non-empty sub-window's start and that of the one whose leaving lets the hit fit.
  M.width, M.burst = 3, true

  function M.check(j, now, cost, limit, window, burst)
    local key = K[j]
    local width = width_of(window, burst)
    local current = now - now % width
    -- The sub-windows the window spans: the current one and up to burst - 1 before it, none before the epoch.
    local spanned = min(burst, floor(current / width) + 1)
    local first = current - (spanned - 1) * width
    local f = redis.call('HMGET', key, 't', 'o', 'l', 's')
    local t, o, l = tonumber(f[1]), tonumber(f[2]), tonumber(f[3])
    local s = { current = current, width = width, t = t, o = o, l = l, longest = tonumber(f[4]) or 0 }
    -- The count, the newest non-empty sub-window spanned (-1: none), and the spanned counts if read.
    local n, newest, c = 0, -1, nil
    if t ~= nil and l >= first then
      if o >= first and l <= current then
        n, newest = t, l
      else
        c = counts(key, first, current, width)
        n = sum(c)
        for i = #c, 1, -1 do
          if c[i] > 0 then newest = first + (i - 1) * width; break end
        end
      end
    end
    local leaving = -1
    if cost <= limit and n + cost > limit then
      c = c or counts(key, first, current, width)
      local left = n
      for i = 1, #c do
        left = left - min(c[i], left)
        if left + cost <= limit then leaving = first + (i - 1) * width; break end
      end
    end
    return n + cost <= limit, n, newest, leaving, s
  end

  -- Counts `cost` in the current sub-window (once per decision per counter). The expiry moves only with a newer
  -- sub-window, a longer window or a counter started afresh.
  function M.commit(j, now, cost, _, window, burst, _, _, _, _, s)
    local key = K[j]
    local width, current = s.width, s.current
    local longest = max(s.longest, burst)
    local ttl = ceil_ms(current + window - now)
    if written_in ~= decision then
      if next(bucket_written) ~= nil then bucket_written = {} end
      written_in = decision
    end
    local seen = bucket_written[key]
    if seen ~= nil then
      if (seen[3] or longest > s.longest) and ttl > seen[1] then
        redis.call('PEXPIRE', key, px(current + window - now))
        seen[1] = ttl
      end
      if longest > seen[2] then
        redis.call('HSET', key, 's', string.format('%d', longest))
        seen[2] = longest
      end
      return '', current + window - now
    end
    local at, text = string.format('%d', current), string.format('%d', cost)
    -- The oldest start any limit's window still spans.
    local keep = current - (longest - 1) * width
    local moves = s.t == nil or s.l < keep or current > s.l or longest > s.longest
    if s.t == nil or s.l < keep then
      -- Nothing kept is spanned any more: the counter starts afresh.
      if s.t ~= nil then redis.call('DEL', key) end
      redis.call('HSET', key, at, text, 't', text, 'o', at, 'l', at, 's', string.format('%d', longest))
    else
      redis.call('HINCRBY', key, at, text)
      redis.call('HINCRBY', key, 't', text)
      if current > s.l then
        redis.call('HSET', key, 'l', at)
        if s.o < keep then
          local old = counts(key, s.o, keep - width, width)
          local fields = {}
          for i = 1, #old do fields[i] = string.format('%d', s.o + (i - 1) * width) end
          redis.call('HDEL', key, unpack(fields))
          local gone = sum(old)
          if gone > 0 then redis.call('HINCRBY', key, 't', string.format('%d', -gone)) end
          redis.call('HSET', key, 'o', string.format('%d', keep))
        end
      elseif current < s.o then
        redis.call('HSET', key, 'o', at)
      end
      if longest > s.longest then redis.call('HSET', key, 's', string.format('%d', longest)) end
    end
    if moves then redis.call('PEXPIRE', key, px(current + window - now)) end
    bucket_written[key] = { ttl, longest, moves }
    return '', current + window - now
  end

  return M
end
