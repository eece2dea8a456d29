"""Measures how far two Envoys sharing one RLQS quota through sluice go past it (BENCHMARKS.md, "Overshoot with two
Envoys"). Uses the end-to-end test's fixtures: a real sluice (the debug build, in memory), two Envoy 1.40 processes on
deploy/envoy-rlqs.yaml and a small upstream; per round, CLIENT_THREADS threads per Envoy send requests for one new
user for 7 s, and the requests admitted are counted.

    .venv/bin/python benches/rlqs_overshoot.py N CLIENT_THREADS ROUNDS     # e.g. 200 4 3
"""

import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))

from conftest import running_sluice  # noqa: E402
from test_envoy import Upstream  # noqa: E402
from test_rlqs import rlqs_envoy  # noqa: E402


def main(limit: int, threads_per_envoy: int, rounds: int) -> None:
    work = Path(tempfile.mkdtemp())
    config = work / "quota.yaml"
    config.write_text(
        "domain: rlqs-e2e\nquota_buckets:\n  - bucket: {name: per_user, user: }\n"
        f"    rate_limit: {{unit: day, requests_per_unit: {limit}}}\n"
    )
    upstream = Upstream()
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    with running_sluice(REPO / "target" / "debug" / "sluice", config, work) as sluice:
        with rlqs_envoy(work, upstream, sluice.grpc_port) as a, rlqs_envoy(work, upstream, sluice.grpc_port) as b:
            for round_ in range(rounds):
                user = {"x-user": f"user-{round_}"}
                admitted, lock, stop = [0], threading.Lock(), time.monotonic() + 7

                def send(envoy) -> None:
                    while time.monotonic() < stop:
                        if envoy.get("/q", user)[0] == 200:
                            with lock:
                                admitted[0] += 1

                clients = [threading.Thread(target=send, args=(e,)) for e in (a, b) for _ in range(threads_per_envoy)]
                for c in clients:
                    c.start()
                for c in clients:
                    c.join()
                print(f"N={limit} client threads per Envoy={threads_per_envoy} round {round_}: "
                      f"admitted {admitted[0]}, overshoot {admitted[0] - limit}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
