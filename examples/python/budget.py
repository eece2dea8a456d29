"""A cost budget around a slow call whose cost is known only afterwards (an LLM call and its tokens): reserve an
estimate with sluice.v1.RateLimiter/Reserve, do the work, then Settle the actual cost; the difference is given back
(or charged). Concurrent reservations can never together spend more than the budget.

    python budget.py [HOST:PORT]        (default: $SLUICE_ADDR, else 127.0.0.1:8081)

It uses the `llm` domain of deploy/config/llm.yaml: input and output tokens of model `large`, per user, with their own
limits and a priced daily credit budget. See README.md for generating the stubs it imports.
"""

from __future__ import annotations

import os
import random
import sys
import time
import uuid
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent / "gen"))

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # noqa: E402
from envoy.service.ratelimit.v3 import rls_pb2  # noqa: E402
from sluice.v1 import sluice_pb2, sluice_pb2_grpc  # noqa: E402

DEADLINE_S = 2.0


def fake_model_call(prompt_tokens: int) -> int:
    """Stands in for the model: takes a while, and only then says how many tokens it produced."""
    time.sleep(0.3)
    return random.randint(50, 400)


def main() -> int:
    target = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SLUICE_ADDR", "127.0.0.1:8081")
    user = f"example-{uuid.uuid4().hex[:8]}"
    call = ratelimit_pb2.RateLimitDescriptor(
        entries=[
            ratelimit_pb2.RateLimitDescriptor.Entry(key="model", value="large"),
            ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value=user),
        ]
    )
    with grpc.insecure_channel(target) as channel:
        sluice = sluice_pb2_grpc.RateLimiterStub(channel)
        prompt_tokens = 1200
        # Hold the prompt's tokens and the most output we allow the model to produce.
        reserved = sluice.Reserve(
            sluice_pb2.ReserveRequest(
                domain="llm",
                descriptors=[call],
                estimates={"input_tokens": prompt_tokens, "output_tokens": 500},
            ),
            timeout=DEADLINE_S,
        )
        if reserved.overall_code != rls_pb2.RateLimitResponse.OK:
            print("over budget: not calling the model")
            return 2
        print(f"reserved {reserved.reservation_id} for {reserved.ttl.seconds}s")
        output_tokens = fake_model_call(prompt_tokens)
        settled = sluice.Settle(
            sluice_pb2.SettleRequest(
                domain="llm",
                descriptors=[call],
                reservation_id=reserved.reservation_id,
                actuals={"input_tokens": prompt_tokens, "output_tokens": output_tokens},
            ),
            timeout=DEADLINE_S,
        )
        if not settled.settled:
            print("the reservation expired: it stays charged at its estimate")
            return 1
        s = settled.settlements[0]
        print(
            f"settled: estimate {s.estimate}, actual {s.actual} (summed over the limits), "
            f"refunded {s.refunded}, charged {s.charged}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
