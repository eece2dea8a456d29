-- lone_fixed_window.lua: the most common call, a hit on a descriptor with one fixed-window limit and nothing else to
-- write, decided without the driver's tables and from fewer arguments. It answers exactly as decide.lua does for the
-- same hit with fixed_window.lua (same state, same answer, denials counted as the reference does unless the cost
-- exceeds the limit); the differential test holds the two paths to the same answers. It repeats fixed_window.lua's
-- check instead of going through the algorithm table, which costs a third of the call's time in Redis, and its
-- arguments are a compact form of the driver's: each argument is parsed by Redis and read by the script on every
-- descriptor.
--
-- Its key is K[k] (see prelude.lua); its arguments, from ARGV[a]: 'fw', the time in microseconds ('' for the
-- server's clock), the cost (bounded by the limit + 1), the limit, the window in microseconds. sluice sends this form
-- for an ordinary hit (decide.lua's mode 'hit') with one fixed_window tier, no hit records, no queue fields and no
-- reservation. Any other call returns nil and goes to decide.lua.

local function lone_fixed_window(k, nk, a)
  if nk ~= 1 or ARGV[a] ~= 'fw' then return nil end
  local key = K[k]
  local now = clock(ARGV[a + 1])
  local cost, limit, window = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local start = now - now % window
  local f = redis.call('HMGET', key, 'w', 'n')
  local n = 0
  if tonumber(f[1]) == start then n = tonumber(f[2]) end
  local reset = start + window - now
  local ok = n + cost <= limit
  local retry = 0
  if cost > limit then retry = -1 elseif not ok then retry = reset end
  if cost > 0 and cost <= limit then
    redis.call('HSET', key, 'w', string.format('%d', start), 'n', string.format('%d', math.min(n + cost, MAX_COUNT)))
    if n == 0 then redis.call('PEXPIRE', key, ceil_ms(reset)) end
  end
  local remaining = limit - n - cost
  if not ok or remaining < 0 then remaining = 0 end
  local admitted = ok and 1 or 0
  return { admitted, admitted, n + cost, remaining, reset, retry, '' }
end
