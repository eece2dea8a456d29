-- lone_fixed_window.lua: the most common call, a hit on a descriptor with one fixed-window limit, decided without
-- the driver's tables. batch.lua tries it first for every descriptor; it answers exactly as decide.lua does for
-- such a call with fixed_window.lua (same state, same answer, denials counted as the reference does unless the cost
-- exceeds the limit), and returns
-- nil for any other call. It repeats fixed_window.lua's check instead of going through the algorithm table, which
-- costs a third of the call's time in Redis. The differential test holds the two paths to the same answers.
--
-- The arguments are decide.lua's, from ARGV[a], and its key is K[k] (see prelude.lua): one key, mode 'hit', no hit
-- records, no queue fields, one fixed_window tier (algorithm, limit, window, burst, cost: its own cost, or '' for the
-- hit's, ARGV[a + 2]).

local function lone_fixed_window(k, nk, a)
  if nk ~= 1 or ARGV[a] ~= 'hit' or ARGV[a + 4] ~= '0' or ARGV[a + 6] ~= '0' or ARGV[a + 7] ~= 'fixed_window' then
    return nil
  end
  local key = K[k]
  local now = clock(ARGV[a + 1])
  local cost = tonumber(ARGV[a + 11]) or tonumber(ARGV[a + 2])
  local limit, window = tonumber(ARGV[a + 8]), tonumber(ARGV[a + 9])
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
