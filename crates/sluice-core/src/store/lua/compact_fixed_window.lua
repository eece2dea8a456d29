-- compact_fixed_window.lua: the most common call, a hit on a descriptor with one fixed-window limit and nothing else to
-- write, in the fewest Redis commands and arguments: one INCRBY of the window's count (a GET for a cost that is not
-- counted), one PEXPIRE on the window's first count, two or three arguments, and an integer back. The decision itself
-- (whether the hit fits, what is left, when to retry) is made by sluice from that integer, the limit and the time,
-- exactly as fixed_window.lua's check would make it; the differential test holds the two paths to the same answers.
--
-- Its key is the window's key (prelude.lua's `window_key`: the counter's key, ':', the window's number), built by
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
  if guess ~= nil and start ~= guess - guess % window then key = window_of(key, start, window) end
  if cost == 0 then return (window_count(key)) end
  local n = redis.call('INCRBY', key, text)
  if n == cost then
    -- The window's first count: set the window's expiry.
    redis.call('PEXPIRE', key, ceil_ms(start + window - now + WINDOW_KEY_GRACE_US))
  end
  if n > MAX_COUNT then redis.call('SET', key, string.format('%d', MAX_COUNT), 'KEEPTTL') end
  return n - cost
end

-- What windows 1 to `upto` of the compact_windows call at ARGV[a] counted, taken back (`fresh[j]` set where window j
-- was created by its count).
local function windows_undo(keys, a, upto, fresh)
  for j = 1, upto do
    local text = ARGV[a + 3 * j]
    if number(text) > 0 and redis.call('INCRBY', keys[j], '-' .. text) == 0 and fresh[j] then
      redis.call('DEL', keys[j])
    end
  end
end

-- Per window of the compact_windows call under way, what a window's first count leaves to finish (what is left of the
-- window): kept from call to call and cleared as it is used, so that a hit allocates nothing.
local windows_fresh = {}

-- Several fixed windows on one descriptor (a second, a minute and an hour of one caller), decided together, all or
-- nothing, as decide.lua decides them: one INCRBY of each window's count by its cost, taken back (an INCRBY of minus the cost, and a
-- DEL of a count the hit created) when the hit does not fit every window, so that a hit that fits, the common case, costs one
-- command per window and no read before it (a GET for a window whose cost is 0). A window's first count sets the
-- window's expiry. Its keys are the windows' keys (as a lone fixed
-- window's); its arguments, at ARGV[a] on: the number of windows t, then per window the window, the limit and the cost
-- (bounded by the limit + 1; 0 checks the window without counting in it). `now` and `guess` as above.
--
-- Writes the windows' counts before the hit into answers[pos] to answers[pos + t - 1]; sluice decides from them: the
-- hit fits when every window's count plus its cost is at most its limit, and was counted when it fits and some cost
-- is positive. Denials count nothing: the script runs atomically, so no one sees a count it takes back. With
-- `written`, a hit that fits and was counted then calls written(rkey, a, t, now, ttl) (a reservation writes its record:
-- compact_reservation.lua); if that fails, the hit is taken back and the error raised, so a descriptor is still
-- counted whole or not at all.
local function compact_windows(keys, a, now, guess, pos, written, rkey, ttl)
  local t = number(ARGV[a])
  local fits, positive, fresh, any = true, false, windows_fresh, false
  for j = 1, t do fresh[j] = nil end
  for j = 1, t do
    local window, b = number(ARGV[a + 3 * j - 2]), a + 3 * j
    local start = now - now % window
    local key = keys[j]
    if guess ~= nil and start ~= guess - guess % window then
      key = window_of(key, start, window)
      keys[j] = key
    end
    local text = ARGV[b]
    local cost = number(text)
    -- A key of the wrong type, or one this node does not serve: what the earlier windows counted is taken back first,
    -- so a descriptor is counted whole or not at all.
    local n
    if cost > 0 then n = redis.pcall('INCRBY', key, text) else n = redis.pcall('GET', key) end
    if type(n) == 'table' and n.err then
      windows_undo(keys, a, j - 1, fresh)
      error(n, 0)
    end
    n = tonumber(n)
    if cost > 0 then
      positive = true
      n = n - cost
    end
    if n == nil then
      n = 0
    elseif cost > 0 and n == 0 then
      -- The window's first count: what is left of the window, for its expiry once the hit is known to fit.
      fresh[j] = start + window - now
      any = true
    end
    answers[pos + j - 1] = n
    if n + cost > number(ARGV[b - 1]) then fits = false end
  end
  if not positive then return end
  if not fits then return windows_undo(keys, a, t, fresh) end
  if written ~= nil then
    local ok, err = pcall(written, rkey, a, t, now, ttl)
    if not ok then
      windows_undo(keys, a, t, fresh)
      error(err, 0)
    end
  end
  if not any then return end
  for j = 1, t do
    local f = fresh[j]
    if f ~= nil then redis.call('PEXPIRE', keys[j], ceil_ms(f + WINDOW_KEY_GRACE_US)) end
  end
end
