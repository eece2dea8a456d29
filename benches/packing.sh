#!/usr/bin/env bash
# How a descriptor's counters could be kept in Redis, measured: Redis's CPU (utime + stime from /proc) per descriptor
# for each way of keeping the same counts, in minimal scripts that each decide 32 descriptors per call over 100 000
# descriptors, driven by redis-benchmark pipelined, every script reading the server's clock (TIME) so that a second's
# window rolls as it does in service. Against the floor of the same run: one INCRBY per descriptor and a PEXPIRE on
# its first count (`redis_cost.sh`'s floor). Each script counts the same hit; none decides (no limit is reached), so
# the rows differ only in how the counts are stored:
#   three windows (a second, a minute and an hour on one descriptor):
#     keys     a key per window, `<descriptor>:<window number>` (the layout sluice keeps): an INCRBY each, a PEXPIRE on
#              a window's first count
#     text     one key, the three windows' starts and counts as decimal text: a GET, a SET with the longest expiry
#     struct   one key, the same six numbers packed as doubles (Lua's `struct`): a GET, a SET
#     hash     one hash, a field per window holding `<start>:<count>`: an HMGET, an HSET, a PEXPIRE
#   one sliding window of an hour:
#     keys     the current and the previous window's keys (the layout sluice keeps): an INCRBY, a GET, a PEXPIRE on
#              the window's first count
#     text     one key, `<start> <current> <previous>`: a GET, a SET
#     struct   one key, the same three numbers packed as doubles: a GET, a SET
# DURATION is not used: each row is CALLS calls (100 000) of 32 descriptors, after one warm-up pass of the same.
# ROUNDS (1) repeats the table; FORMS (all) names the rows to run, e.g. FORMS="three_keys three_struct". Needs
# redis-server and redis-benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
CALLS=${CALLS:-100000}
ROUNDS=${ROUNDS:-1}
# shellcheck source=benches/common.sh
source benches/common.sh
for tool in redis-server redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install redis-server redis-tools)"; exit 1; }
done
start_redis

# The scripts. Each reads TIME once per call; `now` is in microseconds.
head='local t = redis.call("TIME") local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) '
declare -A script
script[floor]='for i = 1, #KEYS do local n = redis.call("INCRBY", KEYS[i], 1) if n == 1 then redis.call("PEXPIRE", KEYS[i], 3600000) end end return 1'
script[three_keys]=$head'local W = {1000000, 60000000, 3600000000}
for i = 1, #KEYS do
  for j = 1, 3 do
    local w = W[j] local start = now - now % w
    local key = KEYS[i] .. ":" .. string.format("%x", start / w)
    if redis.call("INCRBY", key, 1) == 1 then
      redis.call("PEXPIRE", key, math.floor((start + w - now) / 1000) + 1001)
    end
  end
end
return 1'
script[three_text]=$head'local W = {1000000, 60000000, 3600000000}
for i = 1, #KEYS do
  local s = redis.call("GET", KEYS[i])
  local v = {0, 0, 0, 0, 0, 0}
  if s then
    local a, b, c, d, e, f = string.match(s, "^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$")
    v = {tonumber(a), tonumber(b), tonumber(c), tonumber(d), tonumber(e), tonumber(f)}
  end
  for j = 1, 3 do
    local w = W[j] local start = now - now % w
    if v[2 * j - 1] ~= start then v[2 * j - 1], v[2 * j] = start, 0 end
    v[2 * j] = v[2 * j] + 1
  end
  local last = now - now % W[3] + W[3]
  redis.call("SET", KEYS[i], string.format("%d %d %d %d %d %d", v[1], v[2], v[3], v[4], v[5], v[6]), "PX",
    math.floor((last - now) / 1000) + 1001)
end
return 1'
script[three_struct]=$head'local W = {1000000, 60000000, 3600000000}
for i = 1, #KEYS do
  local s = redis.call("GET", KEYS[i])
  local v = {0, 0, 0, 0, 0, 0}
  if s then v = {struct.unpack("dddddd", s)} end
  for j = 1, 3 do
    local w = W[j] local start = now - now % w
    if v[2 * j - 1] ~= start then v[2 * j - 1], v[2 * j] = start, 0 end
    v[2 * j] = v[2 * j] + 1
  end
  local last = now - now % W[3] + W[3]
  redis.call("SET", KEYS[i], struct.pack("dddddd", v[1], v[2], v[3], v[4], v[5], v[6]), "PX",
    math.floor((last - now) / 1000) + 1001)
end
return 1'
script[three_hash]=$head'local W = {1000000, 60000000, 3600000000}
local F = {"1", "60", "3600"}
for i = 1, #KEYS do
  local got = redis.call("HMGET", KEYS[i], "1", "60", "3600")
  local set = {}
  for j = 1, 3 do
    local w = W[j] local start = now - now % w
    local n = 0
    if got[j] then
      local s, c = string.match(got[j], "^(%d+):(%d+)$")
      if tonumber(s) == start then n = tonumber(c) end
    end
    set[#set + 1] = F[j]
    set[#set + 1] = string.format("%d:%d", start, n + 1)
  end
  redis.call("HSET", KEYS[i], unpack(set))
  local last = now - now % W[3] + W[3]
  redis.call("PEXPIRE", KEYS[i], math.floor((last - now) / 1000) + 1001)
end
return 1'
script[sliding_keys]=$head'local w = 3600000000 local start = now - now % w
for i = 1, #KEYS do
  local cur = KEYS[i] .. ":" .. string.format("%x", start / w)
  local prev = KEYS[i] .. ":" .. string.format("%x", start / w - 1)
  local c = redis.call("INCRBY", cur, 1)
  local p = tonumber(redis.call("GET", prev)) or 0
  if c == 1 then redis.call("PEXPIRE", cur, math.floor((start + 2 * w - now) / 1000) + 1001) end
end
return 1'
script[sliding_text]=$head'local w = 3600000000 local start = now - now % w
for i = 1, #KEYS do
  local s = redis.call("GET", KEYS[i])
  local at, c, p = start, 0, 0
  if s then
    local a, b, d = string.match(s, "^(%d+) (%d+) (%d+)$")
    a, b, d = tonumber(a), tonumber(b), tonumber(d)
    if a == start then c, p = b, d elseif a == start - w then p = b end
  end
  redis.call("SET", KEYS[i], string.format("%d %d %d", at, c + 1, p), "PX",
    math.floor((start + 2 * w - now) / 1000) + 1001)
end
return 1'
script[sliding_struct]=$head'local w = 3600000000 local start = now - now % w
for i = 1, #KEYS do
  local s = redis.call("GET", KEYS[i])
  local c, p = 0, 0
  if s then
    local a, b, d = struct.unpack("ddd", s)
    if a == start then c, p = b, d elseif a == start - w then p = b end
  end
  redis.call("SET", KEYS[i], struct.pack("ddd", start, c + 1, p), "PX", math.floor((start + 2 * w - now) / 1000) + 1001)
end
return 1'

# run NAME: Redis CPU per descriptor of the script NAME over 100 000 descriptors, after a warm-up pass.
run() {
  local sha args=()
  sha=$(redis-cli -p "$redis_port" script load "${script[$1]}")
  for i in $(seq 32); do args+=("d:$i:__rand_int__"); done
  redis-cli -p "$redis_port" flushall >/dev/null
  redis-benchmark -p "$redis_port" -r 3125 -n "$CALLS" -c 50 -P 16 -q evalsha "$sha" 32 "${args[@]}" >/dev/null 2>&1
  local before; before=$(cpu_us "$redis_pid")
  redis-benchmark -p "$redis_port" -r 3125 -n "$CALLS" -c 50 -P 16 -q evalsha "$sha" 32 "${args[@]}" >/dev/null 2>&1
  local after; after=$(cpu_us "$redis_pid")
  python3 -c "print(f'{($after - $before) / ($CALLS * 32):.2f}')"
}

echo "Redis $(redis-server --version | grep -o 'v=[0-9.]*' | cut -d= -f2); µs of Redis CPU per descriptor, 32 per call, 100 000 descriptors"
for round in $(seq "$ROUNDS"); do
  floor=$(run floor)
  printf '%-14s %7s %7s\n' form us x_floor
  printf '%-14s %7s %7s\n' floor "$floor" 1.00
  for name in ${FORMS:-three_keys three_text three_struct three_hash sliding_keys sliding_text sliding_struct}; do
    per=$(run "$name")
    printf '%-14s %7s %7s\n' "$name" "$per" "$(python3 -c "print(f'{$per / $floor:.2f}')")"
  done
  [ "$ROUNDS" -gt 1 ] && echo "(round $round)"
done
