#!/usr/bin/env bash
# What global limits cost: decisions per second, latency and Redis CPU (INFO cpu, user + sys) of one sluice (one
# worker thread) in region eu with two other regions' Redis on this host, for a limit that never denies, counted
#   none      without --region
#   regional  with --region and two --region-redis, the limit not global
#   global    the same, the limit `global: true` (every decision reads the others' counts; counts shipped every 100 ms)
# each for one hot key and for 100 000 keys drawn uniformly (a window per key to ship). ROUNDS (2) alternates the
# whole table; DURATION (5s) is each run's length. BEFORE, the path of a `sluice` binary built from earlier code (e.g.
# `git archive <commit> | tar -x -C DIR && cd DIR && cargo build --release --bin sluice`), adds its rows, each run
# beside this build's in the same round (column "build"). BENCHMARKS.md, "Several regions", has the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-2}
# shellcheck source=benches/common.sh
source benches/common.sh

cargo build --release --locked -p sluice -p sluice-tools --bin sluice --bin sluice-bench >&2
sluice=$PWD/target/release/sluice
sluice_bench=$PWD/target/release/sluice-bench

redis=()
for _ in eu us ap; do
  start_redis
  redis+=("$redis_port")
done
mkdir -p "$work/regional" "$work/global"
for kind in regional global; do
  global=false; [ "$kind" = global ] && global=true
  cat >"$work/$kind/limits.yaml" <<YAML
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000, global: $global}
YAML
done

cpu() { redis-cli -p "$1" info cpu | awk -F: '/used_cpu_(sys|user):/{s+=$2} END{printf "%.3f", s}'; }

run() { # build mode keys
  local build=$1 mode=$2 keys=$3 config=$work/regional extra=() grpc http pid before_eu before_us
  local binary=$sluice
  [ "$build" = before ] && binary=$BEFORE
  case $mode in
    global) config=$work/global ;&
    regional) extra=(--region eu --region-redis "us=redis://127.0.0.1:${redis[1]},ap=redis://127.0.0.1:${redis[2]}") ;;
  esac
  redis-cli -p "${redis[0]}" flushall >/dev/null
  grpc=$(free_port); http=$(free_port)
  "$binary" serve --config "$config" --redis-url "redis://127.0.0.1:${redis[0]}" --worker-threads 1 \
    --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" "${extra[@]}" 2>/dev/null &
  pid=$!
  pids+=("$pid")
  wait_port "$grpc"
  before_eu=$(cpu "${redis[0]}"); before_us=$(cpu "${redis[1]}")
  "$sluice_bench" --target "http://127.0.0.1:$grpc" --duration "$DURATION" --warmup 1s --descriptors 1 \
    --keys "$keys" --concurrency 256 --allow-errors --quiet --json >"$work/out.json"
  python3 - "$build" "$mode" "$keys" "$work/out.json" "$before_eu" "$(cpu "${redis[0]}")" "$before_us" "$(cpu "${redis[1]}")" <<'PY'
import json, sys
build, mode, keys, path, eu0, eu1, us0, us1 = sys.argv[1:]
d = json.load(open(path))
n = d["requests"] + d["throughput_rps"]  # the warm-up's requests count in Redis's CPU too: about a second's worth
print(f"| {build} | {mode} | {keys} | {d['throughput_rps']:,.0f}/s | {d['latency_us']['p50']/1000:.2f} / {d['latency_us']['p99']/1000:.2f} ms "
      f"| {(float(eu1)-float(eu0))/n*1e6:.1f} us | {(float(us1)-float(us0))/n*1e6:.2f} us | {sum(d['errors'].values())} |")
PY
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

builds=(this)
[ -n "${BEFORE:-}" ] && builds=(before after)
echo "| build | mode | keys | decisions | p50 / p99 | Redis eu CPU per decision | Redis us CPU per decision | errors |"
echo "|---|---|---|---|---|---|---|---|"
for _ in $(seq "$ROUNDS"); do
  for keys in hot uniform:100000; do
    for mode in none regional global; do
      for build in "${builds[@]}"; do run "$build" "$mode" "$keys"; done
    done
  done
done
