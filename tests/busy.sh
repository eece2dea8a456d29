#!/usr/bin/env bash
# Runs a command on a busy machine: two other processes keep a core each busy for the command's whole length, as on
# a shared CI runner or beside another build. Each one, at normal priority, hashes, allocates and writes a scratch file
# in turn, a mixed load rather than a bare spin. They are stopped, by their PIDs, when the command ends or is
# interrupted; the command's exit status is this script's.
#
#   bash tests/busy.sh bash tests/run.sh
#   bash tests/busy.sh cargo test -p sluice --test service -- grpc::
set -euo pipefail
if [ $# -eq 0 ]; then
  echo "usage: bash tests/busy.sh COMMAND [ARG...]: runs COMMAND beside two busy processes" >&2
  exit 2
fi

scratch=$(mktemp -d)
load='
import hashlib, os, sys
path = sys.argv[1]
block = os.urandom(1 << 16)
while True:
    digest = block
    for _ in range(2000):
        digest = hashlib.sha256(digest + block).digest()
    junk = [bytes(4096) for _ in range(2000)]
    with open(path, "wb") as f:
        f.write(block)
    del junk
'
pids=()
stop() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$scratch"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for n in 1 2; do
  python3 -c "$load" "$scratch/load-$n" &
  pids+=($!)
done
echo "== busy: processes ${pids[*]} keep two cores busy" >&2

"$@"
