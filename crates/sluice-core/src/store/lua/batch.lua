-- batch.lua: the script's entry. One call decides a batch of descriptors in order, each against its own keys and
-- arguments, each atomically (the whole call is), paying Redis's and sluice's fixed costs per call once per batch: a
-- request's descriptors, and on a standalone Redis those of concurrent requests too. In a Redis Cluster, those on one
-- primary share a call in the node form, whatever their slots (flag allow-cross-slot-keys: `CLUSTER_SCRIPT`).
--
-- declared form: KEYS: every descriptor's keys in turn (one server, or one cluster slot). ARGV: n, the number of
--   descriptors (a run counting once); the timing; then per descriptor its arguments, then its time if each carries
--   its own. A plain counter's (fixed_window.lua's fast form) are headed by its window, a positive number, a run of
--   them by 'f'; the decision loop's (decide.lua) by its mode. Descriptors in a row with all the same arguments may go
--   as one run: '*', their number, the arguments once; each has its own keys.
-- node form: no KEYS (keys spanning slots are refused if declared). ARGV: 'node'; n; the timing; then per descriptor
--   its arguments (time as above), then a plain counter's key, or the decision loop's probe key (the descriptor's key
--   prefix and hash tag alone: a key of its slot that sluice never writes; '' for none) and its keys.
-- The timing: '' when every descriptor carries its own time (its last argument), else the time by sluice's clock the
-- window keys were built for: the call then goes by the server's clock (TIME, read once per call), and a window the
-- server sees otherwise (the clocks across an edge) gets its own key.
--
-- Returns each descriptor's answer in order, in as many places as its form answers: a plain counter's integer, or
-- decide.lua's; or the error that stopped it (a wrong-type key) first and 0 in its other places, the others decided
-- all the same; in the node form, false (nil to the caller) first if its slot is not served here in a stable state:
-- nothing written, the caller sends it again to its slot. Then the server's time (us) if the call read it, else 0.
--
-- Invariants: in the node form a decision-loop descriptor is decided only once a read of its probe key succeeded:
-- only where this node serves the slot and it is not migrating (else ASK or MOVED), and then the slot is served here
-- for the rest of the call (no slot changes hands while a script runs). So a migrating slot's descriptor is refused
-- before anything is written, never part-way (such a slot serves only the keys it still holds: a key the decision
-- creates or empties could be refused after another was written). Each probe key is read once per call. A plain
-- counter needs no probe: its one command is refused exactly where the probe's read would be, before any write.

-- Per call (set by batch()): whether in the node form, the next keys (k) and arguments (a), the probe keys read
-- (node form), the server's time if the timing asks for it (now), and where the next answer goes (o).
local node, k, a, served, now, o

-- The time a descriptor carried last, as text and as read: a call's descriptors mostly share it, read once.
local time_text, time_at

-- A failed descriptor's answer: its error, or false if refused as not served here (node form).
local function error_of(err)
  if type(err) == 'table' then err = err.err end
  err = tostring(err)
  if node and (string.find(err, 'non local key', 1, true) or string.find(err, 'cluster is down', 1, true)) then
    return false
  end
  return err
end

local function failure(err, width)
  answers[o] = error_of(err)
  for j = 1, width - 1 do answers[o + j] = 0 end
end

-- A run of plain counters by the server's clock (declared form): 'f', their number, window and cost; a key each.
local function run()
  local m, w, text = number(ARGV[a + 1]), number(ARGV[a + 2]), ARGV[a + 3]
  local cost, hit = number(text), algorithm('counter').hit
  for _ = 1, m do
    local ok, answer = pcall(hit, K[k], w, cost, text, now, guess)
    if ok then answers[o] = answer else failure(answer, 1) end
    k, o = k + 1, o + 1
  end
  a = a + 4
end

-- A descriptor in decide.lua's form; in the node form decided only where its probe was read.
local function generic()
  local ends, nk = read(a)
  local w, at = places_answered, now
  if guess == nil then
    local text = ARGV[ends]
    if text ~= time_text then time_text, time_at = text, tonumber(text) end
    at = time_at
    ends = ends + 1
  end
  local here, keys = true, k
  if node then
    local probe = ARGV[ends]
    keys = ends + 1
    here = served[probe]
    if here == nil then
      here = probe ~= '' and (pcall(redis.call, 'GET', probe))
      served[probe] = here
    end
  end
  if not here then
    answers[o] = false
    for j = 1, w - 1 do answers[o + j] = 0 end
  else
    local ok, err = pcall(decide, keys, at, o)
    if not ok then failure(err, w) end
  end
  if node then a = ends + 1 + nk else a, k = ends, k + nk end
  o = o + w
end

-- Decides the descriptor headed at ARGV[a] (keys from K[k], answer at answers[o]) and moves past it. The head: a
-- run's 'f', a plain counter's window (mostly found in `numbers`), or the decision loop's mode (there as false).
local function decide_one()
  local head = ARGV[a]
  if head == 'f' then return run() end
  local window = numbers[head]
  if window == nil then window = number(head) end
  if not window then return generic() end
  -- The commonest call, a plain counter: its cost, (time), and in the node form its key.
  local text, key, at, width = ARGV[a + 1], K[k], now, 2
  if guess == nil then at, width = tonumber(ARGV[a + 2]), 3 end
  if node then key = ARGV[a + width] end
  local ok, answer = pcall(algorithm('counter').hit, key, window, number(text), text, at, guess)
  if ok then answers[o] = answer else failure(answer, 1) end
  if node then a = a + width + 1 else a, k = a + width, k + 1 end
  o = o + 1
end

-- The entry. It sets afresh everything a call leaves behind (prelude.lua).
local function batch()
  if floor == nil then floor, max, min = math.floor, math.max, math.min end
  K, server_now = KEYS, nil
  node = ARGV[1] == 'node'
  local n
  n, k, a, o = tonumber(ARGV[1]), 1, 3, 1
  if node then
    K, served = ARGV, {}
    n, a = tonumber(ARGV[2]), 4
  end
  guess = tonumber(ARGV[a - 1])
  now = nil
  if guess ~= nil then now = clock('') end

  for _ = 1, n do
    if ARGV[a] == '*' then
      -- A run (declared form): each descriptor decided in its place, with its own keys, as if the arguments repeated.
      local m, from = number(ARGV[a + 1]), a + 2
      for _ = 1, m do
        a = from
        decide_one()
      end
    else
      decide_one()
    end
  end
  -- The answers end at the first nil: what an earlier, larger call left past them is not part of this one's.
  answers[o], answers[o + 1] = server_now or 0, nil
  return answers
end
