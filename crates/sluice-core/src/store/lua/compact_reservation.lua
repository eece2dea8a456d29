-- compact_reservation.lua: a cost budget's two calls on a descriptor whose limits are all fixed windows, in the
-- fewest commands: a reservation is compact_windows' INCRBYs and the record's write; a settlement reads the record,
-- moves each window by the difference between the actual cost and the estimate (one INCRBY, of a negative amount for
-- a refund), and deletes the record. sluice decides from the counts, as decide.lua's modes 'reserve' and 'settle'
-- decide on fixed windows (the differential test holds the two paths to the same answers).
--
-- The record is decide.lua's (record_write): each window's estimate, in order, joined by ',', when it was charged, and
-- when it expires by the decision's clock.

-- Its functions are made on the first reservation or settlement of a call (`reservation_forms`): a call without one
-- does not pay for them.
local reservations
local function reservation_forms()
  if reservations ~= nil then return reservations end
  -- Writes a reservation's record `rkey` for the windows whose arguments compact_windows read from ARGV[a] on (the
  -- costs sluice sends are decimal integers, as the record keeps them), charged at `now`, for `ttl` milliseconds.
  local function write_reservation(rkey, a, t, now, ttl)
    local e = ARGV[a + 3]
    if t > 1 then
      local costs = {}
      for j = 1, t do costs[j] = ARGV[a + 3 * j] end
      e = table.concat(costs, ',')
    end
    record_write(rkey, e, now, ttl)
  end

  -- A reservation: as compact_windows (its arguments at ARGV[a] on: t, then per window the window, the limit and the
  -- cost), then the record's TTL in microseconds at ARGV[a + 3t + 1]. A hit that fits and counts something also writes
  -- the record `rkey`, after the windows and before their first counts' expiries; a record that cannot be written
  -- takes the hit back. Writes the windows' counts before the hit as compact_windows does.
  local function compact_reserve(keys, rkey, a, now, guess, pos)
    local t = number(ARGV[a])
    compact_windows(keys, a, now, guess, pos, write_reservation, rkey, ceil_ms(number(ARGV[a + 3 * t + 1])))
  end

  -- One window of a settlement: its window's key `key` (for the server's clock), the window, the estimate and the actual
  -- cost, the time `at` the reservation was charged. Counts a larger actual cost as a forced hit of the difference, or
  -- gives a smaller one back with an INCRBY of minus the difference, set right where fewer were counted. Returns what came back, the window's
  -- count after (nil: not written, to be read), and what to take back if a later window fails (the count added, and
  -- whether the key was created); and in `fresh[j]` what to finish once every window is written.
  local function settle_window(j, key, window, estimate, actual, at, now, fresh)
    local start = now - now % window
    if actual > estimate then
      local c = actual - estimate
      local n = redis.call('INCRBY', key, string.format('%d', c))
      -- Perhaps the window's first count: it sets the expiry, below.
      if n == c then fresh[j] = start + window - now end
      return 0, n, c, n == c
    end
    if estimate <= actual or at - at % window ~= start then return 0, nil, 0, false end
    local r = estimate - actual
    local n = redis.call('INCRBY', key, string.format('%d', -r))
    if n >= 0 then return r, n, -r, false end
    if n > -r then
      -- Fewer than r were counted: all of them come back.
      redis.call('INCRBY', key, string.format('%d', -n))
      return n + r, 0, -(n + r), false
    end
    -- The window counted nothing: its key held 0, or the INCRBY created it. Either way it goes, which reads the same.
    redis.call('DEL', key)
    return 0, 0, 0, false
  end

  local settle_done, settle_fresh = {}, {}

  -- A settlement: its arguments at ARGV[a] on, t, then per window the window, the limit (unused here) and the actual
  -- cost; its keys the windows' (for sluice's clock, rebuilt for the server's as compact_windows does) and the record's.
  --
  -- Writes into answers[pos] 1 if the record was found live with one estimate per window (else 0, and nothing is
  -- written), then per window from answers[pos + 1] on: its estimate, what was given back (a refund reaches only the
  -- window the reservation was counted in, if it is still the current one, and never below 0), and the window's count
  -- after the settlement, which sluice reports as a peek of cost 1.
  --
  -- A window charged more counts the difference as a forced hit (its first count sets the expiry); one charged less
  -- gives it back. A command refused (a key of the wrong type) takes back what the earlier windows did, before the
  -- record is deleted: a settlement is whole or not at all.
  local function compact_settle(keys, rkey, a, now, guess, pos)
    local t = number(ARGV[a])
    for j = 0, 3 * t do answers[pos + j] = 0 end
    local e, at = live_reservation(rkey, now, t, false)
    if e == nil then return end
    -- What the windows did, to take back if a later one fails: the key, the count added, whether the key was created
    -- (with more than one window); and what a window's first count leaves to finish.
    local done, fresh = settle_done, settle_fresh
    for j = 1, #done do done[j] = nil end
    for j = 1, t do fresh[j] = nil end
    for j = 1, t do
      local window = number(ARGV[a + 3 * j - 2])
      local key = keys[j]
      if guess ~= nil and now - now % window ~= guess - guess % window then
        key = window_of(key, now - now % window, window)
        keys[j] = key
      end
      local ok, given, after, added, created = pcall(settle_window, j, key, window, e[j], number(ARGV[a + 3 * j]), at,
        now, fresh)
      if not ok then
        for i = #done - 2, 1, -3 do
          if done[i + 1] ~= 0 and redis.call('INCRBY', done[i], string.format('%d', -done[i + 1])) == 0 and done[i + 2] then
            redis.call('DEL', done[i])
          end
        end
        error(given, 0)
      end
      if t > 1 then done[#done + 1], done[#done + 2], done[#done + 3] = key, added, created end
      answers[pos + 3 * j - 2], answers[pos + 3 * j - 1], answers[pos + 3 * j] = e[j], given, after or false
    end
    redis.call('DEL', rkey)
    answers[pos] = 1
    for j = 1, t do
      local f, n = fresh[j], answers[pos + 3 * j]
      if f ~= nil then redis.call('PEXPIRE', keys[j], ceil_ms(f + WINDOW_KEY_GRACE_US)) end
      if n and n > MAX_COUNT then
        redis.call('SET', keys[j], string.format('%d', MAX_COUNT), 'KEEPTTL')
        n = MAX_COUNT
      end
      if not n then n = window_count(keys[j]) end
      answers[pos + 3 * j] = n
    end
  end

  reservations = { reserve = compact_reserve, settle = compact_settle }
  return reservations
end
