-- prelude.lua: helpers shared by every algorithm. sluice loads one script, the concatenation of prelude.lua, the
-- algorithm files, global.lua, the compact_*.lua files, ledger.lua, decide.lua, compact_reservation.lua and batch.lua
-- (in that order, `store/redis.rs`), so that any mix of algorithms on one descriptor, and a batch of descriptors, is
-- decided in one atomic call. Its entry is batch.lua's batch(), which reads the call's keys and arguments from the
-- locals KEYS and ARGV declared ahead of these files: run as a Redis function, the definitions are made once, when the
-- library is loaded, and every call sets KEYS and ARGV and calls batch(); run by EVALSHA, they are made at every call.
-- Either way batch() sets afresh, at its start, everything a call leaves behind (the state below marked per call; what is kept from call to call says so).
--
-- Every algorithm file adds a loader to L that returns a table with two functions over one key:
--   check(key, now, cost, limit, window, burst, force) -> state, read-only, with the fields
--     ok      whether a hit of `cost` fits now
--     used0   the count now                 used    the count as it would be after the hit (near-limit metrics)
--     rem0    what is left now              rem1    what would be left after the hit
--     reset0  time until full now (us)      reset1  time until full after the hit (us)
--     retry   time until a hit of `cost` fits (0: now, -1: never)
--   where, for a forced hit (`force`, decide.lua's mode 'report'), used, rem1 and reset1 are what counting the cost
--   leaves whether it fits or not; ok and retry are an ordinary hit's.
--   commit(key, state, now, cost, limit, window, burst, id, fields) -> an id or '' (queue entry id)
-- and the counting algorithms (fixed_window, sliding_window, token_bucket, leaky_bucket) a third, for settling a
-- reservation (decide.lua's mode 'settle'):
--   refund(key, now, at, amount, limit, window, burst) -> nil when nothing changes, else what comes back (at most
--     `amount`) and a function that writes the
--     refund: give back up to `amount` of what a hit at time `at` counted, from the state it was counted in. It only
--     reads; the function it returns never creates the key and never extends its expiry (a bucket's moves with its
--     arrival time, as every write of it does).
-- Times are integer microseconds, far below 2^53, so Lua's doubles hold them exactly. So are counts: each tier's
-- cost arrives bounded by its capacity + 1 (at most 2^32, see `TierSpec::bounded_cost`; the hit's, ARGV[3], by the
-- largest capacity + 1), limits are at most 2^32 - 1, a
-- fixed window's count stops at MAX_COUNT, a sliding window's at MAX_SLIDING_COUNT and a bucket's debt at
-- MAX_DEBT_US. Numbers that go into strings are formatted with '%d': Lua's own number-to-string conversion keeps
-- only 14 digits.

-- The loaders keep a call by EVALSHA from building the functions of algorithms it does not use: the script's body
-- runs on every such call, and defining every algorithm's closures cost about a tenth of a lone fixed window's time.

local L, loaded = {}, {}

-- Per call: the table the descriptors' keys are read from: KEYS, where the keys are declared (one server, or one cluster slot);
-- batch.lua points it at ARGV for a cluster node's batch, whose keys span slots and travel among the arguments.
local K = KEYS

-- Per call: the number of the descriptor's decision under way in this call (decide.lua counts them): tiers that share a
-- counter (bucketed_window.lua) write it once per decision.
local decision = 0

-- The algorithm named `name`, or nil if there is none.
local function algorithm(name)
  local a = loaded[name]
  if a == nil and L[name] ~= nil then
    a = L[name]()
    loaded[name] = a
  end
  return a
end

local function ceil_ms(us)
  local ms = math.floor((us + 999) / 1000)
  if ms < 1 then ms = 1 end
  return ms
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

-- How long a reservation record outlives its expiry, so that the instance that made it can reap it
-- (`RESERVATION_GRACE_US` in store.rs).
local RESERVATION_GRACE_MS = 60000

-- The key of the window starting at `start` of the counter whose own key is `base` (store/key.rs, `CounterKey::window`):
-- `base`, ':', then the window's number (start / window) in lowercase hex.
local function window_key(base, start, window)
  return base .. ':' .. string.format('%x', start / window)
end

local function max0(x)
  if x < 0 then return 0 end
  return x
end

-- Each argument that heads a descriptor or counts a cost is read as a number once: most are the same few strings (a
-- handful of windows, a cost of 1), and tonumber costs more than a table lookup. Where the definitions outlive a call
-- (a Redis function) the numbers read are kept from call to call, up to 4 096 strings, then started afresh.
local numbers, numbered = {}, 0
local function number(s)
  local v = numbers[s]
  if v == nil then
    v = tonumber(s)
    if numbered >= 4096 then numbers, numbered = {}, 0 end
    numbers[s] = v
    numbered = numbered + 1
  end
  return v
end

-- The call's answers, in order: one value per descriptor, or as many as its compact form returns, ended by a nil
-- (batch.lua); the table is kept from call to call where the definitions outlive a call.
local answers = {}

-- The time of a call (per call): `arg` in microseconds, or, for '', the server's clock (TIME), read once per script call so
-- that every descriptor of a batch is decided at the same instant.
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
