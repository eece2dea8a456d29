-- decide.lua: decides one descriptor against all its tiers at once, atomically.
--
-- decide(k, nk, a) reads the descriptor's nk keys from KEYS[k] and its arguments from ARGV[a] (batch.lua passes
-- the offsets); below, KEYS[i] and ARGV[i] are relative to those.
-- KEYS[1..t]  one state key per tier (all with the same hash tag: one cluster slot)
-- KEYS[t+1]   the hit-record list, present when ARGV[5] > 0
-- KEYS[last]  the reservation record, in the modes 'reserve', 'reserve_report' and 'settle'
-- ARGV[1]     mode: 'hit' applies the hit, 'peek' only reports (and returns the hit records), 'report' applies a
--             forced hit: every tier counts its cost whether it fits or not (a usage that already happened; sent
--             only when every tier is fixed_window, sliding_window, token_bucket or leaky_bucket, see `Hit::forced`);
--             'reserve' and 'reserve_report' are 'hit' and 'report' that also write the reservation record KEYS[last]
--             when the hit is counted, and 'settle' settles the reservation KEYS[last] with the actual cost ARGV[3]
--             (see settle below); these three are sent only when every tier counts (see `Hit::reserves`), and
--             'settle' with no hit records and no queue fields
-- ARGV[2]     now in microseconds, or '' to read the server's clock (TIME): one clock for every sluice instance
-- ARGV[3]     cost (0: check without consuming)
-- ARGV[4]     lease id for concurrency tiers
-- ARGV[5]     hit records to keep (0: none)     ARGV[6]  the value to record
-- ARGV[7]     f, the number of queue entry fields, then the f fields (name, value, name, value, ...)
-- then per tier 4 values: algorithm, limit, window (us), burst
-- then, in the modes 'reserve' and 'reserve_report', the reservation record's TTL in us
--
-- Returns { admitted (0/1), then per tier: ok, used, remaining, reset (us), retry (us, -1 never), id,
--           then in peek mode the recorded values, newest first }.
-- remaining is what is left after a committed hit, what is left now otherwise, and 0 for a tier a hit does not fit
-- (but what is left after it for a forced hit, which every tier counts); used is the count after a committed or
-- hypothetical hit, the count now for a peek. For a forced hit, admitted, ok and retry are an ordinary hit's.
-- In settle mode: { 0 } when there is no such reservation, else { 1, estimate, charged, refunded, admitted, then per
-- tier the six values of a peek of cost 1 after settling }.
--
-- Invariants: either every tier is committed or none, except that a lone fixed window counts its denials as the
-- reference does (but never a cost above its limit, which can never fit), and that a forced hit of a positive cost
-- commits every tier. A peek never writes. Hit records expire with the longest-lived tier. A reservation record
-- is written only by a hit that is admitted and committed (or forced) with a positive cost: a hash {e = the cost
-- charged, t = now, x = when it expires by the decision's clock}, expiring then. It is written before any tier, and a
-- settlement reads the record and every tier before it writes, so a key of the wrong type stops either before it
-- changes anything.

-- The estimate and charged-at time of the reservation record `rkey`, or nil. A record is judged by the decision's
-- clock: one whose x has come is gone, whether or not Redis has expired the key yet (it expires by its own clock).
local function live_reservation(rkey, now)
  local f = redis.call('HMGET', rkey, 'e', 't', 'x')
  local e, at, x = tonumber(f[1]), tonumber(f[2]), tonumber(f[3])
  if e == nil or at == nil or x == nil or x <= now then return nil end
  return e, at
end

-- Settles the reservation `rkey` at `now` with the actual cost `actual` (bounded as any cost) over the tiers
-- (impls, params, from KEYS[k]): reads and deletes the record, then counts `actual - estimate` on every tier as a
-- forced hit would, or gives `estimate - actual` back to every tier by its algorithm's refund, and reports each
-- tier as a peek of cost 1 does. No record (expired, settled, never written): { 0 }, nothing written.
local function settle(k, tiers, impls, params, rkey, now, actual)
  for i = 1, tiers do
    if impls[i].refund == nil then return { 0 } end
  end
  local e, at = live_reservation(rkey, now)
  if e == nil then return { 0 } end
  local charged, refunded = 0, 0
  if actual > e then
    charged = actual - e
    local states = {}
    for i = 1, tiers do
      local p = params[i]
      states[i] = impls[i].check(KEYS[k + i - 1], now, charged, p[1], p[2], p[3], true)
    end
    redis.call('DEL', rkey)
    for i = 1, tiers do
      local p = params[i]
      impls[i].commit(KEYS[k + i - 1], states[i], now, charged, p[1], p[2], p[3], '', {})
    end
  elseif actual < e then
    refunded = e - actual
    local writes = {}
    for i = 1, tiers do
      local p = params[i]
      writes[i] = impls[i].refund(KEYS[k + i - 1], now, at, refunded, p[1], p[2], p[3]) or false
    end
    redis.call('DEL', rkey)
    for i = 1, tiers do
      if writes[i] then writes[i]() end
    end
  end
  local out = { 1, e, charged, refunded, 1 }
  local n = 5
  for i = 1, tiers do
    local p = params[i]
    local s = impls[i].check(KEYS[k + i - 1], now, 1, p[1], p[2], p[3], false)
    if not s.ok then out[5] = 0 end
    out[n + 1] = s.ok and 1 or 0
    out[n + 2] = s.used0
    out[n + 3] = s.rem0
    out[n + 4] = s.reset0
    out[n + 5] = s.retry
    out[n + 6] = ''
    n = n + 6
  end
  -- At the estimate nothing else changes: the tiers were read (above) before the record goes.
  if actual == e then redis.call('DEL', rkey) end
  return out
end

local function decide(k, nk, a)
  local function arg(i) return ARGV[a + i - 1] end
  local mode = arg(1)
  local reserving = mode == 'reserve' or mode == 'reserve_report'
  if mode == 'reserve' then mode = 'hit' elseif mode == 'reserve_report' then mode = 'report' end
  local now = clock(arg(2))
  local cost = tonumber(arg(3))
  local forced = mode == 'report' and cost > 0
  local id = arg(4)
  local record_size = tonumber(arg(5))
  local record_value = arg(6)
  local nfields = tonumber(arg(7))
  local fields = {}
  for i = 1, nfields do fields[i] = arg(7 + i) end
  local first = 8 + nfields
  local tiers = nk
  if record_size > 0 then tiers = tiers - 1 end
  if reserving or mode == 'settle' then tiers = tiers - 1 end

  local impls, states, params = {}, {}, {}
  for i = 1, tiers do
    local base = first + (i - 1) * 4
    local impl = algorithm(arg(base))
    if impl == nil then error('unknown algorithm ' .. tostring(arg(base)), 0) end
    impls[i], params[i] = impl, { tonumber(arg(base + 1)), tonumber(arg(base + 2)), tonumber(arg(base + 3)) }
  end
  if mode == 'settle' then return settle(k, tiers, impls, params, KEYS[k + nk - 1], now, cost) end

  local admitted = true
  for i = 1, tiers do
    local p = params[i]
    local s = impls[i].check(KEYS[k + i - 1], now, cost, p[1], p[2], p[3], forced)
    states[i] = s
    admitted = admitted and s.ok
  end

  local commit = forced or (mode == 'hit' and cost > 0 and
    (admitted or (tiers == 1 and arg(first) == 'fixed_window' and cost <= params[1][1])))
  if reserving and commit and (forced or admitted) then
    local rkey, ttl = KEYS[k + nk - 1], ceil_ms(tonumber(arg(first + 4 * tiers)))
    redis.call('HSET', rkey, 'e', string.format('%d', cost), 't', string.format('%d', now),
      'x', string.format('%d', now + ttl * 1000))
    redis.call('PEXPIRE', rkey, ttl)
  end
  local out = { admitted and 1 or 0 }
  local n = 1
  local longest = 0
  for i = 1, tiers do
    local s, entry = states[i], ''
    local remaining, reset = s.rem0, s.reset0
    if commit then
      local p = params[i]
      entry = impls[i].commit(KEYS[k + i - 1], s, now, cost, p[1], p[2], p[3], id, fields)
      remaining, reset = s.rem1, s.reset1
    end
    if mode ~= 'peek' and not forced and not s.ok then remaining = 0 end
    if reset > longest then longest = reset end
    local used = s.used
    if mode == 'peek' then used = s.used0 end
    out[n + 1] = s.ok and 1 or 0
    out[n + 2] = used
    out[n + 3] = remaining
    out[n + 4] = reset
    out[n + 5] = s.retry
    out[n + 6] = entry
    n = n + 6
  end

  if record_size > 0 then
    local rkey = KEYS[k + tiers]
    if commit then
      redis.call('LPUSH', rkey, record_value)
      redis.call('LTRIM', rkey, 0, record_size - 1)
      redis.call('PEXPIRE', rkey, ceil_ms(math.max(longest, 1)))
    elseif mode == 'peek' then
      local values = redis.call('LRANGE', rkey, 0, record_size - 1)
      for _, v in ipairs(values) do n = n + 1; out[n] = v end
    end
  end
  return out
end
