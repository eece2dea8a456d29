-- compact_bucket.lua: a hit on a descriptor with one token or leaky bucket and nothing else to write, in the fewest
-- Redis commands and arguments: four or five arguments and an integer back. The decision itself (what is left, when
-- to retry) is made by sluice from that integer, exactly as token_bucket.lua's check would make it; the differential
-- test holds the two paths to the same answers.
--
-- Its key is the bucket's; its arguments (batch.lua reads them): the emission interval (ceil(window / limit), at
-- least 1), the burst, the cost (bounded by the burst + 1) and the decision's time `now`.
--
-- Returns the arrival time the hit found: the stored one, or `now` when it is earlier or there is none.
--
-- A bucket that several compact calls of one script call hit (`shared`: a hot tenant) is read once and written once, at
-- the end (or before a descriptor of the driver's form, which may read it; batch.lua's flush_compact): the hits are
-- decided one after the other on the arrival time the previous one left, exactly as serial hits, for one GET and one
-- SET in all. A write that fails turns the answers of the hits it carried into its error: they were not counted. A
-- bucket hit once is read and written at once, with nothing to remember.

-- Per bucket read in this call: its stored arrival time as the hits so far leave it (-1: none).
local bucket_tats = {}
-- Per bucket to write: the time of the last hit that moved it, and the descriptors (their places in the call) whose
-- hits did.
local bucket_writes, bucket_movers = {}, {}

-- Notes that the hit whose answer is at `pos` moved the shared counter `key`: its answer stands only if the write at
-- the end succeeds.
local function compact_moved(movers, key, pos)
  local list = movers[key]
  if list == nil then
    movers[key] = { pos }
  else
    list[#list + 1] = pos
  end
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
        compact_moved(bucket_movers, key, pos)
      end
    end
  end
  if shared then bucket_tats[key] = stored end
  return tat
end

-- Turns the answers of the hits a failed write carried into its error (in their first place): they were not counted.
local function compact_failed(movers, err)
  if type(err) == 'table' then err = err.err end
  for _, pos in ipairs(movers) do answers[pos] = tostring(err) end
end
