"""Twenty Envoys on three sluice instances over one Redis, sharing one RLQS quota while their demand changes
(BENCHMARKS.md, "RLQS: twenty Envoys on three instances"). The Envoys are the test suite's model clients (Envoy's
official stubs, applying assignments as Envoy 1.40 does, `no_assignment_behavior: DENY_ALL`), reporting every 5 s as
Envoy does by default. The run has every event a fleet meets:

- joins: fifteen Envoys from the start, five more a sixth of the way through;
- shifts: a third of the way through, half the Envoys triple their rate and half drop to a third;
- idle holders: two Envoys ask nothing from a quarter to three quarters of the way through, then ask again;
- bursts: at half way, three Envoys ask ten times their rate for three seconds;
- leaves: at 60 %, two Envoys close their streams (their tokens are lost with them).

Records what the sharing policy is chosen by:

- overshoot: admitted past the limit, and the most held plus admitted at any push;
- quota unused while refused: Envoy-seconds with demand and no token while a tenth of the limit was neither admitted
  nor held by a live Envoy, and the longest such stretch of one Envoy;
- newcomers' wait: from a joining Envoy's first report to its first token;
- unused when the run ends (with demand still unmet).

    .venv/bin/python benches/rlqs_fleet.py [LIMIT] [SECONDS] [SLUICE_BINARY] [-v]

Defaults: 12000 60 target/release/sluice (a limit of about three quarters of what the fleet asks); -v also prints,
per Envoy, its longest wait and when it began.
"""

import contextlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))

from conftest import redis_server  # noqa: E402
from test_rlqs import BIG, FLEET_CONFIG, Fleet, instances  # noqa: E402

REPORT_S = 5.0
STEP_S = 0.1
JOINING = range(15, 20)
IDLE = (5, 6)
BURSTING = (0, 1, 2)
LEAVING = (3, 4)


def rate(i: int, t: float) -> float:
    """Envoy i's requests a second at time t."""
    if i in IDLE and RUN_S / 4 <= t < 3 * RUN_S / 4:
        return 0
    base = 2 + (i * 7) % 13
    base = base * 3 if (t > RUN_S / 3) == (i % 2 == 0) else base
    if i in BURSTING and RUN_S / 2 <= t < RUN_S / 2 + 3:
        base *= 10
    return base


def main(limit: int, binary: Path) -> None:
    random.seed(7)
    work = Path(tempfile.mkdtemp())
    config = work / "fleet.yaml"
    config.write_text(FLEET_CONFIG.replace(f"requests_per_unit: {BIG}", f"requests_per_unit: {limit}"))
    with redis_server(work) as redis_url, contextlib.ExitStack() as stack:
        servers = instances(stack, binary, config, work, 3, redis_url)
        fleet = Fleet(limit, strict=False)
        stack.callback(fleet.close)
        joins = {i: RUN_S / 6 if i in JOINING else 0.0 for i in range(20)}
        offsets = {i: random.uniform(0, REPORT_S) for i in range(20)}
        envoys, first_report, first_token, last_report, left = {}, {}, {}, {}, set()
        starving_since, longest_starved, longest_from, refused_seconds = {}, {}, {}, 0.0
        started = time.monotonic()
        while (now := time.monotonic() - started) < RUN_S:
            for i, at in joins.items():
                if i not in envoys and now >= at:
                    envoys[i] = fleet.join(servers[i % 3].grpc_target)
            for i in LEAVING:
                if i in envoys and i not in left and now >= 0.6 * RUN_S:
                    envoys[i].leave()
                    left.add(i)
            for i, envoy in envoys.items():
                if i in left:
                    continue
                wanted = rate(i, now) * STEP_S
                envoy.serve(int(wanted) + (random.random() < wanted - int(wanted)))
                due = i not in last_report or now - last_report[i] >= REPORT_S
                if i in last_report and now - joins[i] < offsets[i]:
                    due = False
                if due and (envoy.allowed or envoy.denied or i in last_report):
                    envoy.report()
                    last_report[i] = now
                    first_report.setdefault(i, now)
            time.sleep(STEP_S)
            fleet.pump()
            # Tokens of an Envoy that left are lost: not held by anyone who can use them.
            held = sum(e.tokens() for i, e in envoys.items() if i not in left)
            unused = limit - held - sum(e.admitted for e in fleet.envoys)
            for i, envoy in envoys.items():
                if i in left:
                    continue
                if i in first_report and i not in first_token and envoy.tokens() + envoy.admitted > 0:
                    first_token[i] = time.monotonic() - started
                if rate(i, now) > 0 and envoy.tokens() == 0 and unused >= limit / 10:
                    refused_seconds += STEP_S
                    starving_since.setdefault(i, now)
                    if now - starving_since[i] > longest_starved.get(i, 0.0):
                        longest_starved[i] = now - starving_since[i]
                        longest_from[i] = starving_since[i]
                else:
                    starving_since.pop(i, None)
        admitted = sum(e.admitted for e in fleet.envoys)
        waits = [first_token[i] - first_report[i] for i in JOINING if i in first_token]
        print(f"limit {limit}, {RUN_S:.0f} s, 20 Envoys on 3 instances, reports every {REPORT_S:.0f} s")
        print(f"admitted {admitted} (overshoot {max(0, admitted - limit)}), most held plus admitted {fleet.peak}")
        print(f"unused at the end: {limit - admitted} ({100 * (limit - admitted) / limit:.1f} %)")
        print(f"pushes applied: {fleet.pushes}")
        if waits:
            print(f"newcomers' wait for a first token: median {statistics.median(waits):.2f} s, most {max(waits):.2f} s")
        print(f"Envoy-seconds refused while a tenth was unused: {refused_seconds:.1f}")
        print(f"longest without a token while a tenth was unused: {max(longest_starved.values(), default=0):.1f} s")
        if "-v" in sys.argv:
            print({i: (round(s, 1), f"from {longest_from[i]:.1f} s") for i, s in sorted(longest_starved.items())})


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "-v"]
    LIMIT = int(args[0]) if len(args) > 0 else 12000
    RUN_S = float(args[1]) if len(args) > 1 else 60.0
    BINARY = Path(args[2]) if len(args) > 2 else REPO / "target" / "release" / "sluice"
    main(LIMIT, BINARY)
