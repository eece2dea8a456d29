-- lone_bucket.lua: a hit on a descriptor with one token or leaky bucket and nothing else to write, in the fewest
-- Redis commands and arguments: one GET of the arrival time, one SET of the new one when the hit fits and costs
-- something, four or five arguments, and an integer back. The decision itself (what is left, when to retry) is made
-- by sluice from that integer, exactly as token_bucket.lua's check would make it; the differential test holds the two
-- paths to the same answers.
--
-- Its key is the bucket's; its arguments (batch.lua reads them): the emission interval (ceil(window / limit), at
-- least 1), the burst, the cost (bounded by the burst + 1) and the decision's time `now`.
--
-- Returns the arrival time the hit found: the stored one, or `now` when it is earlier or there is none.

local function lone_bucket(key, interval, burst, cost, now)
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then tat = now end
  if cost > 0 and cost <= burst then
    local reach = tat + cost * interval
    if reach - now <= burst * interval then
      redis.call('SET', key, string.format('%d', reach), 'PX', ceil_ms(reach - now))
    end
  end
  return tat
end
