#!/usr/bin/env bash
# What the decision script costs Redis, without sluice in front of it: the script built as a function library from
# this tree's `crates/sluice-core/src/store` (as `redis/script.rs` loads it), called by redis-benchmark with 32
# descriptors a call over 100 000 descriptors (HOT=1: one hot descriptor), pipelined, decided at a given time, each
# descriptor with its own keys, their arguments as sluice sends one rule's descriptors (once, a run). Redis's CPU (utime + stime from /proc) per
# descriptor, for the same hits:
#   fixed_window      a lone fixed window: the plain counter's fast form
#   token_bucket      a lone token bucket
#   sliding_window    a lone sliding window
#   sliding_log       a lone sliding log
#   bucketed_window   an hour's window in 60 sub-windows
#   three_windows     a second, a minute and an hour on one descriptor
#   floor             the floor of benches/redis_cost.sh: INCRBY, and PEXPIRE on the first hit, per descriptor
#   by_hand           a lone sliding window's hit written out for that one case (no loop, no algorithm interface):
#                     the same GET, record, estimate and SET PX as the loop's, and the same answer; a bound for
#                     what the loop's own work costs on top
# BEFORE=<commit> adds a column for the scripts of that commit (8d38529 or later: the packed state, whose arguments
# these rows spell), loaded beside this tree's on the same Redis, the two taking turns row by row.
# ROUNDS (3) repeats the table; CALLS (60 000) calls a row after a warm-up pass of 20 000. Needs redis-server and
# redis-benchmark (and git for BEFORE).
# INSTRUCTIONS=1 counts the machine instructions Redis runs per descriptor instead of its CPU time: Redis runs under
# valgrind's callgrind (apt-get install valgrind), CALLS defaults to 500 after a warm-up of 500, and the counts
# repeat to within a few in a thousand from run to run, where times on a shared host vary by a tenth or more.
set -euo pipefail
cd "$(dirname "$0")/.."
INSTRUCTIONS=${INSTRUCTIONS:-}
CALLS=${CALLS:-${INSTRUCTIONS:+500}}
CALLS=${CALLS:-60000}
WARMUP=${INSTRUCTIONS:+500}
WARMUP=${WARMUP:-20000}
ROUNDS=${ROUNDS:-3}
HOT=${HOT:-}
BEFORE=${BEFORE:-}
# shellcheck source=benches/common.sh
source benches/common.sh
for tool in redis-server redis-benchmark ${INSTRUCTIONS:+valgrind callgrind_control}; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install redis-server redis-tools valgrind)"; exit 1; }
done
if [ -n "$INSTRUCTIONS" ]; then
  redis_port=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.%p" \
    redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no >"$work/redis.log" 2>&1 &
  redis_pid=$!
  pids+=("$redis_pid")
  wait_port "$redis_port"
else
  start_redis
fi

unit=µs digits=2f
if [ -n "$INSTRUCTIONS" ]; then unit=instructions digits=0f; fi

# spent: what Redis has spent so far: its CPU time (us), or with INSTRUCTIONS the instructions since the last call
# (callgrind's counts dumped and zeroed).
spent() {
  if [ -z "$INSTRUCTIONS" ]; then cpu_us "$redis_pid"; return; fi
  callgrind_control -d "$redis_pid" >/dev/null 2>&1
  callgrind_control -z "$redis_pid" >/dev/null 2>&1
  awk '/^(summary|totals):/ { print $2; exit }' "$(ls -t "$work"/callgrind.* | head -1)"
}

# library NAME TREE: the function library NAME of the decision script in TREE (a directory holding
# crates/sluice-core/src/store).
library() {
  local store=$2/crates/sluice-core/src/store
  echo "#!lua name=$1"
  echo 'local KEYS, ARGV'
  cat "$store/lua/prelude.lua"
  for f in $(ls "$store"/algorithm/*.lua | sort); do echo do; cat "$f"; echo end; done
  cat "$store/lua/ledger.lua" "$store/lua/decide.lua" "$store/lua/batch.lua"
  echo "redis.register_function{ function_name = '$1', callback = function(keys, argv) KEYS, ARGV = keys, argv return batch() end }"
}
library after . >"$work/after.lua"
redis-cli -p "$redis_port" -x function load replace <"$work/after.lua" >/dev/null
floor="local n = 0 for i = 1, #KEYS do if redis.call('INCRBY', KEYS[i], 1) == 1 then redis.call('PEXPIRE', KEYS[i], 3600000) end n = n + 1 end return n"
# The lone sliding window by hand: ARGV the window (us), the limit, the record's tag and the time; answers as the loop.
redis-cli -p "$redis_port" -x function load replace >/dev/null <<'LUA'
#!lua name=by_hand
local floor
redis.register_function('by_hand', function(keys, argv)
  floor = floor or math.floor
  local window, limit, tag, now = tonumber(argv[1]), tonumber(argv[2]), tonumber(argv[3]), tonumber(argv[4])
  local out, start = {}, now - now % window
  for i = 1, #keys do
    local v = redis.call('GET', keys[i])
    local s, c, q, t, x = 0, 0, 0, tag, 0
    if v then t, x, s, c, q = struct.unpack('<ddddd', v) end
    if x <= now or s < start - window then c, q = 0, 0 elseif s < start then c, q = 0, c end
    local ok = floor(q * (window - now % window) / window) + c + 1 <= limit
    if ok then
      local record = struct.pack('<ddddd', t, start + 2 * window, start, c + 1, q)
      if x == start + 2 * window then
        redis.call('SET', keys[i], record, 'KEEPTTL')
      else
        redis.call('SET', keys[i], record, 'PX', string.format('%d', floor((start + 2 * window - now + 1000999) / 1000)))
      end
    end
    out[#out + 1], out[#out + 2], out[#out + 3] = ok and 3 or 0, c, q
  end
  return out
end)
LUA
if [ -n "$BEFORE" ]; then
  mkdir -p "$work/before"
  git archive "$BEFORE" crates/sluice-core/src/store | tar -x -C "$work/before"
  library before "$work/before" >"$work/before.lua"
  redis-cli -p "$redis_port" -x function load replace <"$work/before.lua" >/dev/null
fi

now=$(( $(date +%s) * 1000000 ))
hour=3600000000
# cost FUNCTION NK ARGS...: Redis's CPU per descriptor for 32 descriptors of NK keys each, all with ARGS (a run, '*',
# as sluice sends the descriptors of one rule).
cost() {
  local function=$1 nk=$2
  shift 2
  local keys=() i j
  for i in $(seq 32); do
    for j in $(seq "$nk"); do
      if [ -n "$HOT" ]; then keys+=("hot:$j:1"); else keys+=("d:$i:__rand_int__:$j:1"); fi
    done
  done
  local args=(1 '' '*' 32 "$@" "$now")
  redis-cli -p "$redis_port" flushall >/dev/null
  local run=(redis-benchmark -p "$redis_port" -r 3125 -c 20 -P 8 -q)
  if [ "$function" = floor ]; then
    run+=(eval "$floor" $((32 * nk)) "${keys[@]}")
  elif [ "$function" = by_hand ]; then
    run+=(fcall by_hand 32 "${keys[@]}" "$@" "$now")
  else
    run+=(fcall "$function" $((32 * nk)) "${keys[@]}" "${args[@]}")
  fi
  "${run[@]:0:1}" -n "$WARMUP" "${run[@]:1}" >/dev/null 2>&1
  local before
  before=$(spent)
  # Counted instructions start from 0 at each read.
  if [ -n "$INSTRUCTIONS" ]; then before=0; fi
  "${run[@]:0:1}" -n "$CALLS" "${run[@]:1}" >/dev/null 2>&1
  python3 -c "print(f'{($(spent) - $before) / ($CALLS * 32):.$digits}')"
}

# row NAME "NK ARGS": this tree's cost, then the code before's.
row() {
  local name=$1 mine=$2 a b
  if [ -z "$BEFORE" ]; then
    # shellcheck disable=SC2086
    printf '  %-16s %s\n' "$name" "$(cost after $mine)"
    return
  fi
  # shellcheck disable=SC2086
  if (( round % 2 )); then a=$(cost after $mine); b=$(cost before $mine); else b=$(cost before $mine); a=$(cost after $mine); fi
  printf '  %-16s %s / %s\n' "$name" "$a" "$b"
}

echo "Redis $unit per descriptor (${HOT:+one hot descriptor}${HOT:-100 000 descriptors})${BEFORE:+, this tree / $BEFORE}"
for round in $(seq "$ROUNDS"); do
  echo "round $round"
  printf '  %-16s %s\n' floor "$(cost floor 1)"
  printf '  %-16s %s\n' by_hand "$(cost by_hand 1 $hour 1000 7)"
  row fixed_window "1 $hour 1"
  row token_bucket "1 hit 1 token_bucket $hour 1000 1 7 1000"
  row sliding_window "1 hit 1 sliding_window $hour 1000 1 7"
  row sliding_log "1 hit 1 sliding_log $hour 1000 1"
  row bucketed_window "1 hit 1 bucketed_window $hour 1000 1 60"
  row three_windows "1 hit 3 fixed_window 1000000 10 1 1 fixed_window 60000000 100 1 2 fixed_window $hour 1000 1 3"
done
