-- counts.lua: this region's own counts of global windows, read for shipping to the other regions (`regions.rs`).
--
-- KEYS[i]   one window's key (`<key>:<window>`, as fixed_window.lua and sliding_window.lua keep it)
-- Returns each window's count, in order (0 for a key that does not exist).
-- Invariants: reads only.

local out = {}
for i, key in ipairs(KEYS) do out[i] = tonumber(redis.call('GET', key)) or 0 end
return out
