"""Waiting for a permit instead of failing: sluice.v1.RateLimiter/WaitForPermit holds the call until the hit would
pass (or `max_wait` runs out), as a batch job or a queue worker wants.

    python wait.py [HOST:PORT]        (default: $SLUICE_ADDR, else 127.0.0.1:8081)

It uses the `edge` domain of deploy/config/edge.yaml: 10 requests per second for each client address. It spends
them, sees the eleventh refused, then waits for the next one. See README.md for generating the stubs it imports.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import grpc
from google.protobuf.duration_pb2 import Duration

# Stubs generated into gen/ next to this file (README.md); with xds-protos installed only sluice's own are there.
sys.path.insert(0, str(Path(__file__).resolve().parent / "gen"))

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # noqa: E402
from envoy.service.ratelimit.v3 import rls_pb2  # noqa: E402
from sluice.v1 import sluice_pb2, sluice_pb2_grpc  # noqa: E402

# Every call gets a deadline; a waiting call's is its longest wait and a little more.
DEADLINE_S = 2.0
MAX_WAIT_S = 2


def main() -> int:
    target = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SLUICE_ADDR", "127.0.0.1:8081")
    # A fresh address each run (documentation range), so that runs do not share a counter.
    address = f"2001:db8::{random.randrange(1 << 16):x}:{random.randrange(1 << 16):x}"
    client = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="remote_address", value=address)]
    )
    Code = rls_pb2.RateLimitResponse.Code
    with grpc.insecure_channel(target) as channel:
        sluice = sluice_pb2_grpc.RateLimiterStub(channel)
        passed = 0
        while True:
            response = sluice.ShouldRateLimit(
                rls_pb2.RateLimitRequest(domain="edge", descriptors=[client]), timeout=DEADLINE_S
            )
            if response.overall_code != Code.OK:
                break
            passed += 1
        print(f"{passed} requests passed, the next is {Code.Name(response.overall_code)}")
        # Held until the limit has room again (a second window here), at most MAX_WAIT_S; a caller that gives up
        # (its deadline, a cancel) consumes nothing.
        waited = sluice.WaitForPermit(
            sluice_pb2.WaitForPermitRequest(
                domain="edge", descriptors=[client], max_wait=Duration(seconds=MAX_WAIT_S)
            ),
            timeout=MAX_WAIT_S + DEADLINE_S,
        )
        seconds = waited.waited.seconds + waited.waited.nanos / 1e9
        print(f"waited {seconds:.3f}s for a permit: {Code.Name(waited.decision.overall_code)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
