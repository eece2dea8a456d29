# What the scripts of benches/ share: a scratch directory and the processes to stop on exit, free ports, waiting for
# a listener, a Redis of their own (and a cluster), and the gRPC-framed request h2load sends. Sourced, not run.

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# cpu_us PID: a process's CPU time so far (utime + stime from /proc), in microseconds.
cpu_us() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%d\n", ($14 + $15) * 1000000 / hz }' "/proc/$1/stat"; }

# write_bench_config FILE: sluice's rules for one hot key of the domain `bench`, a limit never reached.
write_bench_config() {
  cat >"$1" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
YAML
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

wait_port() {
  for _ in $(seq 400); do
    (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on $1" >&2; return 1
}

# write_body FILE: RateLimitRequest{domain: "bench", descriptors: [{entries: [{key: "user", value: "7"}]}]} in
# protobuf, gRPC-framed, as h2load's -d takes it.
write_body() {
  python3 - "$1" <<'PY'
import struct, sys
entry = b"\x0a\x04user\x12\x017"
descriptor = b"\x0a" + bytes([len(entry)]) + entry
message = b"\x0a\x05bench" + b"\x12" + bytes([len(descriptor)]) + descriptor
open(sys.argv[1], "wb").write(b"\x00" + struct.pack(">I", len(message)) + message)
PY
}

# start_redis [ARGS]: one redis-server on a free port of loopback, with ARGS added to its options, stopped on exit;
# sets $redis_port and $redis_pid.
start_redis() {
  redis_port=$(free_port)
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no "$@" >"$work/redis.log" 2>&1 &
  redis_pid=$!
  pids+=("$redis_pid")
  wait_port "$redis_port"
}

# start_cluster: a Redis Cluster of three primaries on free ports of loopback, stopped on exit; sets $cluster_ports,
# $cluster_pids and $cluster_url (sluice's --redis-url for it).
start_cluster() {
  cluster_ports=()
  cluster_pids=()
  local p
  for _ in 1 2 3; do
    p=$(free_port)
    mkdir -p "$work/c$p"
    # The bus port is given explicitly: the default (port + 10000) does not exist for ports above 55535.
    redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --cluster-enabled yes \
      --cluster-port "$(free_port)" --cluster-config-file "nodes-$p.conf" --dir "$work/c$p" >"$work/c$p.log" 2>&1 &
    pids+=($!)
    cluster_pids+=($!)
    cluster_ports+=("$p")
  done
  for p in "${cluster_ports[@]}"; do wait_port "$p"; done
  redis-cli --cluster create $(printf '127.0.0.1:%s ' "${cluster_ports[@]}") --cluster-yes >/dev/null
  for _ in $(seq 100); do
    redis-cli -p "${cluster_ports[0]}" cluster info | grep -q 'cluster_state:ok' && break
    sleep 0.1
  done
  cluster_url="redis-cluster://127.0.0.1:${cluster_ports[0]}?node=127.0.0.1:${cluster_ports[1]}&node=127.0.0.1:${cluster_ports[2]}"
}
