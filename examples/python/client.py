"""A sluice client: asks for decisions with sluice.v1.RateLimiter/ShouldRateLimit until a limit is reached, then
asks GetRemaining how long until the next hit would pass.

    python client.py [HOST:PORT]        (default: $SLUICE_ADDR, else 127.0.0.1:8081)

It uses the `edge` domain of deploy/config/edge.yaml: 3 requests per 30 seconds for each user under /api/. See
README.md for generating the stubs it imports.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import grpc

# Stubs generated into gen/ next to this file (README.md); with xds-protos installed only sluice's own are there.
sys.path.insert(0, str(Path(__file__).resolve().parent / "gen"))

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # noqa: E402
from envoy.service.ratelimit.v3 import rls_pb2  # noqa: E402
from sluice.v1 import sluice_pb2, sluice_pb2_grpc  # noqa: E402

# Every call gets a deadline: a rate limit decision that arrives late is useless to the caller.
DEADLINE_S = 2.0


def descriptor(**entries: str) -> ratelimit_pb2.RateLimitDescriptor:
    return ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries.items()]
    )


def seconds(duration) -> float:
    return duration.seconds + duration.nanos / 1e9


def main() -> int:
    target = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SLUICE_ADDR", "127.0.0.1:8081")
    # A fresh user each run, so that a second run within the window does not start over the limit.
    user = f"example-{uuid.uuid4().hex[:8]}"
    api_call = descriptor(path="/api/orders", user=user)

    with grpc.insecure_channel(target) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=DEADLINE_S)
        except grpc.FutureTimeoutError:
            print(f"cannot connect to sluice at {target}", file=sys.stderr)
            return 1
        sluice = sluice_pb2_grpc.RateLimiterStub(channel)

        Code = rls_pb2.RateLimitResponse.Code
        for attempt in range(1, 5):
            response = sluice.ShouldRateLimit(
                rls_pb2.RateLimitRequest(domain="edge", descriptors=[api_call]), timeout=DEADLINE_S
            )
            status = response.statuses[0]
            print(
                f"request {attempt}: {Code.Name(response.overall_code)}, "
                f"{status.limit_remaining} of {status.current_limit.requests_per_unit} left, "
                f"window resets in {seconds(status.duration_until_reset):.1f}s"
            )

        # Read-only: asking does not consume a hit.
        remaining = sluice.GetRemaining(
            sluice_pb2.GetRemainingRequest(domain="edge", descriptors=[api_call]), timeout=DEADLINE_S
        )
        for d in remaining.descriptors:
            if not d.matched:
                print("no rule matches this descriptor")
            elif d.unlimited:
                print("unlimited")
            else:
                unit = rls_pb2.RateLimitResponse.RateLimit.Unit.Name(d.limit.unit).lower()
                window = unit if d.limit.unit_multiplier == 1 else f"{d.limit.unit_multiplier} {unit}s"
                print(
                    f"remaining: {d.remaining} of {d.limit.requests_per_unit} per {window} ({d.limit.algorithm}), "
                    f"next hit allowed in {seconds(d.retry_after):.1f}s"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
