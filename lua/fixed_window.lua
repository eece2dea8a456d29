-- fixed_window.lua: one hit against an epoch-aligned fixed window.
--
-- KEYS[1]  the counter of the current window; its name holds the window start, so a new window is a new key
-- ARGV[1]  cost: the hits to add; 0 reads the count without writing anything
-- ARGV[2]  ttl_ms: milliseconds until the window ends, the counter's lifetime
--
-- Returns the count after the hit (for a cost of 0, the current count; 0 when the counter does not exist).
--
-- Invariants:
-- * INCRBY and the first hit's PEXPIRE run in one atomic script: a counter never exists without a TTL.
-- * The TTL is set once, on the hit that creates the counter, and never extended.
-- * A cost of 0 never creates a key.
-- * Like the reference, a hit is counted even when it goes over the limit; the caller compares the count.
local cost = tonumber(ARGV[1])
if cost == 0 then
  return tonumber(redis.call('GET', KEYS[1]) or '0')
end
local used = redis.call('INCRBY', KEYS[1], cost)
if used == cost then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return used
