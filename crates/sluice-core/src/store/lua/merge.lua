-- merge.lua: takes one region's counts of global windows, shipped by that region (see `regions.rs`).
-- KEYS[i]   the hash `<window key>@regions` of one window (prelude.lua's regions_count reads it)
-- ARGV      the region that counted, then per key: its own count of the window, and how long (ms) the window still
--           weighs by the shipper's clock (its end, a sliding window's next one too, and a second's grace)
-- Returns how many hashes changed.
-- Invariants: a region's field only grows (the larger of the shipped and held counts is kept), so a batch applied
-- twice, late or out of order changes nothing. Every shipment of a window names the same end, so its expiry stays put.

local region, changed = ARGV[1], 0
for i, key in ipairs(KEYS) do
  local count, ttl = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local held = tonumber(redis.call('HMGET', key, region)[1])
  if held == nil or count > held then
    redis.call('HSET', key, region, string.format('%d', count))
    changed = changed + 1
  end
  redis.call('PEXPIRE', key, ttl)
end
return changed
