-- prelude.lua: what the decision script's files share. The script (`store/redis.rs`) is prelude.lua, the algorithm
-- files (store/algorithm/*.lua, each in a block of its own: no file sees another's locals), ledger.lua, decide.lua and
-- batch.lua: any mix of algorithms, over a batch of descriptors, is decided in one atomic call. Its entry, batch(),
-- reads the locals KEYS and ARGV. The definitions are made once as a Redis function (at load), at every call by
-- EVALSHA; either way batch() sets afresh everything a call leaves behind.
--
-- Exports, and nothing else is shared among the files:
--   L, algorithm(name)          the algorithms' loaders; the algorithm of a name (its table, below)
--   K, P, decision              where a call's keys are read; the packed state being decided; the decision's number
--   number(s), numbers          an argument read as a number; the numbers read so far (batch.lua's fast path)
--   clock(arg), server_now      a call's time; the server's time if the call read it
--   guess, window_at(key, now, window)   the time a call's window keys were built for; the key of now's window
--   ceil_ms, max0, px(us)       arithmetic every algorithm uses; an expiry as a command's argument
--   live_in, newest_in          a sorted set of times read (sliding_log.lua, concurrency.lua)
--   floor, max, min             math.floor, math.max and math.min (set by batch())
--   MAX_COUNT, MAX_SLIDING_COUNT, MAX_DEBT_US, WINDOW_KEY_GRACE_US, RESERVATION_GRACE_MS
--   window_key, window_of       the key of a window (store/key.rs)
--   answers, record_write, live_reservation   a call's answers; the reservation records
--   regions_count, global_of    a window counted in every region (`global: true`)
--
-- Each algorithm file adds to L a loader returning the algorithm's table, its side of decide.lua's loop. A packed
-- algorithm (the counting ones: fixed_window, sliding_window, token_bucket, leaky_bucket) keeps `slots` numbers in its
-- descriptor's packed state, P[p] to P[p + slots - 1], and is pure arithmetic over them. A keyed algorithm keeps keys
-- of its own, from K[j] on (`keys` of them, default 1). `at` is p or j; windows are in us; `burst` is read only where
-- the table has `burst`.
--   check(at, now, cost, limit, window, burst, force, j) -> ok, a, b, c, x. Reads only. ok: whether a hit of `cost`
--     fits now (an ordinary hit's answer, even when forced); a, b, c: what it saw, answered by the loop (`width` of
--     them); x: what a keyed commit also needs; j: a packed algorithm's first key (a global window's names), if any.
--   commit(at, now, cost, limit, window, burst, force, a, b, c, x, lease, fields) -> what it created (a queue entry's
--     id, else '') and the time until what it wrote expires; counts `cost` over what check saw (forced: fits or not).
--   left(a, b, c, now, limit, window, burst) -> what is left now (a grant's pool); default: limit less the count seen.
--   lives(p, now, window, limit, burst), packed only -> how long its record is kept (0: not at all), at least while
--     its state matters; the packed key lives as long as the longest, its expiry kept while that time does not move.
--   refund(p, now, at, amount, limit, window, burst), packed only -> nil if nothing changes, else what comes back (at
--     most `amount`) of what a hit at `at` counted, from the state it was counted in, and a function writing it to P.
--   unwritten(j, a, b, c) -> a, b, c, keyed, optional: what check leaves to read until the loop knows the tier is not
--     written (a sorted set's newest, which a written hit replaces with its own).
-- The plain counter (fixed_window.lua's L.counter, a descriptor's lone fixed window) also has a refund (on its key)
-- and batch.lua's fast form, `hit`.
-- Times are integer microseconds, far below 2^53, so doubles hold them exactly; so do counts: a cost is at most its
-- tier's capacity + 1 (2^32, `TierSpec::bounded_cost`), a limit 2^32 - 1, and counts stop at MAX_COUNT,
-- MAX_SLIDING_COUNT and MAX_DEBT_US (a debt). Numbers go into strings by '%d': Lua's tostring keeps only 14 digits.

-- The loaders spare a call by EVALSHA, which runs the whole body, building algorithms it does not use: defining every
-- algorithm's closures cost about a tenth of a lone fixed window's time.
local L, loaded = {}, {}

-- Set by batch() at a call (a function library is loaded without `math`): a global's field costs a lookup per use.
local floor, max, min

-- Per call: where the descriptors' keys are read: KEYS, or ARGV in batch.lua's node form (keys spanning slots).
local K = KEYS

-- Per decision: the packed state of the descriptor being decided (decide.lua), its packed tiers' numbers in order.
local P = {}

-- The number of the decision under way (decide.lua counts them; kept across calls): tiers that share a counter
-- (bucketed_window.lua) write it once per decision.
local decision = 0

-- What is left of `limit` after the count `n`, what a check saw first: the `left` of an algorithm that has none.
local function count_left(n, _, _, _, limit)
  if n >= limit then return 0 end
  return limit - n
end

local function algorithm(name)
  local a = loaded[name]
  if a == nil and L[name] ~= nil then
    a = L[name]()
    a.left = a.left or count_left
    loaded[name] = a
  end
  return a
end

local function ceil_ms(us)
  local ms = floor((us + 999) / 1000)
  if ms < 1 then ms = 1 end
  return ms
end

-- An expiry of `us` microseconds as a command's argument, ceil_ms(us) as text, formatted once and kept across calls:
-- formatting (Redis's '%.17g' in redis.call, or string.format) costs about half the command, and expiries repeat.
local px_texts, px_count = {}, 0
local function px(us)
  local t = px_texts[us]
  if t == nil then
    t = string.format('%d', ceil_ms(us))
    if px_count >= 4096 then px_texts, px_count = {}, 0 end
    px_texts[us] = t
    px_count = px_count + 1
  end
  return t
end

-- The most a fixed window's count holds: a lone fixed window counts denials, and hits of up to 2^32 each could push
-- it past 2^53; any count above a limit answers the same.
local MAX_COUNT = 4503599627370496 -- 2^52

-- The most a sliding window's current count holds (only forced hits pass its limit): with the previous window's
-- count (at most as much) and a cost added, the estimate stays below 2^53.
local MAX_SLIDING_COUNT = 2251799813685248 -- 2^51

-- The most a bucket's arrival time is past an empty bucket's (now + tolerance): about 9 years of debt, run up only by
-- forced hits. Times stay below 2^53 with the largest bucket accepted (100 years) priced on top.
local MAX_DEBT_US = 281474976710656 -- 2^48

-- How long a window's key outlives its window (no later window reads it): a TTL of a few ms (a first hit just before
-- the window ends) could lapse before that window's next hit when the script is given the decision's time.
local WINDOW_KEY_GRACE_US = 1000000

-- How long a reservation record outlives its expiry, so that its maker can reap it (`RESERVATION_GRACE_US`, store.rs).
local RESERVATION_GRACE_MS = 60000

-- The key of the window starting at `start` of the counter keyed `base` (store/key.rs, `CounterKey::window`): `base`,
-- ':', then the window's number (start / window) in lowercase hex.
local function window_key(base, start, window)
  return base .. ':' .. string.format('%x', start / window)
end

-- The key of the `window`-us window starting at `start`, from `key`, the key of the window sluice's clock expects (the
-- server's may be across an edge). A key of envoyproxy/ratelimit's layout (`KeyLayout::Reference`, store/key.rs) is
-- the counter's key, which ends with '_', then the window's start in seconds.
local function window_of(key, start, window)
  local base = string.match(key, '^(.*):%x+$')
  if base == nil then
    local at
    base, at = string.match(key, '^(.*_)(%d+)$')
    if base == nil then error('not a window key: ' .. key, 0) end
    local seconds = (start - start % 1000000) / 1000000
    if tonumber(at) == seconds then return key end
    return base .. string.format('%d', seconds)
  end
  return window_key(base, start, window)
end

local function max0(x)
  if x < 0 then return 0 end
  return x
end

-- In the sorted set of times at `key`: how many are above `since` (a score bound: '(<time>'), and when `need` more
-- would not fit `limit` but could, the time whose leaving lets them (else -1).
local function live_in(key, since, need, limit)
  local count, leaving = redis.call('ZCOUNT', key, since, '+inf'), -1
  if need <= limit and count + need > limit then
    leaving = tonumber(redis.call('ZRANGEBYSCORE', key, since, '+inf', 'WITHSCORES', 'LIMIT', count + need - limit - 1,
      1)[2])
  end
  return count, leaving
end

-- A sorted set's `unwritten`: the highest of the `count` live times (newest hit, latest deadline; -1 if none).
local function newest_in(j, count, newest, leaving)
  if count > 0 then newest = tonumber(redis.call('ZRANGE', K[j], -1, -1, 'WITHSCORES')[2]) end
  return count, newest, leaving
end

-- Each argument heading a descriptor or counting a cost is read as a number once, kept across calls: most are the same
-- few strings, and tonumber costs more than a table lookup. A non-number (a mode) is kept as false, read as nil.
local numbers, numbered = {}, 0
local function number(s)
  local v = numbers[s]
  if v == nil then
    v = tonumber(s) or false
    if numbered >= 4096 then numbers, numbered = {}, 0 end
    numbers[s] = v
    numbered = numbered + 1
  end
  return v or nil
end

-- The call's answers, in order, ended by a nil (batch.lua); the table is kept across calls.
local answers = {}

-- Per call: if the server's clock decides the call, the time by sluice's clock window keys were built for, else nil.
local guess

-- The key of the `window`-us window `now` is in, from `key`, built for the window sluice expects: the same, unless the
-- call goes by the server's clock and the server's window is another (the clocks across an edge).
local function window_at(key, now, window)
  local start = now - now % window
  if guess ~= nil and start ~= guess - guess % window then return window_of(key, start, window) end
  return key
end

-- Per call: the time `arg` (us), or for '' the server's TIME, read once per call: a batch is decided at one instant.
local server_now
local function clock(arg)
  local now = tonumber(arg)
  if now ~= nil then return now end
  if server_now == nil then
    local t = redis.call('TIME')
    server_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return server_now
end

-- Reservation records: the text `<t> <x> <e>`: t = when it was charged, x = when it expires by the decision's clock,
-- e = what each tier was charged, in tier order, decimal integers joined by ','. Redis expires it RESERVATION_GRACE_MS
-- after x. record_write writes one, charged at `now`, live for `ttl` ms.
local function record_write(rkey, e, now, ttl)
  local record = string.format('%d %d ', now, now + ttl * 1000) .. e
  redis.call('SET', rkey, record, 'PX', px((ttl + RESERVATION_GRACE_MS) * 1000))
end

-- The estimates (one per tier, in order) and charged-at time of the record `rkey` for a settlement of `tiers` tiers, or
-- nil. Judged by the decision's clock: a record whose x has come is gone, whether or not Redis expired it. One without
-- one estimate per tier (other tiers than reserved) is not this settlement's: nil, left as it is. With `expired`, the
-- other way round: only a record whose x has come is found. A lone tier's estimates reuse one table.
local one_estimate = {}
local function live_reservation(rkey, now, tiers, expired)
  local r = redis.call('GET', rkey)
  if not r then return nil end
  local t, x, e = string.match(r, '^(%d+) (%d+) (.+)$')
  local at
  at, x = tonumber(t), tonumber(x)
  if type(e) ~= 'string' or at == nil or x == nil or (x <= now) ~= expired then return nil end
  if tiers == 1 then
    -- One estimate, no comma: the same as the pieces below would read.
    local n = tonumber(e)
    if n == nil then return nil end
    one_estimate[1] = n
    return one_estimate, at
  end
  local estimates = {}
  for v in string.gmatch(e, '[^,]+') do
    local n = tonumber(v)
    if n == nil then return nil end
    estimates[#estimates + 1] = n
  end
  if #estimates ~= tiers then return nil end
  return estimates, at
end

-- A window counted in every region (`global: true`, `regions.rs`): each region counts its own hits in its packed state
-- and learns the others' from a hash per window, `<window key>@regions`, one field per other region with its count
-- (written by merge.lua, the larger kept; only read here). A global tier is its algorithm against the limit less the
-- others' count: it admits a hit only if the sum of all regions' counts, as known here, leaves room. It reports `used`
-- as that sum and `remaining` as what the sum leaves; it counts no denial (decide.lua), and retries by its own window
-- (the others' counts are known only as shipped).
-- What the other regions counted in the window `wkey`.
local function regions_count(wkey)
  local n, all = 0, redis.call('HGETALL', wkey .. '@regions')
  for i = 2, #all, 2 do n = n + (tonumber(all[i]) or 0) end
  return n
end

-- The loader of the global form of the packed algorithm `name`, whose other regions' count at `now` is
-- `others(j, now, window)`, read from the hashes named after its `keys` keys (names sluice sends, never written).
local function global_of(name, keys, others)
  return function()
    local a = algorithm(name)
    local M = { commit = a.commit, refund = a.refund, lives = a.lives, width = a.width + 1, slots = a.slots,
      keys = keys }
    -- Sees what the algorithm sees against the limit less the others' count, which comes after it.
    function M.check(p, now, cost, limit, window, burst, force, j)
      local o = others(j, now, window)
      local ok, x, y = a.check(p, now, cost, max0(limit - o), window, burst, force)
      if a.width == 1 then return ok, x, o, -1 end
      return ok, x, y, o
    end
    function M.left(x, y, z, now, limit, window, burst)
      local o = z
      if a.width == 1 then o = y end
      return a.left(x, y, -1, now, max0(limit - o), window, burst)
    end
    return M
  end
end
