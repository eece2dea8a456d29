#!/usr/bin/env bash
# sluice and Limitador side by side, on this machine, under the same load: both servers with their default settings,
# on the same fresh Redis (flushed before every run) and in memory, driven by h2load (one hot key, one descriptor,
# 8 connections with 16 calls in flight each), in alternated rounds. For each run it records decisions per second
# and the CPU time per decision of the server and of Redis, read from /proc before and after: the CPU per decision is
# the figure that holds across hosts.
#
# Limitador is built from its public source outside this repository (see BENCHMARKS.md, "Side by side"); give its
# binary as LIMITADOR=/path/to/limitador-server; without one the rounds run sluice alone (its CPU on Redis against
# in memory, the same way). ROUNDS (3) and REQUESTS (300000 on Redis, 3x that in memory)
# change the length. After the rounds, sluice alone with 1, 2 and 4 serving threads (THREADS), the same way: the
# default sizes itself from the CPUs (one thread on a machine of two).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
REQUESTS=${REQUESTS:-300000}
LIMITADOR=${LIMITADOR:-$(command -v limitador-server || true)}
servers=(sluice limitador)
if [ ! -x "$LIMITADOR" ]; then
  echo "no Limitador binary (LIMITADOR=/path/to/limitador-server): sluice alone" >&2
  servers=(sluice)
fi
for tool in redis-server redis-cli h2load python3 bc; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (tests/run.sh installs redis; h2load: nghttp2-client; bc: bc)" >&2; exit 1; }
done
# shellcheck source=benches/common.sh
source benches/common.sh

cargo build --release --locked --bin sluice >&2
sluice=$PWD/target/release/sluice


write_bench_config "$work/sluice.yaml"
cat >"$work/limitador.yaml" <<'YAML'
- namespace: bench
  max_value: 1000000000
  seconds: 3600
  conditions: []
  variables: ["descriptors[0]['user']"]
YAML
write_body "$work/body.bin"

start_redis

# start NAME STORE: starts one server with its defaults on fresh ports (sluice-tN: sluice with N threads); sets
# $server_pid and $grpc.
start() {
  local name=$1 store=$2 http threads=()
  grpc=$(free_port); http=$(free_port)
  if [[ $name == sluice-t* ]]; then threads=(--worker-threads "${name#sluice-t}"); name=sluice; fi
  case "$name/$store" in
    sluice/redis) "$sluice" serve --config "$work/sluice.yaml" --grpc-addr "127.0.0.1:$grpc" \
      --http-addr "127.0.0.1:$http" --redis-url "redis://127.0.0.1:$redis_port" "${threads[@]}" \
      >"$work/$name.log" 2>&1 & ;;
    sluice/memory) "$sluice" serve --config "$work/sluice.yaml" --grpc-addr "127.0.0.1:$grpc" \
      --http-addr "127.0.0.1:$http" "${threads[@]}" >"$work/$name.log" 2>&1 & ;;
    limitador/redis) "$LIMITADOR" -b 127.0.0.1 -p "$grpc" -B 127.0.0.1 -P "$http" "$work/limitador.yaml" \
      redis "redis://127.0.0.1:$redis_port" >"$work/$name.log" 2>&1 & ;;
    limitador/memory) "$LIMITADOR" -b 127.0.0.1 -p "$grpc" -B 127.0.0.1 -P "$http" "$work/limitador.yaml" \
      memory >"$work/$name.log" 2>&1 & ;;
  esac
  server_pid=$!
  pids+=("$server_pid")
  wait_port "$grpc"
  sleep 0.5
}

# measure NAME STORE REQUESTS: one run; prints a result line.
measure() {
  local name=$1 store=$2 n=$3
  redis-cli -p "$redis_port" flushall >/dev/null
  start "$name" "$store"
  # A short warm-up: connections, scripts loaded, first allocations.
  h2load -n 5000 -c 8 -m 16 -d "$work/body.bin" -H 'content-type: application/grpc' -H 'te: trailers' \
    "http://127.0.0.1:$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" >/dev/null
  local server0 redis0 out server1 redis1 rps ok
  server0=$(cpu_us "$server_pid"); redis0=$(cpu_us "$redis_pid")
  out=$(h2load -n "$n" -c 8 -m 16 -d "$work/body.bin" -H 'content-type: application/grpc' -H 'te: trailers' \
    "http://127.0.0.1:$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
  server1=$(cpu_us "$server_pid"); redis1=$(cpu_us "$redis_pid")
  rps=$(echo "$out" | grep -Eo 'finished in [0-9.]+[a-z]+, [0-9.]+ req/s' | grep -Eo '[0-9.]+ req/s' | cut -d' ' -f1)
  ok=$(echo "$out" | grep -Eo '[0-9]+ succeeded' | cut -d' ' -f1)
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true
  printf '%-11s %-7s %10.0f/s %8.1f us %8.1f us   (%s of %s succeeded)\n' "$name" "$store" "$rps" \
    "$(echo "($server1 - $server0) / $n" | bc -l)" "$(echo "($redis1 - $redis0) / $n" | bc -l)" "$ok" "$n"
}

echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), Redis $(redis-server --version | grep -Eo 'v=[0-9.]+' | cut -c3-)"
echo "server      store      decisions/s   server CPU  Redis CPU   per decision"
for round in $(seq "$ROUNDS"); do
  echo "--- round $round"
  for store in redis memory; do
    n=$REQUESTS
    [ "$store" = memory ] && n=$((REQUESTS * 3))
    order=("${servers[@]}")
    if [ $((round % 2)) -eq 0 ]; then order=($(printf '%s\n' "${servers[@]}" | tac)); fi
    for name in "${order[@]}"; do measure "$name" "$store" "$n"; done
  done
done
echo "--- sluice with 1, 2 and 4 serving threads"
for store in redis memory; do
  n=$REQUESTS
  [ "$store" = memory ] && n=$((REQUESTS * 3))
  for threads in ${THREADS:-1 2 4}; do measure "sluice-t$threads" "$store" "$n"; done
done
