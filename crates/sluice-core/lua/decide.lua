-- decide.lua: decides one descriptor against all its tiers at once, atomically.
--
-- decide(k, nk, a) reads the descriptor's nk keys from KEYS[k] and its arguments from ARGV[a] (batch.lua passes
-- the offsets); below, KEYS[i] and ARGV[i] are relative to those.
-- KEYS[1..t]  one state key per tier (all with the same hash tag: one cluster slot)
-- KEYS[t+1]   the hit-record list, present when ARGV[5] > 0
-- ARGV[1]     mode: 'hit' applies the hit, 'peek' only reports (and returns the hit records), 'report' applies a
--             forced hit: every tier counts its cost whether it fits or not (a usage that already happened; sent
--             only when every tier is fixed_window, sliding_window, token_bucket or leaky_bucket, see `Hit::forced`)
-- ARGV[2]     now in microseconds, or '' to read the server's clock (TIME): one clock for every sluice instance
-- ARGV[3]     cost (0: check without consuming)
-- ARGV[4]     lease id for concurrency tiers
-- ARGV[5]     hit records to keep (0: none)     ARGV[6]  the value to record
-- ARGV[7]     f, the number of queue entry fields, then the f fields (name, value, name, value, ...)
-- then per tier 4 values: algorithm, limit, window (us), burst
--
-- Returns { admitted (0/1), then per tier: ok, used, remaining, reset (us), retry (us, -1 never), id,
--           then in peek mode the recorded values, newest first }.
-- remaining is what is left after a committed hit, what is left now otherwise, and 0 for a tier a hit does not fit
-- (but what is left after it for a forced hit, which every tier counts); used is the count after a committed or
-- hypothetical hit, the count now for a peek. For a forced hit, admitted, ok and retry are an ordinary hit's.
--
-- Invariants: either every tier is committed or none, except that a lone fixed window counts its denials as the
-- reference does (but never a cost above its limit, which can never fit), and that a forced hit of a positive cost
-- commits every tier. A peek never writes. Hit records expire with the longest-lived tier.

local function decide(k, nk, a)
  local function arg(i) return ARGV[a + i - 1] end
  local mode = arg(1)
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

  local impls, states, params = {}, {}, {}
  local admitted = true
  for i = 1, tiers do
    local base = first + (i - 1) * 4
    local impl = algorithm(arg(base))
    if impl == nil then error('unknown algorithm ' .. tostring(arg(base)), 0) end
    local p = { tonumber(arg(base + 1)), tonumber(arg(base + 2)), tonumber(arg(base + 3)) }
    impls[i], params[i] = impl, p
    local s = impl.check(KEYS[k + i - 1], now, cost, p[1], p[2], p[3], forced)
    states[i] = s
    admitted = admitted and s.ok
  end

  local commit = forced or (mode == 'hit' and cost > 0 and
    (admitted or (tiers == 1 and arg(first) == 'fixed_window' and cost <= params[1][1])))
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
