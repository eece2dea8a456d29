-- token_bucket.lua: a bucket of `burst` tokens refilled continuously at `limit` per `window`, as GCRA. Also the
-- leaky bucket (burst 1 by default): hits evenly spaced.
--
-- State: a string, the theoretical arrival time (TAT, us): when the bucket would be full again. The emission
-- interval is ceil(window / limit) us, so the sustained rate is never above the configured one. The key expires when
-- the bucket is full again.
-- Invariants: a denied hit writes nothing, unless it is forced: then the TAT moves by its cost, at most burst + 1
-- tokens, even past the tolerance (a debt that later hits see and that drains at the refill rate), up to MAX_DEBT_US
-- past an empty bucket. A cost of 0 writes nothing. A settlement's refund moves the TAT back, never before now, on a
-- key that exists (and the key's expiry with it, as every write does).

-- The compact hit (batch.lua): a hit on a descriptor with one token or leaky bucket and nothing else to write, in the
-- fewest Redis commands and arguments: four or five arguments and an integer back. The decision itself (what is left,
-- when to retry) is made by sluice from that integer, exactly as M.check below would make it; the differential test
-- holds the two paths to the same answers.
--
-- Its key is the bucket's; its arguments (batch.lua reads them): the emission interval (ceil(window / limit), at
-- least 1), the burst, the cost (bounded by the burst + 1) and the decision's time `now`.
--
-- Returns the arrival time the hit found: the stored one, or `now` when it is earlier or there is none.
--
-- A bucket that several compact calls of one script call hit (`shared`: a hot tenant) is read once and written once, at
-- the end (or before a descriptor of decide.lua's form, which may read it; prelude.lua's flush): the hits are
-- decided one after the other on the arrival time the previous one left, exactly as serial hits, for one GET and one
-- SET in all. A write that fails turns the answers of the hits it carried into its error: they were not counted. A
-- bucket hit once is read and written at once, with nothing to remember.

-- Per bucket read in this call: its stored arrival time as the hits so far leave it (-1: none).
local bucket_tats = {}
-- Per bucket to write: the time of the last hit that moved it, and the descriptors (their places in the call) whose
-- hits did.
local bucket_writes, bucket_movers = {}, {}

-- The buckets this call shares (prelude.lua's keep).
local shared_buckets = {}

-- Writes what the hits of this call moved, each bucket once with the expiry of its last write, and forgets what was
-- read.
function shared_buckets.flush()
  for key, at in pairs(bucket_writes) do
    local tat = bucket_tats[key]
    local ok, err = pcall(redis.call, 'SET', key, string.format('%d', tat), 'PX', string.format('%d', ceil_ms(tat - at)))
    if not ok then failed(bucket_movers[key], err) end
  end
  bucket_tats, bucket_writes, bucket_movers = {}, {}, {}
end

function shared_buckets.forget()
  bucket_tats, bucket_writes, bucket_movers = {}, {}, {}
end

local function compact_bucket(key, interval, burst, cost, now, pos, shared)
  local stored
  if shared then stored = bucket_tats[key] end
  if stored == nil then stored = tonumber(redis.call('GET', key)) or -1 end
  local tat = stored
  if tat < now then tat = now end
  if cost > 0 and cost <= burst then
    local reach = tat + cost * interval
    if reach - now <= burst * interval then
      stored = reach
      if not shared then
        redis.call('SET', key, string.format('%d', reach), 'PX', string.format('%d', ceil_ms(reach - now)))
      else
        bucket_writes[key] = now
        moved(bucket_movers, key, pos)
      end
    end
  end
  if shared then
    bucket_tats[key] = stored
    keep(shared_buckets)
  end
  return tat
end

function L.token_bucket()
  local M = {}

  local function interval_of(limit, window)
    local rate = math.max(limit, 1)
    return math.floor((window + rate - 1) / rate)
  end

  -- Sees the arrival time, `now` when it is earlier or there is none (decide.lua's interface, prelude.lua). A cost
  -- above the bucket never fits: it is not priced (its product could leave the exact range).
  M.width, M.burst = 1, true

  function M.check(j, now, cost, limit, window, burst)
    local interval = interval_of(limit, window)
    local tat = tonumber(redis.call('GET', K[j])) or now
    if tat < now then tat = now end
    return cost <= burst and tat + cost * interval - now <= burst * interval, tat, -1, -1
  end

  function M.left(tat, _, _, now, limit, window, burst)
    local interval = interval_of(limit, window)
    return max0(math.floor((now + burst * interval - tat) / interval))
  end

  -- Moves the arrival time seen by `cost` tokens. A forced hit is charged at most burst + 1 tokens, and its debt
  -- stops at MAX_DEBT_US past an empty bucket (a debt already past that, after the clock stepped back, is kept, never
  -- forgiven). Returns the time until the bucket is full again.
  function M.commit(j, now, cost, limit, window, burst, force, tat)
    local interval = interval_of(limit, window)
    local new = tat + cost * interval
    if force then
      new = math.max(math.min(tat + math.min(cost, burst + 1) * interval, now + burst * interval + MAX_DEBT_US), tat)
    end
    redis.call('SET', K[j], string.format('%d', new), 'PX', ceil_ms(new - now))
    return '', new - now
  end

  -- Moves the arrival time back by `amount` tokens, never before `now`. Only as many tokens as the arrival time is
  -- past `now` are priced, so the product stays exact whatever the amount.
  function M.refund(j, now, at, amount, limit, window)
    local key = K[j]
    local interval = interval_of(limit, window)
    local tat = tonumber(redis.call('GET', key))
    if tat == nil or tat <= now then return nil end
    -- Back to `now` at most: then only the whole tokens the arrival time was past `now` came back.
    local new, given = now, math.floor((tat - now) / interval)
    if amount < math.floor((tat - now + interval - 1) / interval) then new, given = tat - amount * interval, amount end
    return given, function() redis.call('SET', key, string.format('%d', new), 'PX', ceil_ms(new - now)) end
  end
  M.hit = compact_bucket
  return M
end
L.leaky_bucket = L.token_bucket
