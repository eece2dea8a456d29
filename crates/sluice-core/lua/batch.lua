-- batch.lua: the script's entry. One call decides a batch of descriptors in order, each against its own keys and
-- arguments, each atomically (the whole call is). sluice puts every descriptor of one request in one call, and
-- against a standalone Redis also the descriptors of concurrent requests: Redis's fixed cost per call (reading and
-- parsing the command, entering the script, the reply's write) and sluice's per command are then paid once per batch.
--
-- KEYS      every descriptor's keys, one descriptor after the other
-- ARGV[1]   n, the number of descriptors; then per descriptor: its key count, its argument count, and its arguments
--           as decide.lua reads them
--
-- Returns one answer per descriptor, in order: decide.lua's array, or a string, the error that stopped that
-- descriptor (a wrong-type key, an unknown algorithm); the others are decided all the same.

local function decide_one(k, nk, a)
  return lone_fixed_window(k, nk, a) or decide(k, nk, a)
end

local answers = {}
local k, a = 1, 2
for i = 1, tonumber(ARGV[1]) do
  local nk, na = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  local ok, answer = pcall(decide_one, k, nk, a)
  if not ok then
    if type(answer) == 'table' then answer = answer.err end
    answer = tostring(answer)
  end
  answers[i] = answer
  k = k + nk
  a = a + na
end
return answers
