-- batch.lua: the script's entry. One call decides a batch of descriptors in order, each against its own keys and
-- arguments, each atomically (the whole call is). sluice puts every descriptor of one request in one call, and
-- against a standalone Redis also the descriptors of concurrent requests: Redis's fixed cost per call (reading and
-- parsing the command, entering the script, the reply's write) and sluice's per command are then paid once per batch.
-- In a Redis Cluster the descriptors of concurrent requests that live on one primary, whatever their slots, share a
-- call in the node form below (the script is then loaded with the flag allow-cross-slot-keys: see `CLUSTER_SCRIPT`).
--
-- Two forms:
-- declared  KEYS: every descriptor's keys, one descriptor after the other (one server, or one cluster slot).
--           ARGV[1]: n, the number of descriptors (a run below counting once); ARGV[2]: the timing (below); then per
--           descriptor its arguments: a plain counter's (fixed_window.lua's fast form, headed by its window, a
--           positive number; or a run of them, 'f'), or the decision loop's (decide.lua, headed by its mode), then
--           its time when each carries its own. Descriptors in a row whose arguments are the same (every one of
--           them) may go as one run: '*', their number, and the arguments once (counting once in n); each has its
--           own keys.
-- node      no KEYS: the keys span slots, which Redis refuses of declared keys, so they travel among the arguments.
--           ARGV[1]: 'node'; ARGV[2]: n; ARGV[3]: the timing; then per descriptor its arguments (its time among
--           them as above), then a plain counter's key, or the decision loop's probe key (the descriptor's key prefix
--           and hash tag alone: a key of its slot that sluice never writes; '' for none) and its keys.
--
-- The timing: '' when every descriptor carries its own time (its last argument), else the time, by sluice's clock,
-- the windows' keys were built for: the call is then decided by the server's clock (TIME, read once per call), and a
-- window the server sees otherwise (the two clocks across an edge) gets its own key.
--
-- Returns the answers in order, each descriptor's in as many places as its form answers: a plain counter's integer,
-- or the decision loop's (decide.lua); or a string in its first place (and 0 in its others), the error that stopped that descriptor (a wrong-type key); the others are decided all the same.
-- In the node form also false (nil to the caller) in its first place: the descriptor was not decided because its slot
-- is not served here in a stable state, and nothing of it was written; the caller sends it again to its slot. Then
-- one more value: the server's time in microseconds if the call read it (some descriptor was decided by the server's
-- clock), else 0.
--
-- Invariants: in the node form a descriptor of the decision loop is decided only once a read of its probe key
-- succeeded. That read succeeds only where the slot is served by this node and is not migrating (a key absent from a
-- migrating slot is refused with ASK, one of a slot served elsewhere with MOVED), and then every command on any key of
-- the slot is served here for the rest of the call: no slot changes hands while a script runs. A descriptor of a
-- migrating slot is therefore refused before anything is written, never part-way (a migrating slot serves only the
-- keys it still holds, so a key created or emptied by the decision could be refused after another was written). Each
-- probe key is read once per call. A plain counter needs no probe: its one command is refused exactly where the probe's
-- read would be, before anything is written.

-- The call under way, set by batch() at its start: whether it is in the node form, where its next keys (k) and
-- arguments (a) are, the probe keys read (node form), the server's time the timing asks for (now), and where the next
-- answer goes (o: a descriptor's answer takes as many places as its form answers).
local node, k, a, served, now, o

-- The time a descriptor carried last, as text and as read: the descriptors of a call decided at one given time carry
-- the same text, read once.
local time_text, time_at

-- What a descriptor that failed answers: its error, or, refused as not served here, false (not decided, nothing
-- written; sent again to its slot).
local function error_of(err)
  if type(err) == 'table' then err = err.err end
  err = tostring(err)
  if node and (string.find(err, 'non local key', 1, true) or string.find(err, 'cluster is down', 1, true)) then
    return false
  end
  return err
end

-- A descriptor that failed with `err` answers it in its first place and 0 in its `width - 1` others.
local function failure(err, width)
  answers[o] = error_of(err)
  for j = 1, width - 1 do answers[o + j] = 0 end
end

-- A run of plain counters (lone fixed windows) that share their window and cost, decided by the server's clock
-- (declared form): 'f', their number, the window and the cost; a key each.
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

-- A descriptor in decide.lua's form: its arguments, its time when each carries its own, then in the node form its
-- probe key (the descriptor's key prefix and hash tag alone, '' for none) and its keys. Decided only where its probe
-- was read (node form): a slot served here in a stable state.
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

-- Decides the descriptor whose head is at ARGV[a] (keys from K[k], answer at answers[o]), and moves past it: a run's
-- 'f', a plain counter's window (most often a number read before, found in `numbers`: see `number`), or the decision
-- loop's mode (found there as false).
local function decide_one()
  local head = ARGV[a]
  if head == 'f' then return run() end
  local window = numbers[head]
  if window == nil then window = number(head) end
  if not window then return generic() end
  -- The commonest call, a plain counter (a lone fixed window): its cost, (time), and in the node form its key.
  local text, key, at, width = ARGV[a + 1], K[k], now, 2
  if guess == nil then at, width = tonumber(ARGV[a + 2]), 3 end
  if node then key = ARGV[a + width] end
  local ok, answer = pcall(algorithm('counter').hit, key, window, number(text), text, at, guess)
  if ok then answers[o] = answer else failure(answer, 1) end
  if node then a = a + width + 1 else a, k = a + width, k + 1 end
  o = o + 1
end

-- The entry: decides the call's descriptors (KEYS and ARGV, as above) and returns their answers. Everything a call
-- leaves behind is set afresh here: run as a Redis function, the script's definitions are made once and outlive
-- every call, where run by EVALSHA they are made again at each.
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
      -- A run of descriptors that share every argument (declared form): '*', their number, then one's
      -- arguments; each decided in its place, with its own keys, as if its arguments were repeated.
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
