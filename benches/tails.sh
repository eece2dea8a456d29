#!/usr/bin/env bash
# Tails at half of this host's capacity: sluice with its defaults on one Redis, three descriptors per request over
# 100 000 keys (a fixed window each). First the capacity, closed loop (256 in flight); then, open loop on a fixed
# schedule at half of that rate, the latency from each request's scheduled send time (so that a slow answer cannot
# hide the requests queued behind it): p50, p99, p99.9 and the largest, RUNS (2) times. DURATION (10s) is each run's
# length; DESCRIPTORS (3) and KEYS (uniform:100000) change the load.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
RUNS=${RUNS:-2}
DESCRIPTORS=${DESCRIPTORS:-3}
KEYS=${KEYS:-uniform:100000}
# shellcheck source=benches/common.sh
source benches/common.sh

command -v redis-server >/dev/null || { echo "redis-server is missing (apt-get install redis-server)"; exit 1; }
cargo build --release --locked -p sluice -p sluice-tools --bin sluice --bin sluice-bench >&2
sluice=$PWD/target/release/sluice
sluice_bench=$PWD/target/release/sluice-bench

cat >"$work/tails.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
YAML

start_redis
grpc=$(free_port)
http=$(free_port)
"$sluice" serve --config "$work/tails.yaml" --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" \
  --redis-url "redis://127.0.0.1:$redis_port" >"$work/sluice.log" 2>&1 &
pids+=($!)
wait_port "$grpc"

bench() {
  "$sluice_bench" --target "http://127.0.0.1:$grpc" --domain bench --descriptor-key user \
    --descriptors "$DESCRIPTORS" --keys "$KEYS" --concurrency 256 --warmup 2s --quiet --json "$@"
}

capacity=$(bench --duration "$DURATION" | python3 -c 'import json, sys; print(int(json.load(sys.stdin)["throughput_rps"]))')
rate=$((capacity / 2))
echo "capacity, closed loop: $capacity requests/s ($DESCRIPTORS descriptors, keys $KEYS); open loop at $rate/s"
for run in $(seq "$RUNS"); do
  report=$(bench --duration "$DURATION" --rate "$rate")
  python3 - "$run" "$report" <<'PY'
import json, sys
r = json.loads(sys.argv[2])
l = r["latency_us"]
print(f"run {sys.argv[1]}: {r['throughput_rps']:.0f}/s, p50 {l['p50'] / 1000:.2f} ms, p99 {l['p99'] / 1000:.2f} ms, "
      f"p99.9 {l['p999'] / 1000:.2f} ms, max {l['max'] / 1000:.2f} ms, passed {r['passed']}")
PY
done
