-- compact_fixed_window.lua: the most common call, a hit on a descriptor with one fixed-window limit and nothing else to
-- write, in the fewest Redis commands and arguments: one INCRBY of the window's count (a GET for a cost that is not
-- counted), one PEXPIRE on the window's first count, two or three arguments, and an integer back. The decision itself
-- (whether the hit fits, what is left, when to retry) is made by sluice from that integer, the limit and the time,
-- exactly as fixed_window.lua's check would make it; the differential test holds the two paths to the same answers.
--
-- Its key is the window's key (fixed_window.lua's `window_of`: the counter's key, ':', the window's start), built by
-- sluice; its arguments (batch.lua reads them): the window in microseconds, the cost to count (0 for a hit that is
-- not counted: a cost of 0, or one above the limit, which can never fit; a positive cost is at most the limit), the
-- decision's time `now` (`text` is the cost as the arguments spell it: Redis takes a string for less than a
-- number), and `guess`: nil when sluice gave the time, else the time by sluice's clock the key was
-- built for, `now` being the server's; if the server's window is another (the two clocks straddle a window's edge),
-- the key is rebuilt for the server's window.
--
-- Returns the window's count before the hit. Denials are counted as the reference counts them: sluice sends the cost
-- whether or not it will fit. A count past MAX_COUNT stays there.

local function compact_fixed_window(key, window, cost, text, now, guess)
  local start = now - now % window
  if guess ~= nil and start ~= guess - guess % window then key = window_of(key, start) end
  if cost == 0 then
    local n = tonumber(redis.call('GET', key))
    if n == nil then n = legacy(string.match(key, '^(.*):%d+$'), start) end
    return n
  end
  local n = redis.call('INCRBY', key, text)
  if n == cost then
    -- The window's first count: fold in a counter of the previous form, and set the window's expiry.
    local base = string.match(key, '^(.*):%d+$')
    local old, found = legacy(base, start)
    if found then
      redis.call('DEL', base)
      if old > 0 then n = redis.call('INCRBY', key, old) end
    end
    redis.call('PEXPIRE', key, ceil_ms(start + window - now + WINDOW_KEY_GRACE_US))
  end
  if n > MAX_COUNT then redis.call('SET', key, string.format('%d', MAX_COUNT), 'KEEPTTL') end
  return n - cost
end

-- Several fixed windows on one descriptor (a second, a minute and an hour of one caller), decided together, all or
-- nothing, as decide.lua decides them: a GET of each window's count and, when the hit fits every window, one INCRBY
-- each (a SET with its expiry for a window's first count). Its keys are the windows' keys (as a lone fixed window's);
-- its arguments, at ARGV[a] on: the number of windows t, then per window the window, the limit and the cost (bounded
-- by the limit + 1; 0 checks the window without counting in it). `now` and `guess` as above.
--
-- Writes the windows' counts before the hit into answers[pos] to answers[pos + t - 1]; sluice decides from them: the
-- hit fits when every window's count plus its cost is at most its limit, and was counted when it fits and some cost
-- is positive. Denials count nothing.
local function compact_windows(keys, a, now, guess, pos)
  local t = number(ARGV[a])
  local fits, positive, fresh = true, false, nil
  for j = 1, t do
    local window, b = number(ARGV[a + 3 * j - 2]), a + 3 * j
    local start = now - now % window
    local key = keys[j]
    if guess ~= nil and start ~= guess - guess % window then
      key = window_of(key, start)
      keys[j] = key
    end
    local n = tonumber(redis.call('GET', key))
    if n == nil then
      local base = string.match(key, '^(.*):%d+$')
      local old, found = legacy(base, start)
      n = old
      fresh = fresh or {}
      fresh[j] = { base, found, start + window - now }
    end
    answers[pos + j - 1] = n
    local cost = number(ARGV[b])
    if n + cost > number(ARGV[b - 1]) then fits = false end
    if cost > 0 then positive = true end
  end
  if not (fits and positive) then return end
  for j = 1, t do
    local text = ARGV[a + 3 * j]
    local cost = number(text)
    if cost > 0 then
      local f = fresh and fresh[j]
      if not f then
        redis.call('INCRBY', keys[j], text)
      else
        redis.call('SET', keys[j], string.format('%d', answers[pos + j - 1] + cost), 'PX',
          ceil_ms(f[3] + WINDOW_KEY_GRACE_US))
        if f[2] then redis.call('DEL', f[1]) end
      end
    end
  end
end
