-- batch.lua: the script's entry. One call decides a batch of descriptors in order, each against its own keys and
-- arguments, each atomically (the whole call is). sluice puts every descriptor of one request in one call, and
-- against a standalone Redis also the descriptors of concurrent requests: Redis's fixed cost per call (reading and
-- parsing the command, entering the script, the reply's write) and sluice's per command are then paid once per batch.
-- In a Redis Cluster the descriptors of concurrent requests that live on one primary, whatever their slots, share a
-- call in the node form below (the script is then loaded with the flag allow-cross-slot-keys: see `CLUSTER_SCRIPT`).
--
-- Two forms:
-- declared  KEYS: every descriptor's keys, one descriptor after the other (one server, or one cluster slot).
--           ARGV[1]: n, the number of descriptors; then per descriptor: its key count, its argument count, and its
--           arguments as decide.lua reads them (or lone_fixed_window.lua's compact form).
-- node      no KEYS: the keys span slots, which Redis refuses of declared keys, so they travel among the arguments.
--           ARGV[1]: 'node'; ARGV[2]: n; then per descriptor: its key count, its argument count, its probe key (the
--           descriptor's key prefix and hash tag alone: a key of its slot that sluice never writes; '' for none),
--           its keys, and its arguments as decide.lua reads them.
--
-- Returns one answer per descriptor, in order: decide.lua's array, or a string, the error that stopped that
-- descriptor (a wrong-type key, an unknown algorithm); the others are decided all the same. In the node form also 0:
-- the descriptor was not decided because its slot is not served here in a stable state, and nothing of it was
-- written; the caller sends it again to its slot.
--
-- Invariants: in the node form a descriptor is decided only once a read of its probe key succeeded. That read
-- succeeds only where the slot is served by this node and is not migrating (a key absent from a migrating slot is
-- refused with ASK, one of a slot served elsewhere with MOVED), and then every command on any key of the slot is
-- served here for the rest of the call: no slot changes hands while a script runs. A descriptor of a migrating slot
-- is therefore refused before anything is written, never part-way (a migrating slot serves only the keys it still
-- holds, so a key created or emptied by the decision could be refused after another was written). Each probe key is
-- read once per call. A lone fixed window in the compact form is the exception: it has one key, never empties it,
-- and reads it before writing, so the read of its own key is its probe.

local function decide_one(k, nk, a)
  return lone_fixed_window(k, nk, a) or decide(k, nk, a)
end

local node = ARGV[1] == 'node'
local n, k, a = tonumber(ARGV[1]), 1, 2
local served = {}
if node then
  K = ARGV
  n, a = tonumber(ARGV[2]), 3
end

local answers = {}
for i = 1, n do
  local nk, na = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  local here, unprobed = true, false
  if node then
    local probe = ARGV[a]
    k = a + 1
    a = a + 1 + nk
    -- A lone fixed window in its compact form touches its one key only, and reads it first: that read is refused
    -- exactly where the probe's would be (a slot not served here, or migrating with the key already gone), before
    -- anything is written. The refusal stands in for the probe and saves a command per descriptor.
    unprobed = nk == 1 and ARGV[a] == 'fw'
    if not unprobed then
      here = served[probe]
      if here == nil then
        here = probe ~= '' and (pcall(redis.call, 'GET', probe))
        served[probe] = here
      end
    end
  end
  local answer = 0
  if here then
    local ok
    ok, answer = pcall(decide_one, k, nk, a)
    if not ok then
      if type(answer) == 'table' then answer = answer.err end
      answer = tostring(answer)
      -- Refused as not served here: not decided, nothing written; sent again to its slot.
      local refused = string.find(answer, 'non local key', 1, true) or string.find(answer, 'cluster is down', 1, true)
      if unprobed and refused then answer = 0 end
    end
  end
  answers[i] = answer
  if not node then k = k + nk end
  a = a + na
end
return answers
