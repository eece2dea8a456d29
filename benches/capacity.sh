#!/usr/bin/env bash
# Checks BENCHMARKS.md's capacity model on this host: N sluice instances (one serving thread each) on one Redis or on
# a cluster of K primaries, one fixed window per request over 100 000 keys, closed loop, one load generator per
# instance. For each (N, K) it records decisions per second and the CPU each decision costs every process (sluice
# instances, Redis primaries, load generators: utime + stime from /proc and getrusage), and sets the measured rate
# beside the model's: the host's cores divided by the CPU a decision costs in all, and the Redis side's bound (K
# primaries over Redis's CPU per decision). The model holds when the CPU per decision of each part stays the same as
# N and K change, so that capacity is cores over cost. DURATION (10s) is each run's length; CORES (nproc) the host's.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
CORES=${CORES:-$(nproc)}
# shellcheck source=benches/common.sh
source benches/common.sh

command -v redis-server >/dev/null || { echo "redis-server is missing (apt-get install redis-server redis-tools)"; exit 1; }
cargo build --release --locked -p sluice -p sluice-tools --bin sluice --bin sluice-bench >&2
sluice=$PWD/target/release/sluice
sluice_bench=$PWD/target/release/sluice-bench

cat >"$work/capacity.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
YAML

sum_cpu() { local total=0 pid; for pid in "$@"; do total=$((total + $(cpu_us "$pid"))); done; echo "$total"; }

start_redis
standalone_pid=$redis_pid
start_cluster

# One load generator against one instance, in the background; its report and its CPU (getrusage) go to FILE.
drive() {
  local target=$1 duration=$2 file=$3
  python3 - "$sluice_bench" "$target" "$duration" "$file" <<'PY' &
import json, resource, subprocess, sys
bench, target, duration, out = sys.argv[1:5]
report = subprocess.run([bench, "--target", target, "--domain", "bench", "--descriptor-key", "user", "--keys",
                         "uniform:100000", "--concurrency", "256", "--duration", duration, "--warmup", "0s",
                         "--quiet", "--allow-errors", "--json"], capture_output=True, text=True, check=True).stdout
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
result = json.loads(report)
result["cpu_us"] = (usage.ru_utime + usage.ru_stime) * 1e6
json.dump(result, open(out, "w"))
PY
}

printf '%-3s %-3s %10s %12s %12s %12s %12s %14s %14s\n' N K "decided/s" "sluice_us" "redis_us" "client_us" \
  "total_us" "model_host/s" "model_redis/s"
for k in 1 3; do
  if [ "$k" = 1 ]; then url="redis://127.0.0.1:$redis_port"; redis_pids=("$standalone_pid"); else
    url=$cluster_url; redis_pids=("${cluster_pids[@]}"); fi
  for n in 1 2; do
    targets=()
    sluice_pids=()
    for i in $(seq "$n"); do
      grpc=$(free_port); http=$(free_port)
      "$sluice" serve --config "$work/capacity.yaml" --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" \
        --worker-threads 1 --redis-url "$url" >"$work/sluice-$k-$n-$i.log" 2>&1 &
      sluice_pids+=($!)
      pids+=($!)
      wait_port "$grpc"
      targets+=("http://127.0.0.1:$grpc")
    done
    # Counters that exist already, as in a service that has run a while.
    warm_jobs=()
    for t in "${targets[@]}"; do
      drive "$t" 6s "$work/warm-$k-$n-${t##*:}.json"
      warm_jobs+=($!)
    done
    wait "${warm_jobs[@]}"
    sluice_before=$(sum_cpu "${sluice_pids[@]}")
    redis_before=$(sum_cpu "${redis_pids[@]}")
    client_jobs=()
    for t in "${targets[@]}"; do
      drive "$t" "$DURATION" "$work/run-$k-$n-${t##*:}.json"
      client_jobs+=($!)
    done
    wait "${client_jobs[@]}"
    sluice_after=$(sum_cpu "${sluice_pids[@]}")
    redis_after=$(sum_cpu "${redis_pids[@]}")
    python3 - "$n" "$k" "$CORES" "$((sluice_after - sluice_before))" "$((redis_after - redis_before))" \
      "$work"/run-"$k"-"$n"-*.json <<'PY'
import json, sys
n, k, cores, sluice_cpu, redis_cpu = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
runs = [json.load(open(f)) for f in sys.argv[6:]]
requests = sum(r["requests"] for r in runs)
rate = sum(r["throughput_rps"] for r in runs)
client_cpu = sum(r["cpu_us"] for r in runs)
s, r, c = sluice_cpu / requests, redis_cpu / requests, client_cpu / requests
total = s + r + c
print(f"{n:<3} {k:<3} {rate:10.0f} {s:12.2f} {r:12.2f} {c:12.2f} {total:12.2f} {cores * 1e6 / total:14.0f} "
      f"{k * 1e6 / r:14.0f}")
PY
    for pid in "${sluice_pids[@]}"; do kill "$pid"; done
    wait "${sluice_pids[@]}" 2>/dev/null || true
  done
done
