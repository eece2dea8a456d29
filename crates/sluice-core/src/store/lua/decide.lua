-- decide.lua: decides one descriptor against all its tiers at once, atomically.
--
-- decide(k, nk, a) reads the descriptor's nk keys from K[k] (KEYS, or ARGV in a cluster node's batch: see
-- prelude.lua) and its arguments from ARGV[a] (batch.lua passes the offsets); below, KEYS[i] stands for K[k + i - 1]
-- and ARGV[i] for ARGV[a + i - 1].
-- KEYS[1..t]  one state key per tier (all with the same hash tag: one cluster slot)
-- KEYS[t+1]   the hit-record list, present when ARGV[5] > 0
-- KEYS[last]  the reservation record, in the modes 'reserve', 'reserve_report' and 'settle'; the grant ledger in the
--             mode 'grant'
-- ARGV[1]     mode: 'hit' applies the hit, 'peek' only reports (and returns the hit records), 'report' applies a
--             forced hit: every tier counts its cost whether it fits or not (a usage that already happened; sent
--             only when every tier is fixed_window, sliding_window, token_bucket or leaky_bucket, see `Hit::forced`);
--             'reserve' and 'reserve_report' are 'hit' and 'report' that also write the reservation record KEYS[last]
--             when the hit is counted, and 'settle' settles the reservation KEYS[last] with the actual costs (each
--             tier's, see settle below); 'reap' is a 'settle' that finds only an expired record (kept
--             RESERVATION_GRACE_MS past its expiry) and settles it at its estimates, changing no tier; these are sent
--             only when every tier counts (see `Hit::reserves`), and 'settle' and 'reap' with no hit records and no
--             queue fields; 'grant' reads each tier as a peek of cost 0 does and grants from what they have left
--             (ledger.lua's grant), with no hit records and no queue fields
-- ARGV[2]     now in microseconds, or '' to read the server's clock (TIME): one clock for every sluice instance
-- ARGV[3]     the hit's cost, bounded by the largest tier's capacity + 1: the cost of every tier whose cost is ''
-- ARGV[4]     lease id for concurrency tiers
-- ARGV[5]     hit records to keep (0: none)     ARGV[6]  the value to record
-- ARGV[7]     f, the number of queue entry fields, then the f fields (name, value, name, value, ...)
-- then per tier 5 values: algorithm, limit, window (us), burst, cost: the tier's own cost (input tokens, output
--             tokens, credits: each limit may count its own), or '' for ARGV[3]. sluice sends every tier's cost
--             bounded by that tier's capacity + 1 (burst for buckets, the limit otherwise; `TierSpec::bounded_cost`),
--             and '' where that equals ARGV[3]. A cost of 0 (a tier's or the hit's) checks without consuming.
-- then, in the modes 'reserve' and 'reserve_report', the reservation record's TTL in us; in the mode 'grant', the
--             holder, what it holds, what it wants, its entry's TTL in us, whether it is a newcomer (1/0), and a
--             rate's limit per window when the holders share a rate (-1: a budget)
--
-- Returns { flags, now, then per tier: ok, what its check saw (three values, see prelude.lua), id, then in peek mode
--           the recorded values, newest first }, where flags is 1 when the hit is admitted, plus 2 when it was
--           committed, and now is the decision's time in microseconds. sluice makes each tier's answer from what its
--           check saw, by the algorithm's Rust twin (`algorithm::seen`).
-- Each tier is decided with its own cost: admitted means every tier admits its own cost. For a forced hit, admitted
-- and ok are an ordinary hit's.
-- In grant mode: ledger.lua's grant's answer.
-- In settle mode: { 0 } when there is no such reservation, else { 1, then per tier: estimate, actual, charged,
-- refunded, then the answer of a peek of cost 1 after settling, as above }.
--
-- Invariants: either every tier is committed or none, except that a lone fixed window counts its denials as the
-- reference does (but never a cost above its limit, which can never fit, nor a refused reservation, which holds
-- nothing), and that a forced hit commits every tier.
-- A hit is committed only if some tier's cost is positive, and each tier commits its own cost; a tier whose cost is 0
-- is checked and never written (no count, no lease, no queue entry). A peek never writes. Hit records expire with the
-- longest-lived tier. A reservation record is written only by a hit that is admitted and committed (or forced): the
-- record prelude.lua's record_write writes, of what each tier was charged. It
-- is written before any tier, and a settlement reads the record and every tier before it writes, so a key of the wrong
-- type stops either before it changes anything.

-- The arguments of the decision last read: where they were (the call's ARGV, the offset and the key count) and what
-- they say. Descriptors of a run (batch.lua's '*') share their arguments, so each after the first reads nothing again.
local read_argv, read_a, read_nk
local mode, reaping, reserving, now, hit_cost, id, record_size, record_value, fields, first, tiers, positive

-- Per decision, kept from call to call and overwritten as they are used (a decision is done with them before the next
-- begins): each tier's algorithm, its numbers (limit, window, burst) and its cost, what its check saw (ok, the three
-- values sluice reads and what its commit needs beside them); the queue fields of a hit that has none, and the ids
-- of a decision that created none.
local tier_impls, tier_params, tier_costs, no_fields, no_ids = {}, {}, {}, {}, {}
local seen_ok, seen_a, seen_b, seen_c, seen_x = {}, {}, {}, {}, {}

-- Keeps what tier i's check saw; returns whether the hit fits it.
local function seen(i, ok, a, b, c, x)
  seen_ok[i], seen_a[i], seen_b[i], seen_c[i], seen_x[i] = ok, a, b, c, x
  return ok
end

-- Commits `cost` to tier i (its key `key`) over what its check saw; returns what it created (a lease, a queue entry's
-- id, or '') and the time until what it wrote expires (the hit records live as long as the longest).
local function commit(i, key, cost, force, id, fields)
  local p = tier_params[i]
  return tier_impls[i].commit(key, now, cost, p[1], p[2], p[3], force, seen_a[i], seen_b[i], seen_c[i], seen_x[i], id,
    fields)
end

-- Writes into `out` after its place n: the flags (admitted 1, committed 2), the time, then per tier what its check
-- saw and the id its commit created; returns the last place written.
local function answer(out, n, admitted, committed, ids)
  local flags = 0
  if admitted then flags = 1 end
  if committed then flags = flags + 2 end
  out[n + 1], out[n + 2] = flags, now
  n = n + 2
  for i = 1, tiers do
    local ok = 0
    if seen_ok[i] then ok = 1 end
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = ok, seen_a[i], seen_b[i], seen_c[i], ids[i] or ''
    n = n + 5
  end
  return n
end

-- Reads the decision's arguments at ARGV[a] (see above) into the locals above and the tier tables.
local function read(nk, a)
  if read_argv == ARGV and read_a == a and read_nk == nk then return end
  -- Marked read only once all of it is: arguments that stop the reading part-way are read again by the next.
  read_argv = nil
  mode = ARGV[a]
  reaping = mode == 'reap'
  if reaping then mode = 'settle' end
  reserving = mode == 'reserve' or mode == 'reserve_report'
  if mode == 'reserve' then mode = 'hit' elseif mode == 'reserve_report' then mode = 'report' end
  now = clock(ARGV[a + 1])
  hit_cost = number(ARGV[a + 2])
  id = ARGV[a + 3]
  record_size = number(ARGV[a + 4])
  record_value = ARGV[a + 5]
  local nfields = number(ARGV[a + 6])
  fields = no_fields
  if nfields > 0 then
    fields = {}
    for i = 1, nfields do fields[i] = ARGV[a + 6 + i] end
  end
  -- Where the tiers' arguments begin.
  first = a + 7 + nfields
  tiers = nk
  if record_size > 0 then tiers = tiers - 1 end
  if reserving or mode == 'settle' or mode == 'grant' then tiers = tiers - 1 end

  -- Each tier's cost: its own, or the hit's. The hit is written at all only if one of them is positive.
  positive = false
  for i = 1, tiers do
    local base = first + (i - 1) * 5
    local impl = algorithm(ARGV[base])
    if impl == nil then error('unknown algorithm ' .. tostring(ARGV[base]), 0) end
    local p = tier_params[i]
    if p == nil then
      p = {}
      tier_params[i] = p
    end
    tier_impls[i], p[1], p[2], p[3] = impl, number(ARGV[base + 1]), number(ARGV[base + 2]), number(ARGV[base + 3])
    tier_costs[i] = number(ARGV[base + 4]) or hit_cost
    if tier_costs[i] > 0 then positive = true end
  end
  read_argv, read_a, read_nk = ARGV, a, nk
end

-- Settles the reservation `rkey` at `now` with each tier's actual cost `actual[i]` (bounded as any cost) over the
-- tiers (impls, params, from K[k]): reads every tier, then deletes the record and, tier by tier, counts
-- `actual - estimate` as a forced hit would, or gives `estimate - actual` back by its algorithm's refund; reports each
-- tier's estimate, actual, charged and refunded, and each tier as a peek of cost 1 does. No record (expired, settled,
-- never written, or not one estimate per tier): { 0 }, nothing written.
-- Reaping (`reaping`): only an expired record is found, and it is settled at its estimates, which changes no tier.
local function settle(k, impls, params, actual, rkey)
  for i = 1, tiers do
    if impls[i].refund == nil then return { 0 } end
  end
  local e, at = live_reservation(rkey, now, tiers, reaping)
  if e == nil then return { 0 } end
  if reaping then actual = e end
  -- Every tier is read before anything is written: a key of the wrong type stops the settlement here. A tier charged
  -- nothing is read all the same (a check of 0), and so is one whose refund need not read.
  local out, charged, writes = { 1 }, {}, {}
  for i = 1, tiers do
    local key, p = K[k + i - 1], params[i]
    local c, r = max0(actual[i] - e[i]), max0(e[i] - actual[i])
    charged[i] = c
    seen(i, impls[i].check(key, now, c, p[1], p[2], p[3], true))
    -- Reported refunded: what came back to a window still in force, not what was asked.
    local given = 0
    if r > 0 then given, writes[i] = impls[i].refund(key, now, at, r, p[1], p[2], p[3]) end
    out[4 * i - 2], out[4 * i - 1], out[4 * i], out[4 * i + 1] = e[i], actual[i], c, given or 0
  end
  redis.call('DEL', rkey)
  for i = 1, tiers do
    if charged[i] > 0 then commit(i, K[k + i - 1], charged[i], true, '', no_fields) end
    if writes[i] then writes[i]() end
  end
  local admitted = true
  for i = 1, tiers do
    local p = params[i]
    admitted = seen(i, impls[i].check(K[k + i - 1], now, 1, p[1], p[2], p[3], false)) and admitted
  end
  answer(out, 4 * tiers + 1, admitted, false, no_ids)
  return out
end

local function decide(k, nk, a)
  decision = decision + 1
  read(nk, a)
  local impls, params, costs = tier_impls, tier_params, tier_costs
  if mode == 'settle' then return settle(k, impls, params, costs, K[k + nk - 1]) end
  if mode == 'grant' then
    local left
    for i = 1, tiers do
      local p = params[i]
      local _, x, y, z = impls[i].check(K[k + i - 1], now, 0, p[1], p[2], p[3], false)
      local rem = impls[i].left(x, y, z, now, p[1], p[2], p[3])
      if left == nil or rem < left then left = rem end
    end
    local g = first + 5 * tiers
    -- A rate's limit per window, when the holders share a rate (-1: a budget, from what the tiers have left).
    local rate = tonumber(ARGV[g + 5])
    if rate >= 0 then left = rate end
    return grant(K[k + nk - 1], now, left or 0, ARGV[g], tonumber(ARGV[g + 1]), tonumber(ARGV[g + 2]),
      tonumber(ARGV[g + 3]), ARGV[g + 4] == '1', rate >= 0)
  end
  local forced = mode == 'report' and positive

  local admitted = true
  for i = 1, tiers do
    local p = params[i]
    admitted = seen(i, impls[i].check(K[k + i - 1], now, costs[i], p[1], p[2], p[3], forced)) and admitted
  end

  -- A reservation never counts a denial: a refused reservation holds nothing.
  local committed = forced or (mode == 'hit' and positive and
    (admitted or (not reserving and tiers == 1 and ARGV[first] == 'fixed_window' and costs[1] <= params[1][1])))
  if reserving and committed and (forced or admitted) then
    local rkey, ttl = K[k + nk - 1], ceil_ms(tonumber(ARGV[first + 5 * tiers]))
    local e = {}
    for i = 1, tiers do e[i] = string.format('%d', costs[i]) end
    record_write(rkey, table.concat(e, ','), now, ttl)
  end
  -- A tier whose cost is 0 is checked, never written.
  local ids, longest = no_ids, 0
  if committed then
    ids = {}
    for i = 1, tiers do
      if costs[i] > 0 then
        local made, lives = commit(i, K[k + i - 1], costs[i], forced, id, fields)
        ids[i] = made
        if lives > longest then longest = lives end
      end
    end
  end
  local out = {}
  local n = answer(out, 0, admitted, committed, ids)

  if record_size > 0 then
    local rkey = K[k + tiers]
    if committed then
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
