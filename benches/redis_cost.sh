#!/usr/bin/env bash
# What a decision costs Redis, the figure that caps a fleet: Redis's CPU (utime + stime from /proc) per descriptor
# decided, for every algorithm, against the floor measured in the same run: a minimal script deciding 32 counters per
# call with INCRBY and a PEXPIRE on the first hit, driven by redis-benchmark pipelined. Also `INFO commandstats`
# (the script's own time per call, and the commands it ran). Prints a table; BENCHMARKS.md has the figures and the
# capacity model built on them. Uses the release binaries (built here), one Redis, one sluice with one worker thread.
# DURATION (10s) is each scenario's length; ROUNDS (1) repeats the whole table; ALGORITHMS (all) limits it, e.g.
# ALGORITHMS=fixed_window. The floor is measured with short keys (as `redis-benchmark` figures usually are) and with
# keys as long as the full key layout's (prefix, hash tag, domain, entry, limit and window: about 80 bytes; sluice's
# compact keys are 28 for an hour's window, 31 for a second's), since a key's length is part of what Redis does per
# command: up to 28 bytes a key fits Redis's smallest allocation.
# BEFORE, the path of a directory holding `sluice`, `sluice-bench` and `sluice-budget-bench` built from earlier code
# (e.g. `git archive <commit> | tar -x -C DIR && cd DIR && cargo build --release -p sluice -p sluice-tools`, then
# DIR/target/release), adds its rows, each scenario run with both builds back to back on the same Redis (column
# "build"), the two taking turns at going first. KEY_LAYOUT (compact) is this build's `--key-layout`. SCRIPTS=eval runs Redis with its user refused
# functions, so that sluice calls its decision script by EVALSHA, as against Redis 6 (the default, functions, calls it
# by FCALL).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-1}
ALGORITHMS=${ALGORITHMS:-fixed_window sliding_window sliding_log token_bucket leaky_bucket concurrency bucketed_window tiers}
KEY_LAYOUT=${KEY_LAYOUT:-compact}
# shellcheck source=benches/common.sh
source benches/common.sh

for tool in redis-server redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install redis-server redis-tools)"; exit 1; }
done
cargo build --release --locked -p sluice -p sluice-tools --bin sluice --bin sluice-bench --bin sluice-budget-bench >&2
sluice=$PWD/target/release/sluice
sluice_bench=$PWD/target/release/sluice-bench
budget_bench=$PWD/target/release/sluice-budget-bench

cat >"$work/cost.yaml" <<'YAML'
domain: bench
descriptors:
  - key: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: sliding_window
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: sliding_window}
  - key: sliding_log
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_log}
  - key: token_bucket
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: token_bucket, burst: 1000000000}
  - key: leaky_bucket
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: leaky_bucket, burst: 1000000000}
  - key: concurrency
    rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: concurrency}
  - key: bucketed_window
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: bucketed_window}
  - key: tiers
    rate_limits:
      - {unit: second, requests_per_unit: 1000000000, name: second}
      - {unit: minute, requests_per_unit: 1000000000, name: minute}
      - {unit: hour, requests_per_unit: 1000000000, name: hour}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
YAML

if [ "${SCRIPTS:-functions}" = eval ]; then
  start_redis --user default on nopass '~*' '&*' +@all -fcall -function
else
  start_redis
fi

redis_cpu_us() { cpu_us "$redis_pid"; }

# The floor: 32 counters per call, pipelined, over 100 000 keys or one hot key, keys short or as long as sluice's;
# Redis CPU per counter.
floor() {
  local keys=$1 length=${2:-short} calls=400000 sha args=() long='sluice:{0123456789abcdef}5:bench|12:fixed_window|'
  sha=$(redis-cli -p "$redis_port" script load \
    "for i = 1, #KEYS do local n = redis.call('INCRBY', KEYS[i], 1) if n == 1 then redis.call('PEXPIRE', KEYS[i], 3600000) end end return 1")
  for i in $(seq 32); do
    if [ "$keys" = hot ]; then args+=("floor:hot"); else args+=("floor:$i:__rand_int__"); fi
    if [ "$length" = long ]; then args[-1]="$long${args[-1]}|fixed_window/3600:1764032400000000"; fi
  done
  redis-cli -p "$redis_port" flushall >/dev/null
  local before; before=$(redis_cpu_us)
  redis-benchmark -p "$redis_port" -r 3125 -n "$calls" -c 50 -P 16 -q evalsha "$sha" 32 "${args[@]}" >/dev/null 2>&1
  local after; after=$(redis_cpu_us)
  python3 -c "print(f'{($after - $before) / ($calls * 32):.2f}')"
}

# One sluice per build, on the same Redis, each with one serving thread; `grpc_of` and `pid_of` name them. The
# build before starts first, on an empty Redis (a build that still moved counters between key layouts finds none to
# move there), then this one, which records its storage format.
declare -A grpc_of pid_of bench_of budget_of
builds=(after)
[ -n "${BEFORE:-}" ] && builds=(before after)
for build in ${BEFORE:+before} after; do
  binary=$sluice layout=(--key-layout "$KEY_LAYOUT")
  bench_of[$build]=$sluice_bench budget_of[$build]=$budget_bench
  if [ "$build" = before ]; then
    binary=$BEFORE/sluice layout=() bench_of[$build]=$BEFORE/sluice-bench budget_of[$build]=$BEFORE/sluice-budget-bench
  fi
  grpc=$(free_port)
  http=$(free_port)
  "$binary" serve --config "$work/cost.yaml" --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" \
    --worker-threads 1 --redis-url "redis://127.0.0.1:$redis_port" "${layout[@]}" >"$work/sluice-$build.log" 2>&1 &
  pid_of[$build]=$!
  grpc_of[$build]=$grpc
  pids+=("${pid_of[$build]}")
  wait_port "$grpc"
done

# One scenario through sluice: Redis CPU per descriptor, and sluice's decisions per second.
through_sluice() {
  local build=$1 key=$2 descriptors=$3 keys=$4
  local sluice_bench=${bench_of[$build]} grpc=${grpc_of[$build]} sluice_pid=${pid_of[$build]}
  redis-cli -p "$redis_port" flushall >/dev/null
  # Counters that exist already, as in a service that has run for a while: one run of the same load first, long
  # enough over 100 000 keys that nearly every one was hit (about 500 000 hits: fewer than 1 % of the keys missed).
  local warmup=2s
  [ "$keys" = hot ] || warmup=6s
  "$sluice_bench" --target "http://127.0.0.1:$grpc" --domain bench --descriptor-key "$key" \
    --descriptors "$descriptors" --keys "$keys" --concurrency 256 --duration "$warmup" --warmup 0s --quiet \
    --allow-errors --json >/dev/null
  redis-cli -p "$redis_port" config resetstat >/dev/null
  local before; before=$(redis_cpu_us)
  local sluice_before; sluice_before=$(cpu_us "$sluice_pid")
  local report
  report=$("$sluice_bench" --target "http://127.0.0.1:$grpc" --domain bench --descriptor-key "$key" \
    --descriptors "$descriptors" --keys "$keys" --concurrency 256 --duration "$DURATION" --warmup 0s --quiet \
    --allow-errors --json)
  local after; after=$(redis_cpu_us)
  local sluice_after; sluice_after=$(cpu_us "$sluice_pid")
  # The decision script's line: FCALL's, or EVALSHA's where functions are refused (the one with more calls).
  local stats; stats=$(redis-cli -p "$redis_port" info commandstats | tr -d '\r' | grep -E '^cmdstat_(fcall|evalsha):' |
    awk -F'[=,]' '{ print $2, $0 }' | sort -n -r | head -1 | cut -d' ' -f2- || true)
  python3 - "$report" "$before" "$after" "$descriptors" "$stats" "$sluice_before" "$sluice_after" <<'PY'
import json, re, sys
report, before, after, descriptors, stats = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
sluice_us = (int(sys.argv[7]) - int(sys.argv[6])) / max(report["requests"], 1)
decided = report["requests"] * descriptors
calls = int(re.search(r"calls=(\d+)", stats).group(1)) if stats else 0
usec = float(re.search(r"usec=(\d+)", stats).group(1)) if stats else 0.0
print(f"{(after - before) / max(decided, 1):.2f} {report['throughput_rps']:.0f} {usec / max(decided, 1):.2f} {decided / max(calls, 1):.1f} {sluice_us:.2f}")
PY
}

scenario=0
for round in $(seq "$ROUNDS"); do
  floor_uniform=$(floor uniform)
  floor_hot=$(floor hot)
  floor_long=$(floor uniform long)
  echo "=== round $round: the floor, Redis CPU per counter: 100k keys $floor_uniform us (keys as long as sluice's:" \
    "$floor_long us), one hot key $floor_hot us"
  printf '%-7s %-15s %-4s %-13s %10s %8s %10s %12s %12s %12s\n' build algorithm desc keys "redis_us" "x_floor" \
    "req/s" "script_us" "desc/call" "sluice_us/req"
  for key in $ALGORITHMS; do
    for descriptors in 1 3; do
      for keys in hot uniform:100000; do
        [ "$key" = sliding_log ] && [ "$keys" = hot ] && continue
        # The builds take turns at going first: on one Redis, the first of a pair has cost more in some rounds.
        order=("${builds[@]}")
        if [ $((scenario++ % 2)) = 1 ] && [ "${#builds[@]}" = 2 ]; then order=("${builds[1]}" "${builds[0]}"); fi
        for build in "${order[@]}"; do
          read -r per rps script batch sluice_us < <(through_sluice "$build" "$key" "$descriptors" "$keys")
          if [ "$keys" = hot ]; then f=$floor_hot; else f=$floor_uniform; fi
          ratio=$(python3 -c "print(f'{$per / $f:.2f}')")
          printf '%-7s %-15s %-4s %-13s %10s %8s %10s %12s %12s %12s\n' "$build" "$key" "$descriptors" "$keys" "$per" \
            "$ratio" "$rps" "$script" "$batch" "$sluice_us"
        done
      done
    done
  done
  # Reserve + Settle pairs on 1 000 users: Redis CPU per pair (two script calls) and per call against the floor.
  case " $ALGORITHMS " in *" tiers "*) ;; *) continue ;; esac
  for build in "${builds[@]}"; do
    redis-cli -p "$redis_port" flushall >/dev/null
    before=$(redis_cpu_us)
    rate=$("${budget_of[$build]}" --target "http://127.0.0.1:${grpc_of[$build]}" --domain bench --callers 64 \
      --users 1000 --duration "$DURATION" | awk '/^pairs\/s/ { print $2 }')
    after=$(redis_cpu_us)
    seconds=${DURATION%s}
    python3 -c "pairs = $rate * $seconds; per = ($after - $before) / max(pairs, 1); print(f'$build reserve+settle: {per:.2f} us of Redis CPU per pair ({per / 2 / $floor_uniform:.1f}x the floor per call), {$rate:.0f} pairs/s')"
  done
done
