#!/usr/bin/env bash
# What sluice's own work costs in memory: sluice (in memory, one hot key) against sluice-empty, a ShouldRateLimit
# server with nothing behind it served the same way (the same allocator, runtime, listener, HTTP/2 connections, tonic
# and prost; it answers OK with one status per descriptor and keeps no state). Both with one serving thread, driven
# by h2load with the same request (one descriptor, 8 connections with 16 calls in flight each), in alternated
# rounds; for each run the server's CPU time per decision, read from /proc before and after, and per round the ratio
# sluice / empty. ROUNDS (4) and REQUESTS (600000) change the length; BEFORE=/path/to/an/earlier/sluice runs that
# build too, in the same rounds, for a before and after on one host.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-4}
REQUESTS=${REQUESTS:-600000}
for tool in h2load python3 bc; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (h2load: nghttp2-client; bc: bc)" >&2; exit 1; }
done
# shellcheck source=benches/common.sh
source benches/common.sh

cargo build --release --locked -p sluice -p sluice-tools --bin sluice --bin sluice-empty >&2
release=$PWD/target/release


write_bench_config "$work/sluice.yaml"
write_body "$work/body.bin"

# run NAME: one run of NAME (sluice or empty); prints its line and sets $per_decision.
run() {
  local name=$1 grpc http
  grpc=$(free_port); http=$(free_port)
  case "$name" in
    sluice) "$release/sluice" serve --config "$work/sluice.yaml" --grpc-addr "127.0.0.1:$grpc" \
      --http-addr "127.0.0.1:$http" --worker-threads 1 >"$work/$name.log" 2>&1 & ;;
    before) "$BEFORE" serve --config "$work/sluice.yaml" --grpc-addr "127.0.0.1:$grpc" \
      --http-addr "127.0.0.1:$http" --worker-threads 1 >"$work/$name.log" 2>&1 & ;;
    empty) "$release/sluice-empty" --grpc-addr "127.0.0.1:$grpc" --worker-threads 1 >"$work/$name.log" 2>&1 & ;;
  esac
  local pid=$!
  pids+=("$pid")
  wait_port "$grpc"
  local url="http://127.0.0.1:$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
  local h=(-c 8 -m 16 -d "$work/body.bin" -H 'content-type: application/grpc' -H 'te: trailers')
  h2load -n 20000 "${h[@]}" "$url" >/dev/null
  local before out after rps ok
  before=$(cpu_us "$pid")
  out=$(h2load -n "$REQUESTS" "${h[@]}" "$url")
  after=$(cpu_us "$pid")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rps=$(echo "$out" | grep -Eo '[0-9.]+ req/s' | head -1 | cut -d' ' -f1)
  ok=$(echo "$out" | grep -Eo '[0-9]+ succeeded' | cut -d' ' -f1)
  per_decision=$(echo "($after - $before) / $REQUESTS" | bc -l)
  printf '%-7s %10.0f/s %7.2f us per decision   (%s of %s succeeded)\n' "$name" "$rps" "$per_decision" "$ok" "$REQUESTS"
}

echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
servers=(sluice empty)
[ -n "${BEFORE:-}" ] && servers+=(before)
declare -A sum
for name in "${servers[@]}"; do sum[$name]=0; done
for round in $(seq "$ROUNDS"); do
  echo "--- round $round"
  order=("${servers[@]}")
  if [ $((round % 2)) -eq 0 ]; then order=($(printf '%s\n' "${servers[@]}" | tac)); fi
  declare -A this
  for name in "${order[@]}"; do
    run "$name"
    this[$name]=$per_decision
    sum[$name]=$(echo "${sum[$name]} + $per_decision" | bc -l)
  done
  for name in "${servers[@]}"; do
    [ "$name" = empty ] || printf 'ratio   %-7s %.3f\n' "$name" "$(echo "${this[$name]} / ${this[empty]}" | bc -l)"
  done
done
echo "--- all rounds"
for name in "${servers[@]}"; do
  printf '%-7s %.2f us per decision, %.3f of empty\n' "$name" "$(echo "${sum[$name]} / $ROUNDS" | bc -l)" \
    "$(echo "${sum[$name]} / ${sum[empty]}" | bc -l)"
done
