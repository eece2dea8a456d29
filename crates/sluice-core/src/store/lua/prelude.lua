-- prelude.lua: what the decision script's files share. sluice loads one script, the concatenation of prelude.lua,
-- the algorithm files (store/algorithm/*.lua, each in a block of its own, so that no file sees another's locals),
-- ledger.lua, decide.lua and batch.lua (in that order, `store/redis.rs`), so that any mix of algorithms on one
-- descriptor, and a batch of descriptors, is decided in one atomic call. Its entry is batch.lua's batch(), which reads
-- the call's keys and arguments from the locals KEYS and ARGV declared ahead of these files: run as a Redis function,
-- the definitions are made once, when the library is loaded, and every call sets KEYS and ARGV and calls batch(); run
-- by EVALSHA, they are made at every call. Either way batch() sets afresh, at its start, everything a call leaves
-- behind (the state below marked per call; what is kept from call to call says so).
--
-- Exports, and nothing else is shared among the files:
--   L, algorithm(name)          the algorithms' loaders, and the algorithm of a name (its table, below)
--   K, P, decision              where a call's keys are read; the packed state of the descriptor being decided; the
--                               number of the decision under way
--   number(s), numbers          an argument read as a number, and the numbers read so far (batch.lua's fast path)
--   clock(arg), server_now      a call's time, and the server's time if the call read it
--   guess, window_at(key, now, window)   the time a call's window keys were built for, and the key of now's window
--   ceil_ms, max0               arithmetic every algorithm uses
--   px(us)                      an expiry as a command's argument
--   live_in, newest_in          a sorted set of times read (sliding_log.lua, concurrency.lua)
--   floor, max, min             math.floor, math.max and math.min (set by batch.lua's batch())
--   MAX_COUNT, MAX_SLIDING_COUNT, MAX_DEBT_US, WINDOW_KEY_GRACE_US, RESERVATION_GRACE_MS
--   window_key, window_of       the key of a window (store/key.rs)
--   answers                     a call's answers
--   record_write, live_reservation   the reservation records
--   regions_count, global_of    a window counted in every region (`global: true`)
--
-- Every algorithm file adds a loader to L that returns a table, the algorithm's side of decide.lua's loop, in one of
-- two kinds. A packed algorithm (the counting ones: fixed_window, sliding_window, token_bucket, leaky_bucket) keeps
-- `slots` numbers in its descriptor's packed state, P[p] to P[p + slots - 1], and is pure arithmetic over them: decide.lua
-- reads the state from one key before the first check and writes it back once after the last commit. A keyed
-- algorithm keeps keys of its own, from K[j] on (`keys` of them, 1 unless the table says more). A tier's first
-- argument below, `at`, is p for a packed algorithm, j for a keyed one; its numbers are the window (us), the limit and
-- the burst (read only where the table has `burst`):
--   check(at, now, cost, limit, window, burst, force, j) -> ok, a, b, c, x: whether a hit of `cost` fits now (an
--     ordinary hit's answer, even when forced), what the check saw, which the loop answers (`width` of a, b, c: see
--     `algorithm::seen` in store/algorithm.rs, which decodes them) and x, what a keyed commit needs beside them. Reads
--     only. `j`: where a packed algorithm's keys start, if it has any (a global window's, names only).
--   commit(at, now, cost, limit, window, burst, force, a, b, c, x, lease, fields) -> what it created (a queue entry's
--     id, '' for the others) and the time until what it wrote expires: counts `cost` (a forced hit's whether it fits
--     or not) over what check saw.
--   left(a, b, c, now, limit, window, burst) -> what is left now (a grant's pool); without one, the limit less the
--     count the check saw (`algorithm` gives it)
-- a packed algorithm also has
--   lives(p, now, window, limit, burst) -> how long its record is kept (0: not at all), at least as long as its state
--     still matters; the packed key lives as long as the longest, and is written with its expiry kept while that time
--     does not move
--   refund(p, now, at, amount, limit, window, burst) -> nil when nothing changes, else what comes back (at most
--     `amount`) and a function that writes the refund into P: give back up to `amount` of what a hit at time `at`
--     counted, from the state it was counted in (decide.lua's mode 'settle').
-- a keyed algorithm optionally what check leaves to read until the loop knows the hit is not written to the tier (a
-- sorted set's newest place, which a hit written replaces with its own):
--   unwritten(j, a, b, c) -> a, b, c
-- and the plain counter (fixed_window.lua's L.counter, a descriptor's lone fixed window) its refund (as a packed
-- one's, on its key), and for batch.lua its fast form, `hit`, which fixed_window.lua documents.
-- Times are integer microseconds, far below 2^53, so Lua's doubles hold them exactly. So are counts: each tier's
-- cost arrives bounded by its capacity + 1 (at most 2^32, see `TierSpec::bounded_cost`), limits are at most
-- 2^32 - 1, a fixed window's count stops at MAX_COUNT, a sliding window's at MAX_SLIDING_COUNT and a bucket's debt at
-- MAX_DEBT_US. Numbers that go into strings are formatted with '%d': Lua's own number-to-string conversion keeps
-- only 14 digits.

-- The loaders keep a call by EVALSHA from building the functions of algorithms it does not use: the script's body
-- runs on every such call, and defining every algorithm's closures cost about a tenth of a lone fixed window's time.

local L, loaded = {}, {}

-- Lua's arithmetic helpers, read once (batch.lua, at a call: a function library is loaded without `math`): a
-- global's field costs a lookup at every use.
local floor, max, min

-- Per call: the table the descriptors' keys are read from: KEYS, where the keys are declared (one server, or one
-- cluster slot); batch.lua points it at ARGV for a cluster node's batch, whose keys span slots and travel among the
-- arguments.
local K = KEYS

-- Per decision: the packed state of the descriptor being decided (decide.lua), the numbers of its packed algorithms'
-- tiers in order.
local P = {}

-- The number of the descriptor's decision under way (decide.lua counts them, from call to call where the definitions
-- outlive a call): tiers that share a counter (bucketed_window.lua) write it once per decision.
local decision = 0

-- What is left of `limit` after the count `n`, what a check saw first: the `left` of an algorithm that has none.
local function count_left(n, _, _, _, limit)
  if n >= limit then return 0 end
  return limit - n
end

-- The algorithm named `name` (with `count_left` for a `left` it has none of), or nil if there is none.
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

-- An expiry of `us` microseconds as a command's argument: its milliseconds (ceil_ms) as text. Redis formats a number
-- handed to redis.call with '%.17g', which costs it about half of what the command itself does, and string.format as
-- much; a call's descriptors mostly share their expiries (one time, the same windows), so each is formatted once. Kept
-- from call to call where the definitions outlive a call, up to 4 096, then started afresh.
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

-- The most a fixed window's count holds. A lone fixed window counts its denials, and hits of up to 2^32 each could
-- otherwise push a count past 2^53, where doubles stop being exact; any count above a limit answers the same.
local MAX_COUNT = 4503599627370496 -- 2^52

-- The most a sliding window's current count holds: only forced hits take it past its limit, and with the previous
-- window's count (at most as much) and a cost added, the estimate stays below 2^53.
local MAX_SLIDING_COUNT = 2251799813685248 -- 2^51

-- The most a bucket's arrival time is ever past an empty bucket's (now + tolerance): about 9 years of debt, which
-- only forced hits run up. Times stay below 2^53 with the largest bucket the configuration accepts (100 years)
-- priced on top.
local MAX_DEBT_US = 281474976710656 -- 2^48

-- How long a window's key outlives its window: no later window reads it (each has its own key), and a TTL of a few
-- milliseconds (a first hit just before the window ends) could lapse before the next hit of the same window when the
-- decision's time is given to the script rather than read from the server's clock.
local WINDOW_KEY_GRACE_US = 1000000

-- How long a reservation record outlives its expiry, so that the instance that made it can reap it
-- (`RESERVATION_GRACE_US` in store.rs).
local RESERVATION_GRACE_MS = 60000

-- The key of the window starting at `start` of the counter whose own key is `base` (store/key.rs,
-- `CounterKey::window`): `base`, ':', then the window's number (start / window) in lowercase hex.
local function window_key(base, start, window)
  return base .. ':' .. string.format('%x', start / window)
end

-- The key of the window of `window` us starting at `start`, from `key`, the key of the window sluice expects (its
-- clock's; the server's may be across an edge, and that window then gets its own key).
-- A window key of envoyproxy/ratelimit's layout (`KeyLayout::Reference` in store/key.rs) is the counter's key, which
-- ends with '_', then the window's start in seconds.
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

-- The `unwritten` of an algorithm that keeps a sorted set of times (decide.lua's interface): a check saw `count` live
-- ones, and when it is not written, the highest of them (the newest hit, the latest deadline; -1 when none) is read.
local function newest_in(j, count, newest, leaving)
  if count > 0 then newest = tonumber(redis.call('ZRANGE', K[j], -1, -1, 'WITHSCORES')[2]) end
  return count, newest, leaving
end

-- Each argument that heads a descriptor or counts a cost is read as a number once: most are the same few strings (a
-- handful of windows, a cost of 1), and tonumber costs more than a table lookup. Where the definitions outlive a call
-- (a Redis function) the numbers read are kept from call to call, up to 4 096 strings, then started afresh. A string
-- that is no number (a mode's name heading a descriptor) is kept as false, and read as nil.
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

-- The call's answers, in order: as many values per descriptor as its form answers, ended by a nil
-- (batch.lua); the table is kept from call to call where the definitions outlive a call.
local answers = {}

-- Per call: when the call is decided by the server's clock, the time by sluice's clock the keys of windows were built
-- for (batch.lua's timing), else nil.
local guess

-- The key of the window of `window` us that `now` is in, from `key`, the key sluice built for the window it expects:
-- the same, unless the call is decided by the server's clock and the server's window is another (the two clocks
-- across an edge).
local function window_at(key, now, window)
  local start = now - now % window
  if guess ~= nil and start ~= guess - guess % window then return window_of(key, start, window) end
  return key
end

-- The time of a call (per call): `arg` in microseconds, or, for '', the server's clock (TIME), read once per script
-- call so that every descriptor of a batch is decided at the same instant.
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

-- Reservation records: the text `<t> <x> <e>` at a reservation's key, t = when it was charged, x = when it expires by
-- the decision's clock, e = what each tier was charged, in tier order, as decimal integers joined by ',' (one value
-- for one tier); Redis expires it RESERVATION_GRACE_MS after x.

-- Writes the reservation record `rkey`: the estimates `e` (decimal integers joined by ','), charged at `now`, live
-- for `ttl` milliseconds by the decision's clock and RESERVATION_GRACE_MS more in Redis.
local function record_write(rkey, e, now, ttl)
  local record = string.format('%d %d ', now, now + ttl * 1000) .. e
  redis.call('SET', rkey, record, 'PX', px((ttl + RESERVATION_GRACE_MS) * 1000))
end

-- The estimates (one per tier, in order) and charged-at time of the reservation record `rkey` for a settlement over
-- `tiers` tiers, or nil. A record is judged by the decision's clock: one whose x has come is gone, whether or not
-- Redis has expired the key yet (it expires by its own clock). A record that does not hold one estimate per tier
-- (the settlement names other tiers than the reservation did) is not this settlement's: nil, and it is left as it is.
-- With `expired`, the other way round: only a record whose x has come (kept RESERVATION_GRACE_MS past it) is found.
-- The estimates come in a table kept from call to call for a lone tier (the commonest), a new one for several.
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

-- A window counted in every region (`global: true`; see `regions.rs`): each region counts its own hits in its packed
-- state, and learns what the others counted from what they ship: a hash per window, `<window key>@regions`, one field
-- per other region holding that region's own count of the window (written by merge.lua, the larger count kept). A
-- global tier is its algorithm decided against the limit less what the other regions counted, so that it admits a hit
-- only when the sum of every region's count, as known here, leaves room for it. The tier reports `used` as that sum
-- (this region's count + others); `remaining` is what the sum leaves. A global tier counts no denial (decide.lua never
-- counts one for it), and its retry time is its own window's: the regions' counts that expire with it are not known
-- here beyond what was shipped. It reads the regions' hashes, never writes them.

-- What the other regions counted in the window whose key is `wkey`: the sum of the hash's values.
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
