#!/usr/bin/env bash
# Cluster operations under load at the store's default timeout (100 ms): the core tests that move slots while 24
# tasks decide (three reshards of 2 000 slots, a rebalance onto a newly added primary, three manual failovers, each
# on a fresh 3+3 Redis Cluster the harness starts), RUNS (10) times each, with the store's timeout set by
# SLUICE_MOVES_TIMEOUT_MS (TIMEOUT_MS, 100) instead of the tests' 5 s; OPS picks some of the three. Prints, per
# operation, the failed decisions of every run, the runs that failed (and on standard error the first failures of
# each), and per run the longest a 10 ms sleep overslept on this host while it ran and the slowest fsync of a small
# write in the nodes' directory (TMPDIR, or /tmp): a stall of the host, or of a node's fsync of its cluster config
# (at every slot change), as long as the timeout fails decisions whatever sluice does. `TMPDIR=/dev/shm` keeps the
# nodes' files in memory, which takes the disk out of the measure.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-10}
TIMEOUT_MS=${TIMEOUT_MS:-100}

# shellcheck source=benches/common.sh
source benches/common.sh

command -v redis-server >/dev/null || { echo "redis-server is missing (apt-get install redis-server)"; exit 1; }
cargo test --locked -p sluice-core --test core --no-run >&2
declare -A tests=(
  [reshard]=cluster::a_live_reshard_under_load_fails_no_decision_and_counts_every_hit_once
  [rebalance]=cluster::a_rebalance_onto_a_new_primary_under_load_fails_no_decision_and_counts_every_hit_once
  [failover]=cluster::manual_failovers_under_load_fail_no_decision_and_count_every_hit_once
)
for op in ${OPS:-reshard rebalance failover}; do
  failed=() stalls=() fsyncs=() bad=0
  for _ in $(seq "$RUNS"); do
    python3 -c '
import os, signal, sys, tempfile, time
# The longest a 10 ms sleep overslept (the host stalled), and the longest fsync of a small write where the
# nodes keep their files (a node saves its cluster config with fsync at every slot change).
longest = slowest = 0.0
probe = tempfile.NamedTemporaryFile(prefix="fsync-probe-")
def done(*_):
    print(round(longest * 1000), round(slowest * 1000)); sys.exit(0)
signal.signal(signal.SIGTERM, done)
tick = 0
while True:
    t = time.monotonic(); time.sleep(0.01); longest = max(longest, time.monotonic() - t - 0.01)
    tick += 1
    if tick % 10 == 0:
        t = time.monotonic(); probe.write(b"x"); probe.flush(); os.fsync(probe.fileno())
        slowest = max(slowest, time.monotonic() - t)
' >"$work/stall" &
    watch=$!
    pids+=("$watch")
    out=$(SLUICE_MOVES_TIMEOUT_MS=$TIMEOUT_MS cargo test --locked -q -p sluice-core --test core -- --exact \
      "${tests[$op]}" --nocapture 2>&1 || true)
    n=$(grep -oE '; [0-9]+ failed$' <<<"$out" | grep -oE '[0-9]+' || echo '?')
    failed+=("$n")
    kill "$watch" && wait "$watch" || true
    read -r stall fsync <"$work/stall"
    stalls+=("$stall") fsyncs+=("$fsync")
    if [ "$n" != 0 ]; then
      bad=$((bad + 1))
      grep -m1 -oE 'failed decisions: .{0,600}' <<<"$out" >&2 || true
    fi
  done
  echo "$op: failed decisions per run: ${failed[*]}; runs with a failure: $bad of $RUNS (timeout ${TIMEOUT_MS} ms);" \
    "longest oversleep per run (ms): ${stalls[*]}; slowest fsync per run (ms): ${fsyncs[*]}"
done
