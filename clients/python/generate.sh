#!/usr/bin/env bash
# Regenerates the package's stubs from proto/sluice/v1/sluice.proto into src/sluice_client/_proto (or into the
# directory given as $1), with the grpcio-tools of $PYTHON (default: python3).
#
# Only sluice's own file is compiled. The Envoy messages it imports come from PyPI's xds-protos at run time, so the
# generated imports of `envoy.*` are left as they are; the one import of sluice's own module is made relative, and
# the module name recorded in the messages is the one the package gives it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$here/src/sluice_client/_proto}"
python="${PYTHON:-python3}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" -m grpc_tools.protoc -I "$repo/proto" --python_out="$work" --pyi_out="$work" --grpc_python_out="$work" \
  "$repo/proto/sluice/v1/sluice.proto"

mkdir -p "$out"
gen="$work/sluice/v1"
sed -e "s/'sluice\.v1\.sluice_pb2'/'sluice_client._proto.sluice_pb2'/" "$gen/sluice_pb2.py" >"$out/sluice_pb2.py"
cp "$gen/sluice_pb2.pyi" "$out/sluice_pb2.pyi"
sed -e 's/^from sluice\.v1 import sluice_pb2 as /from . import sluice_pb2 as /' "$gen/sluice_pb2_grpc.py" \
  >"$out/sluice_pb2_grpc.py"
# Each rewrite must have happened: a new protoc that words these lines differently fails here, not at import.
grep -q "'sluice_client._proto.sluice_pb2'" "$out/sluice_pb2.py"
grep -q '^from \. import sluice_pb2 as ' "$out/sluice_pb2_grpc.py"
