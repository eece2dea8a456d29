-- compact_global.lua: a hit on a descriptor with one global window (`global: true`, a fixed or a sliding window; see
-- global.lua) and nothing else to write, in the fewest Redis commands and arguments: the window's own count read, the
-- other regions' counts read from their hash (`<window key>@regions`, the sum of its values), and when the hit fits,
-- one write; integers back. The decision itself (what is left, when to retry, the sum reported as used) is made by
-- sluice from those integers, the limit and the time, exactly as global.lua's check would make it (and the memory
-- store's twin, `store/algorithm.rs`'s `global_check`); the differential test holds the paths to the same answers.
--
-- Keys (as the plain compact forms build them, by sluice's clock or rebuilt for the server's window): a fixed
-- window's key; a sliding window's current and previous windows' keys. Arguments (batch.lua reads them): 'gw' (a
-- fixed window) or 'gs' (a sliding one), the window, the limit, the cost (bounded by the limit + 1), then the time.
--
-- Writes into answers[pos] on: a fixed window's count before the hit and the others' count of its window (2 places);
-- a sliding window's current and previous counts before the hit and the others' weighted estimate (3 places).
-- Invariants: as global.lua's: never counts a denial (nor a cost of 0), never writes the regions' hashes; the window's
-- own key is written exactly as its algorithm's commit writes it.

local function compact_global(fixed, keys, window, limit, cost, text, now, pos)
  local start = now - now % window
  if fixed then
    local wkey, base = window_of(keys[1], start)
    local n, exists, folds = window_count(wkey, base, start)
    local others = regions_count(wkey)
    if cost > 0 and n + cost <= max0(limit - others) then
      local count = string.format('%d', math.min(n + cost, MAX_COUNT))
      if exists then
        redis.call('SET', wkey, count, 'KEEPTTL')
      else
        redis.call('SET', wkey, count, 'PX', ceil_ms(start + window - now + WINDOW_KEY_GRACE_US))
        if folds then redis.call('DEL', base) end
      end
    end
    answers[pos], answers[pos + 1] = n, others
    return
  end
  local cur, prev = keys[1], keys[2]
  local expected = tonumber(string.match(cur, ':(%d+)$'))
  if expected ~= start then cur, prev = window_of(cur, start), window_of(cur, start - window) end
  local s = sw_read(cur, prev, start, window)
  local c, p, elapsed = s.c, s.p, now - start
  local others = sw_estimate(regions_count(prev), regions_count(cur), elapsed, window)
  local room = max0(limit - others)
  if cost > 0 and cost <= room and sw_estimate(p, c, elapsed, window) + cost <= room then
    sw_add(s, cost, now, window, text)
  end
  answers[pos], answers[pos + 1], answers[pos + 2] = c, p, others
end
