-- move.lua: moves counters an earlier version wrote under keys of the full layout to their compact names, before a
-- decision reads them, while the key layout moves (`KeyLayout::Moving` in store/key.rs). Not part of the decision
-- script: sluice calls it only while the layout moves, one call per request against one server, one per descriptor in
-- a cluster (the two names of a counter share its hash tag, so a descriptor's pairs live on one slot).
--
-- KEYS: pairs, a counter's name in the full layout then its compact name.
-- ARGV: per pair, 'n' when the counter is a count (a window's or a sub-window's integer), else 'm'.
--
-- Returns the number of counters moved or added.
--
-- Invariants: a counter is renamed only where its compact name holds nothing (RENAME keeps its value and its
-- expiry); a count found under both names (a window counted by instances of both versions) is added to the compact
-- one, whose expiry stays, and its full name deleted; any other state under both names is left to expire under the
-- full one. Nothing is created that did not exist under one of the names, so a move never counts a hit twice or
-- loses one.

local moved = 0
for i = 1, #KEYS, 2 do
  local old, new = KEYS[i], KEYS[i + 1]
  if redis.call('EXISTS', old) == 1 then
    if redis.call('EXISTS', new) == 0 then
      redis.call('RENAME', old, new)
      moved = moved + 1
    elseif ARGV[(i + 1) / 2] == 'n' then
      local n = tonumber(redis.pcall('GET', old))
      if n ~= nil and type(redis.pcall('INCRBY', new, string.format('%d', n))) == 'number' then
        redis.call('DEL', old)
        moved = moved + 1
      end
    end
  end
end
return moved
