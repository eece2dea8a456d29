#!/usr/bin/env bash
# What the decision script costs Redis, without sluice in front of it: the script built as a function library from
# this tree's `crates/sluice-core/src/store` (as `redis/script.rs` loads it), called by redis-benchmark with 32
# descriptors a call (one run of 32, each with its own keys) over 100 000 descriptors (HOT=1: one hot descriptor),
# pipelined, decided at a given time. Redis's CPU (utime + stime from /proc) per descriptor, for the same hits through
# the decision loop (`lua/decide.lua`) and, where one exists, through the fast form of a lone limit:
#   fixed_window      a lone fixed window: its fast form (its window, the cost), and the loop
#   token_bucket      a lone token bucket: its fast form ('b'), and the loop
#   sliding_window    a lone sliding window: its fast form ('s'), and the loop
#   sliding_log       a lone sliding log (no fast form): the loop
#   bucketed_window   an hour's window in 60 sub-windows (no fast form): the loop
#   three_windows     a second, a minute and an hour on one descriptor: the loop
# ROUNDS (3) repeats the table; CALLS (60 000) calls a row after a warm-up pass of 20 000. Needs redis-server and
# redis-benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
CALLS=${CALLS:-60000}
ROUNDS=${ROUNDS:-3}
HOT=${HOT:-}
# shellcheck source=benches/common.sh
source benches/common.sh
for tool in redis-server redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install redis-server redis-tools)"; exit 1; }
done
start_redis

store=crates/sluice-core/src/store
library=$work/library.lua
{
  echo '#!lua name=cost'
  echo 'local KEYS, ARGV'
  cat "$store/lua/prelude.lua"
  for f in $(ls "$store"/algorithm/*.lua | sort); do echo do; cat "$f"; echo end; done
  cat "$store/lua/ledger.lua" "$store/lua/decide.lua" "$store/lua/batch.lua"
  echo "redis.register_function{ function_name = 'cost', callback = function(keys, argv) KEYS, ARGV = keys, argv return batch() end }"
} >"$library"
redis-cli -p "$redis_port" -x function load replace <"$library" >/dev/null

now=$(( $(date +%s) * 1000000 ))
hour=3600000000
# Redis's CPU per descriptor for `nk` keys a descriptor and the arguments after the call's header.
cost() {
  local nk=$1
  shift
  local keys=() i j
  for i in $(seq 32); do
    for j in $(seq "$nk"); do
      if [ -n "$HOT" ]; then keys+=("hot:$j:1"); else keys+=("d:$i:__rand_int__:$j:1"); fi
    done
  done
  redis-cli -p "$redis_port" flushall >/dev/null
  local run=(redis-benchmark -p "$redis_port" -r 3125 -c 20 -P 8 -q fcall cost $((32 * nk)) "${keys[@]}" 1 '' '*' 32 "$@" "$now")
  "${run[@]:0:1}" -n 20000 "${run[@]:1}" >/dev/null 2>&1
  local before after
  before=$(cpu_us "$redis_pid")
  "${run[@]:0:1}" -n "$CALLS" "${run[@]:1}" >/dev/null 2>&1
  after=$(cpu_us "$redis_pid")
  python3 -c "print(f'{($after - $before) / ($CALLS * 32):.2f}')"
}

echo "Redis µs per descriptor (${HOT:+one hot descriptor}${HOT:-100 000 descriptors}), fast form / decision loop"
for round in $(seq "$ROUNDS"); do
  echo "round $round"
  echo "  fixed_window     $(cost 1 $hour 1) / $(cost 1 hit 1 fixed_window $hour 1000 1)"
  echo "  token_bucket     $(cost 1 b 3600000 1000 1) / $(cost 1 hit 1 token_bucket $hour 1000 1 1000)"
  echo "  sliding_window   $(cost 2 s $hour 1000 1) / $(cost 2 hit 1 sliding_window $hour 1000 1)"
  echo "  sliding_log      - / $(cost 1 hit 1 sliding_log $hour 1000 1)"
  echo "  bucketed_window  - / $(cost 1 hit 1 bucketed_window $hour 1000 1 60)"
  echo "  three_windows    - / $(cost 3 hit 3 fixed_window 1000000 10 1 fixed_window 60000000 100 1 fixed_window $hour 1000 1)"
done
