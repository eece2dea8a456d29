-- layout.lua: when this server's counters first took compact names (`KeyLayout` in store/key.rs), read once when
-- sluice connects with the compact layout.
--
-- KEYS[1]: the marker, `<prefix>layout` (a key no counter can have: counters' keys have a hash tag).
-- ARGV[1]: the time now, in microseconds.
--
-- Returns the marker's value: the time sluice first wrote compact keys here, or 'fresh' when the server held no key
-- at all then (no counter of an earlier version to move).
--
-- Invariants: the marker is written once, without expiry, and never changed; the first instance to start sets it
-- for all.

local at = redis.call('GET', KEYS[1])
if at then return at end
local value = ARGV[1]
if redis.call('DBSIZE') == 0 then value = 'fresh' end
redis.call('SET', KEYS[1], value)
return value
