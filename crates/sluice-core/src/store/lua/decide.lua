-- decide.lua: the decision loop. One descriptor decided against all its limits at once, atomically, in any mode: read
-- each limit's state (its algorithm's check), ask whether the hit fits, then write all or none.
--
-- read(a) reads the arguments of the descriptor headed at ARGV[a] and returns where they end and how many keys it
-- has; decide(k, at, o) then decides it (batch.lua calls both). Its arguments, from ARGV[a] on:
-- head      the mode, then '+' and a letter per part carried beyond the tiers: 'l' a lease id, 'q' queue entry fields,
--           'k' hit records. Modes: 'hit'; 'peek', which only reports (and returns the hit records); 'report', a
--           forced hit: every tier counts its cost, fitting or not (usage that already happened; sent only when every
--           tier counts, `Hit::forced`); 'reserve' and 'reserve_report', 'hit' and 'report' that also write the
--           reservation record when the hit is counted; 'settle', which settles a reservation with the actual costs;
--           'reap', a 'settle' finding only an expired record (kept RESERVATION_GRACE_MS past its expiry), settled at
--           its estimates, changing no tier ('settle' and 'reap' are sent only when every tier counts, with no lease,
--           fields or records); 'grant', which reads each tier as a peek of cost 0 does and grants from what they have
--           left (ledger.lua); 'forget' (no tiers), which forgets one counting limit's record in the packed state (its
--           reset); 'count' (no tiers), which reads one window's count in a record (a global window's, for the other
--           regions).
-- t         the number of tiers
-- per tier  its algorithm's name, window (us), limit and cost (at most capacity + 1, `TierSpec::bounded_cost`; 0 checks
--           without consuming); if packed, its record's tag in the packed state; if its table has `burst`, the burst
--           (the buckets' burst, the bucketed window's number of sub-windows)
-- then      'l': the lease id; 'q': f, then f fields (name, value, ...); 'k': how many hit records to keep, and the
--           value to record; 'reserve', 'reserve_report': the record's TTL (us); 'grant': the holder, what it holds,
--           what it wants, its entry's TTL (us), the streams connected if it is a newcomer (else 0), and a rate's
--           limit per window when the holders share a rate (-1: a budget); 'forget': the record's tag; 'count': the
--           record's tag, the window's start and its length (us)
-- Its keys, from K[k] on (in the node form after its arguments and probe, batch.lua): the packed state's if a tier is
-- packed; per tier its algorithm's `keys` (a plain counter's window, built for the window sluice's clock expects; a
-- global window's names, alike; none for another packed tier; else the counter's own); with 'k' the hit records'
-- list; then the reservation record ('reserve', 'reserve_report', 'settle', 'reap'), the grant ledger ('grant') or the
-- packed state ('forget', 'count').
--
-- Its answer, into answers[o] on: the flags (1 if admitted, + 2 if committed), per tier what its check saw (`width`
-- values, read by the algorithm's Rust twin, `algorithm::seen`), then with 'k' in 'peek' the recorded values, newest
-- first, as one array. 'settle' ('reap'): 0 and zeros when there is no such reservation, else 1, per tier the
-- estimate, actual cost, charge and refund, then a peek of cost 1's answer after settling. 'grant': ledger.lua's
-- grant's six values. 'forget': 1 if the record was there, else 0. 'count': the window's count.
--
-- Invariants: every tier is committed or none, except that a lone fixed window counts its denials as the reference
-- does (never a cost above its limit, which can never fit, nor a refused reservation, which holds nothing), and that a
-- forced hit commits every tier. A hit is committed only if some tier's cost is positive; each tier commits its own
-- cost, and a tier of cost 0 is checked, never written (no count, lease or queue entry). A peek never writes. The
-- packed state is read once, before the first check, and written once, after the last commit, only if it changed.
-- Hit records expire with the longest-lived tier the hit was counted in. A reservation record is written only by a
-- hit admitted and committed (or forced), before any tier's write; a settlement reads the record and every tier
-- before it writes; so a key of the wrong type stops either before it changes anything.

-- The modes by head (their letters parsed once).
local modes = {}
local function mode_of(head)
  local m = modes[head]
  if m == nil then
    local name, parts = string.match(head, '^([%a_]+)%+?(%a*)$')
    if name == nil then error('unknown descriptor head ' .. head, 0) end
    m = { name = name, lease = string.find(parts, 'l', 1, true) ~= nil, fields = string.find(parts, 'q', 1, true) ~= nil,
      records = string.find(parts, 'k', 1, true) ~= nil }
    m.reserving = name == 'reserve' or name == 'reserve_report'
    m.forcing = name == 'report' or name == 'reserve_report'
    m.settling = name == 'settle' or name == 'reap'
    m.counting = name == 'hit' or name == 'reserve'
    m.apart = m.settling or name == 'grant' or name == 'forget' or name == 'count'
    modes[head] = m
  end
  return m
end

-- The decision under way, kept across calls, overwritten as read: per tier its algorithm, numbers, cost, first key's
-- place and what its check saw; the mode, time, lease, fields, records, and where the arguments after them are.
local impl, windows, limits, bursts, costs, texts, places, tags = {}, {}, {}, {}, {}, {}, {}, {}
-- The tiers of packed and of keyed algorithms, in order; per tier, where its state is and its check's last argument.
local packs, keyed = {}, {}
local ats, args = {}, {}
local seen_a, seen_b, seen_c, seen_x = {}, {}, {}, {}
local m, now, tiers, lease, fields, record_size, record_value, tail, no_fields = nil, 0, 0, '', {}, 0, '', 0, {}
-- Whether some tier's cost is positive (else nothing is written), the answer's width, packed and keyed tiers,
-- records held in the packed state, and whether the decision changed them.
local positive, places_answered, packed, nkeyed, records, dirty = false, 0, 0, 0, 0, false
-- Where the hit records' key is among the descriptor's keys (after every tier's).
local record_place = 0

-- The arguments last read (ARGV and offset): a run's descriptors (batch.lua's '*') share them, so later ones skip read.
local read_argv, read_a, read_end, read_keys

local function answer_width()
  if m.name == 'grant' then return 6 end
  if m.name == 'forget' or m.name == 'count' then return 1 end
  local w = 1
  for i = 1, tiers do w = w + impl[i].width end
  if m.settling then return w + 1 + 4 * tiers end
  if m.records and m.name == 'peek' then w = w + 1 end
  return w
end

local function read(a)
  if read_argv == ARGV and read_a == a then return read_end, read_keys end
  read_argv = nil
  m = mode_of(ARGV[a])
  tiers = number(ARGV[a + 1])
  local at, nk, ns = a + 2, 0, 0
  positive, nkeyed = false, 0
  for i = 1, tiers do
    local A = algorithm(ARGV[at])
    if A == nil then error('unknown algorithm ' .. tostring(ARGV[at]), 0) end
    impl[i], windows[i], limits[i], costs[i] = A, number(ARGV[at + 1]), number(ARGV[at + 2]), number(ARGV[at + 3])
    texts[i] = ARGV[at + 3]
    places[i] = nk
    at = at + 4
    if A.slots then
      -- Its record's tag: one of many, not worth keeping among the numbers read.
      tags[i] = tonumber(ARGV[at])
      at = at + 1
      ns = ns + 1
      packs[ns] = i
    else
      nkeyed = nkeyed + 1
      keyed[nkeyed] = i
    end
    bursts[i] = 0
    if A.burst then
      bursts[i] = number(ARGV[at])
      at = at + 1
    end
    nk = nk + (A.keys or (A.slots and 0) or 1)
    if costs[i] > 0 then positive = true end
  end
  -- The packed state's key comes first.
  packed = ns
  if ns > 0 then
    for i = 1, tiers do places[i] = places[i] + 1 end
    nk = nk + 1
  end
  record_place = nk
  lease, fields, record_size = '', no_fields, 0
  if m.lease then
    lease = ARGV[at]
    at = at + 1
  end
  if m.fields then
    local f = number(ARGV[at])
    fields = {}
    for j = 1, f do fields[j] = ARGV[at + j] end
    at = at + 1 + f
  end
  if m.records then
    record_size, record_value = number(ARGV[at]), ARGV[at + 1]
    at = at + 2
    nk = nk + 1
  end
  tail = at
  if m.reserving or m.name == 'forget' then
    at = at + 1
  elseif m.name == 'count' then
    at = at + 3
  elseif m.name == 'grant' then
    at = at + 6
  end
  if m.reserving or m.settling or m.name == 'grant' or m.name == 'forget' or m.name == 'count' then nk = nk + 1 end
  places_answered = answer_width()
  read_argv, read_a, read_end, read_keys = ARGV, a, at, nk
  return at, nk
end

local function seen(i, ok, a, b, c, x)
  seen_a[i], seen_b[i], seen_c[i], seen_x[i] = a, b, c, x
  return ok
end

-- The packed state (prelude.lua's P): a record of five little-endian doubles (exact for every time and count) per
-- counting limit: its tag (48 bits of a hash of the limit's name, `CounterKey::record`), the time its state stops
-- mattering (0: never written), then up to three numbers of its algorithm's state. A record whose time has come starts
-- afresh and is dropped at the next write; those of limits not named here (another rule, changed rules) are kept.
local RECORD = 5

local formats = {}
local function format_of(n)
  local f = formats[n]
  if f == nil then
    f = '<' .. string.rep('d', n * RECORD)
    formats[n] = f
  end
  return f
end

-- The records of the packed state at `key`, as read, and how many: into `t` for one record (the commonest; what `t`
-- held past it stays, unread) or none, else into a new table (struct.unpack's end position follows the records).
local function records_at(key, t)
  local v = redis.call('GET', key)
  local n = 0
  if v then n = floor(#v / (8 * RECORD)) end
  if n == 1 then
    t[1], t[2], t[3], t[4], t[5] = struct.unpack('<ddddd', v)
  elseif n > 1 then
    t = { struct.unpack(format_of(n), v) }
  end
  return t, n
end

-- Finds each tier's state for the descriptor whose keys start at K[k] (`ats`, `args`): a keyed tier's first key and,
-- as the check's last argument, its cost as spelled; a packed tier's place in P, read here from K[k] (its record, or
-- a new one at the end), and its first key (the names a global window reads by).
local lasting = 0
local function load(k)
  dirty = false
  for q = 1, nkeyed do
    local i = keyed[q]
    ats[i], args[i] = k + places[i], texts[i]
  end
  if packed == 0 then return end
  -- P is shared by every algorithm's closures (prelude.lua). A record added below goes right after those read.
  P, records = records_at(K[k], P)
  -- The latest time a record read stops mattering: the key lives until then (and a second more).
  local n = records * RECORD
  lasting = 0
  for r = 2, n, RECORD do
    if P[r] > lasting then lasting = P[r] end
  end
  for q = 1, packed do
    local i = packs[q]
    local tag, b = tags[i], 1
    while b <= n and P[b] ~= tag do b = b + RECORD end
    if b > n then
      records, n = records + 1, n + RECORD
      P[b], P[b + 1], P[b + 2], P[b + 3], P[b + 4] = tag, 0, 0, 0, 0
    elseif P[b + 1] <= now then
      P[b + 1], P[b + 2], P[b + 3], P[b + 4] = 0, 0, 0, 0
    end
    ats[i], args[i] = b + 2, k + places[i]
  end
end

-- Writes the packed state back to K[k] if the decision changed it: each packed tier's record with the time it stops
-- mattering, and every record whose time has not come; the key lives as long as the longest (and a second more: a
-- call decided at a given time may come a little after the server's clock), its expiry set only when that moved.
local function save(k)
  if not dirty then return end
  for q = 1, packed do
    local i = packs[q]
    local s = ats[i]
    local lives = impl[i].lives(s, now, windows[i], limits[i], bursts[i])
    P[s - 1] = 0
    if lives > 0 then P[s - 1] = now + lives end
  end
  local packed_state, last
  if records == 1 then
    -- The commonest state, one record, packed as it is.
    last = P[2]
    if last > now then packed_state = struct.pack('<ddddd', P[1], P[2], P[3], P[4], P[5]) end
  else
    local live = 0
    last = 0
    for r = 2, records * RECORD, RECORD do
      local x = P[r]
      if x > now then
        live = live + 1
        if x > last then last = x end
      end
    end
    if live == records then
      packed_state = struct.pack(format_of(live), unpack(P, 1, records * RECORD))
    elseif live > 0 then
      local out = {}
      for r = 1, records * RECORD, RECORD do
        if P[r + 1] > now then
          for j = 0, RECORD - 1 do out[#out + 1] = P[r + j] end
        end
      end
      packed_state = struct.pack(format_of(live), unpack(out))
    end
  end
  if packed_state == nil then
    redis.call('DEL', K[k])
    return
  end
  -- A window's record is kept to a window's edge, a bucket's to a multiple of its refill time (`lives`), so most
  -- writes leave the key's expiry where it is.
  if last == lasting then
    redis.call('SET', K[k], packed_state, 'KEEPTTL')
  else
    redis.call('SET', K[k], packed_state, 'PX', px(last - now + WINDOW_KEY_GRACE_US))
  end
end

-- What the window of `window` us starting at `start` holds in the record `tag` of the packed state at `key` (a global
-- window's own count here, shipped to the others: a fixed window's, or a sliding window's current or previous), or 0.
local function count_of(key, tag, start, window)
  local got, n = records_at(key, {})
  for r = 1, n * RECORD, RECORD do
    if got[r] == tag then
      if got[r + 2] == start then return got[r + 3] end
      if got[r + 2] == start + window then return got[r + 4] end
      return 0
    end
  end
  return 0
end

-- Forgets the record `tag` in the packed state at `key`, keeping the others and the key's expiry.
local function forget(key, tag)
  local got, n = records_at(key, {})
  if n == 0 then return 0 end
  local out = {}
  for r = 1, n * RECORD, RECORD do
    if got[r] ~= tag then
      for j = 0, RECORD - 1 do out[#out + 1] = got[r + j] end
    end
  end
  if #out == n * RECORD then return 0 end
  if #out == 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, struct.pack(format_of(#out / RECORD), unpack(out)), 'KEEPTTL')
  end
  return 1
end

local function check(i, cost, force)
  return seen(i, impl[i].check(ats[i], now, cost, limits[i], windows[i], bursts[i], force, args[i]))
end

local function commit(i, cost, force)
  local A = impl[i]
  if A.slots then dirty = true end
  return A.commit(ats[i], now, cost, limits[i], windows[i], bursts[i], force, seen_a[i], seen_b[i], seen_c[i],
    seen_x[i], lease, fields)
end

local function answer(o, admitted, committed, ids)
  local flags = 0
  if admitted then flags = 1 end
  if committed then flags = flags + 2 end
  answers[o] = flags
  o = o + 1
  for i = 1, tiers do
    local w = impl[i].width
    answers[o] = seen_a[i]
    if w > 1 then answers[o + 1] = seen_b[i] end
    if w > 2 then answers[o + 2] = seen_c[i] end
    if w > 3 then answers[o + 3] = ids[i] or '' end
    o = o + w
  end
  return o
end

-- Settles the reservation K[rk] at each tier's actual cost (its cost here): reads every tier, deletes the record, then
-- per tier counts `actual - estimate` as a forced hit would, or gives `estimate - actual` back by its refund.
local function settle(k, rk, o)
  local e, at
  for i = 1, tiers do
    if impl[i].refund == nil then at = -1 end
  end
  if at == nil then e, at = live_reservation(K[rk], now, tiers, m.name == 'reap') end
  if e == nil then
    for j = 0, places_answered - 1 do answers[o + j] = 0 end
    return
  end
  answers[o] = 1
  load(k)
  local writes, charged = {}, {}
  -- Every tier is read before anything is written: a key of the wrong type stops the settlement here. A tier charged
  -- nothing is read all the same (a check of 0), and so is one whose refund need not read.
  for i = 1, tiers do
    local actual = costs[i]
    if m.name == 'reap' then actual = e[i] end
    local c, r = max0(actual - e[i]), max0(e[i] - actual)
    charged[i] = c
    check(i, c, true)
    -- Reported refunded: what came back to a window still in force, not what was asked.
    local given = 0
    if r > 0 then
      given, writes[i] = impl[i].refund(ats[i], now, at, r, limits[i], windows[i], bursts[i])
    end
    answers[o + 4 * i - 3], answers[o + 4 * i - 2], answers[o + 4 * i - 1], answers[o + 4 * i] = e[i], actual, c,
      given or 0
  end
  redis.call('DEL', K[rk])
  for i = 1, tiers do
    if charged[i] > 0 then commit(i, charged[i], true) end
    if writes[i] then
      writes[i]()
      if impl[i].slots then dirty = true end
    end
  end
  save(k)
  local admitted = true
  for i = 1, tiers do admitted = check(i, 1, false) and admitted end
  answer(o + 4 * tiers + 1, admitted, false, no_fields)
end

-- Grants from what the tiers have left (ledger.lua's grant), from the arguments at ARGV[g] on.
local function give(k, g, lk, o)
  local left
  load(k)
  for i = 1, tiers do
    local _, x, y, z = impl[i].check(ats[i], now, 0, limits[i], windows[i], bursts[i], false, args[i])
    local rem = impl[i].left(x, y, z, now, limits[i], windows[i], bursts[i])
    if left == nil or rem < left then left = rem end
  end
  local rate = tonumber(ARGV[g + 5])
  if rate >= 0 then left = rate end
  local out = grant(K[lk], now, left or 0, ARGV[g], tonumber(ARGV[g + 1]), tonumber(ARGV[g + 2]), tonumber(ARGV[g + 3]),
    tonumber(ARGV[g + 4]), rate >= 0)
  for j = 1, #out do answers[o + j - 1] = out[j] end
end

-- Decides the descriptor read last (`read`), its keys at K[k] on, at `at`, into answers[o] on.
local function decide(k, at, o)
  decision = decision + 1
  now = at
  local nk = read_keys
  if m.apart then
    if m.settling then
      settle(k, k + nk - 1, o)
    elseif m.name == 'grant' then
      give(k, tail, k + nk - 1, o)
    elseif m.name == 'forget' then
      answers[o] = forget(K[k + nk - 1], tonumber(ARGV[tail]))
    else
      answers[o] = count_of(K[k + nk - 1], tonumber(ARGV[tail]), tonumber(ARGV[tail + 1]), tonumber(ARGV[tail + 2]))
    end
    return
  end
  local forced = m.forcing and positive
  load(k)
  -- Each tier seen in order, nothing written yet.
  local admitted = true
  for i = 1, tiers do
    local ok, x, y, z, s = impl[i].check(ats[i], now, costs[i], limits[i], windows[i], bursts[i], forced, args[i])
    seen_a[i], seen_b[i], seen_c[i], seen_x[i] = x, y, z, s
    if not ok then admitted = false end
  end

  -- A reservation never counts a denial: a refused reservation holds nothing.
  local committed = forced or (positive and m.counting and
    (admitted or (not m.reserving and tiers == 1 and impl[1].counts_denials and costs[1] <= limits[1])))
  if committed and m.reserving then
    -- The estimates as the arguments spell them: decimal integers, as the record keeps them.
    local e = texts[1]
    if tiers > 1 then e = table.concat(texts, ',', 1, tiers) end
    record_write(K[k + nk - 1], e, now, ceil_ms(number(ARGV[tail])))
  end
  -- The answer, each tier's written as it is committed.
  local flags, longest = 0, 0
  if admitted then flags = 1 end
  if committed then flags = flags + 2 end
  answers[o] = flags
  o = o + 1
  for i = 1, tiers do
    local A, made = impl[i], ''
    if committed and costs[i] > 0 then
      -- commit(i, ...) written out: the call would cost Redis 1 to 2 % of a hit.
      local lives
      if A.slots then dirty = true end
      made, lives = A.commit(ats[i], now, costs[i], limits[i], windows[i], bursts[i], forced, seen_a[i], seen_b[i],
        seen_c[i], seen_x[i], lease, fields)
      if lives > longest then longest = lives end
    end
    if A.unwritten and (not committed or costs[i] == 0) then
      seen_a[i], seen_b[i], seen_c[i] = A.unwritten(ats[i], seen_a[i], seen_b[i], seen_c[i])
    end
    local w = A.width
    answers[o] = seen_a[i]
    if w > 1 then answers[o + 1] = seen_b[i] end
    if w > 2 then answers[o + 2] = seen_c[i] end
    if w > 3 then answers[o + 3] = made end
    o = o + w
  end
  save(k)
  if record_size > 0 then
    local rkey = K[k + record_place]
    if committed then
      redis.call('LPUSH', rkey, record_value)
      redis.call('LTRIM', rkey, 0, record_size - 1)
      redis.call('PEXPIRE', rkey, px(max(longest, 1)))
    elseif m.name == 'peek' then
      answers[o] = redis.call('LRANGE', rkey, 0, record_size - 1)
    end
  end
  return
end
