#!/usr/bin/env bash
# Reproduces the figures of BENCHMARKS.md on this machine: builds sluice in release mode, starts Redis (standalone and
# a 3-primary local cluster) and sluice on loopback ports, and drives `sluice-bench` through the scenarios: in memory
# and on Redis, one and three descriptors, one hot key and 100 000 keys, maximum throughput and fixed rates, an
# over-limit flood with and without the local cache, a million counters and more in memory, and h2load for
# cross-checking, RLQS usage reports and Reserve+Settle pairs, then the cluster against one Redis in alternated
# rounds. Every process it starts is stopped on exit. Takes about 15 minutes; DURATION=5s shortens it (LARGE_DURATION,
# 30s, is how long the many-counters scenario runs; CLUSTER_ROUNDS, 3, how many rounds the cluster comparison has;
# ONLY=cluster runs that comparison alone, in about 6 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
# shellcheck source=benches/common.sh
source benches/common.sh

command -v redis-server >/dev/null || { echo "redis-server is missing (apt-get install redis-server)"; exit 1; }
cargo build --release --locked -p sluice -p sluice-tools --bin sluice --bin sluice-bench --bin sluice-quota-bench --bin sluice-budget-bench >&2
sluice=$PWD/target/release/sluice
sluice_bench=$PWD/target/release/sluice-bench
quota_bench=$PWD/target/release/sluice-quota-bench
budget_bench=$PWD/target/release/sluice-budget-bench


cat >"$work/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: flood
    rate_limit: {unit: hour, requests_per_unit: 1}
quota_buckets:
  - bucket: {name: per_user, user: }
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
YAML

start_redis

start_cluster

# start_sluice NAME ARGS...: runs sluice, sets $grpc to its address. One worker thread, as the machine's two cores
# are shared with Redis and the load generator (its own default, `--worker-threads 0`, sizes itself from the CPUs:
# one thread on a machine of two; see BENCHMARKS.md).
start_sluice() {
  local name=$1; shift
  grpc=$(free_port); local http; http=$(free_port)
  "$sluice" serve --config "$work/bench.yaml" --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" \
    --worker-threads "${SLUICE_THREADS:-1}" "$@" \
    >"$work/sluice-$name.log" 2>&1 &
  sluice_pid=$!
  pids+=("$sluice_pid")
  wait_port "$grpc"
}

stop_sluice() { kill "$sluice_pid"; wait "$sluice_pid" || true; }

run() {
  local label=$1; shift
  printf '%s\n' "--- $label"
  "$sluice_bench" --target "http://127.0.0.1:$grpc" --domain bench --duration "$DURATION" --warmup "$WARMUP" \
    --quiet "$@"
}

# RLQS: 1 000 buckets over 10 streams (Envoys), each stream reporting all its buckets as soon as it has its answer.
quota() {
  printf '%s\n' "--- $1, RLQS, 1000 buckets over 10 streams, reports as fast as answered"
  "$quota_bench" --target "http://127.0.0.1:$grpc" --domain bench --streams 10 --buckets 1000 \
    --duration "$DURATION"
}

# Cost budgets: 64 callers over 4 connections, each reserving 100 for one of 1 000 users and settling 50 at once.
budget() {
  printf '%s\n' "--- $1, Reserve+Settle pairs, 64 callers, 1000 users"
  "$budget_bench" --target "http://127.0.0.1:$grpc" --domain bench --callers 64 --users 1000 --duration "$DURATION"
}

scenarios() {
  for descriptors in 1 3; do
    for keys in hot uniform:100000; do
      run "$1, $descriptors descriptor(s), keys $keys, max throughput" --descriptors "$descriptors" --keys "$keys" \
        --concurrency 256
      for rate in 5000 20000; do
        run "$1, $descriptors descriptor(s), keys $keys, fixed $rate/s" --descriptors "$descriptors" --keys "$keys" \
          --rate "$rate" --concurrency 256
      done
    done
  done
}

# The machine itself, to compare figures taken on different hosts of the same size: Redis alone running a
# one-counter fixed-window script (the reference figures quoted for peers were taken with this script), and sluice's
# script deciding one lone fixed window per call, unpipelined (50 clients) and pipelined (16 per client), and 32 per
# call (a full batch), over 100 000 keys.
calibrate() {
  local label=$1; shift
  redis-cli -p "$redis_port" config resetstat >/dev/null
  local rps
  rps=$(redis-benchmark -p "$redis_port" -r 100000 -q "$@" 2>/dev/null | tr '\r' '\n' | grep -Eo '[0-9.]+ requests per second' |
    tail -1)
  local usec
  usec=$(redis-cli -p "$redis_port" info commandstats | tr -d '\r' | grep -E '^cmdstat_(evalsha|fcall):' | head -1 |
    sed 's/.*usec_per_call=\([0-9.]*\).*/\1/')
  echo "--- calibration: $label: $rps, $usec us per call inside Redis"
}

# The cluster and one standalone Redis in the same run, for the cluster-to-standalone ratio: CLUSTER_ROUNDS (3)
# rounds, the order alternated, as the host's noise is larger than the difference measured. ONLY=cluster runs this
# comparison alone.
compare_cluster() {
  for round in $(seq "${CLUSTER_ROUNDS:-3}"); do
    order="standalone cluster"
    [ $((round % 2)) -eq 0 ] && order="cluster standalone"
    for descriptors in 1 3; do
      for target in $order; do
        if [ "$target" = cluster ]; then url=$cluster_url; label="redis cluster"; else
          url="redis://127.0.0.1:$redis_port"; label="redis standalone"; fi
        start_sluice "$target-$descriptors" --redis-url "$url"
        run "round $round, $label, $descriptors descriptor(s), keys uniform:100000, max throughput" \
          --descriptors "$descriptors" --keys uniform:100000 --concurrency 256
        run "round $round, $label, $descriptors descriptor(s), keys uniform:100000, fixed 20000/s" \
          --descriptors "$descriptors" --keys uniform:100000 --rate 20000 --concurrency 256
        stop_sluice
      done
    done
  done
}
if [ "${ONLY:-}" = cluster ]; then
  compare_cluster
  exit 0
fi

if command -v redis-benchmark >/dev/null; then
  counter=$(redis-cli -p "$redis_port" script load \
    "local n = redis.call('INCRBY', KEYS[1], 1) if n == 1 then redis.call('PEXPIRE', KEYS[1], 60000) end return n")
  # The decision script as sluice loads it, a function library (crates/sluice-core/src/store/redis.rs, LIBRARY_BODY,
  # and redis/script.rs): the same files in the same order, named sluice_bench here.
  decide=sluice_bench
  (
    printf '#!lua name=%s\nlocal KEYS, ARGV\n' "$decide"
    cd crates/sluice-core/src/store
    cat lua/prelude.lua
    for f in algorithm/*.lua; do printf 'do\n'; cat "$f"; printf 'end\n'; done
    cat lua/ledger.lua lua/decide.lua lua/batch.lua
    printf "\nredis.register_function{ function_name = '%s', callback = function(keys, argv) KEYS, ARGV = keys, argv return batch() end }\n" "$decide"
  ) | redis-cli -p "$redis_port" -x function load replace >/dev/null
  calibrate "one-counter script, unpipelined" -n 200000 -c 50 evalsha "$counter" 1 'c:__rand_int__'
  calibrate "one-counter script, pipelined" -n 1000000 -c 50 -P 16 evalsha "$counter" 1 'p:__rand_int__'
  # One descriptor as crates/sluice-core/src/store/lua/batch.lua reads it: n, the timing header (this host's time, the call then
  # decided by the server's clock, as sluice sends it), then a lone fixed window's arguments (fixed_window.lua's hit):
  # the window and the cost; its key is the window's (`<counter>:<window start>`).
  now_us=$(( $(date +%s) * 1000000 ))
  start_us=$(( now_us - now_us % 3600000000 ))
  fixed=(3600000000 1)
  calibrate "sluice's script, lone fixed window, unpipelined" -n 200000 -c 50 fcall "$decide" 1 \
    "s:__rand_int__:$start_us" 1 "$now_us" "${fixed[@]}"
  calibrate "sluice's script, lone fixed window, pipelined" -n 1000000 -c 50 -P 16 fcall "$decide" 1 \
    "t:__rand_int__:$start_us" 1 "$now_us" "${fixed[@]}"
  keys=(); args=()
  for _ in $(seq 32); do keys+=("b:__rand_int__:$start_us"); args+=("${fixed[@]}"); done
  calibrate "sluice's script, 32 lone fixed windows per call (x32 for descriptors/s), pipelined" -n 40000 -c 50 -P 16 \
    fcall "$decide" 32 "${keys[@]}" 32 "$now_us" "${args[@]}"
  redis-cli -p "$redis_port" flushall >/dev/null
fi

start_sluice memory
scenarios "memory"
run "memory, over-limit flood of one key" --descriptor-key flood --keys hot --concurrency 256
quota "memory"
budget "memory"
# A million live counters and more: what the in-memory store costs as it grows.
DURATION=${LARGE_DURATION:-30s} run "memory, 1 descriptor, keys uniform:3000000, max throughput" \
  --keys uniform:3000000 --concurrency 256
echo "--- memory, sluice's resident set after it: $(grep VmRSS "/proc/$sluice_pid/status")"
stop_sluice

start_sluice redis --redis-url "redis://127.0.0.1:$redis_port"
redis-cli -p "$redis_port" config resetstat >/dev/null
scenarios "redis"
calls=$(redis-cli -p "$redis_port" info commandstats | tr -d '\r' | grep -E '^cmdstat_(evalsha|fcall):' || true)
echo "--- redis commands during the Redis scenarios: $calls"
run "redis, over-limit flood of one key, local cache on" --descriptor-key flood --keys hot --concurrency 256
quota "redis"
budget "redis"
stop_sluice
start_sluice redis-nocache --redis-url "redis://127.0.0.1:$redis_port" --local-cache-size 0
run "redis, over-limit flood of one key, local cache off" --descriptor-key flood --keys hot --concurrency 256
stop_sluice

SLUICE_THREADS=0 start_sluice redis-default-threads --redis-url "redis://127.0.0.1:$redis_port"
run "redis, 1 descriptor, keys uniform:100000, max throughput, sluice with its default threads" \
  --keys uniform:100000 --concurrency 256
run "redis, 1 descriptor, keys uniform:100000, fixed 20000/s, sluice with its default threads" \
  --keys uniform:100000 --rate 20000 --concurrency 256
stop_sluice

compare_cluster

if command -v h2load >/dev/null; then
  write_body "$work/body.bin"
  h2() {
    h2load -n "$1" -c 8 -m 32 -d "$work/body.bin" -H 'content-type: application/grpc' -H 'te: trailers' \
      "http://127.0.0.1:$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" |
      grep -E 'finished in|requests:|status codes'
  }
  start_sluice memory-h2load
  echo "--- h2load, memory, 1 descriptor, hot key (does not check answers)"
  h2 500000
  stop_sluice
  start_sluice redis-h2load --redis-url "redis://127.0.0.1:$redis_port"
  echo "--- h2load, redis, 1 descriptor, hot key (does not check answers)"
  h2 300000
  stop_sluice
else
  echo "--- h2load not installed (apt-get install nghttp2-client): cross-check skipped"
fi
