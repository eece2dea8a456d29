"""The client examples of examples/, run as their READMEs say against a real sluice serving deploy/config (the
README's own command): the Python and Node clients ask ShouldRateLimit until the `edge` limit (3 per 30 s) is reached,
then GetRemaining; the cost-budget programs reserve an estimate, run a slow fake call and settle the actual cost.
Each run's output is checked for what it claims. (The queue worker has its own test, test_queue_worker.py, and the
embedded Rust example its own in the core's tests.)

The Python examples import stubs generated from proto/sluice/v1/sluice.proto with xds-protos' Envoy modules, the
second way examples/python/README.md gives; the Node examples load the protos at run time with the npm packages the
README's test command installs into examples/node/node_modules.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, running_sluice

EXAMPLES = REPO / "examples"


@pytest.fixture(scope="module")
def sluice(sluice_bin: Path, tmp_path_factory: pytest.TempPathFactory):
    with running_sluice(sluice_bin, REPO / "deploy" / "config", tmp_path_factory.mktemp("examples")) as server:
        yield server


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})
    assert out.returncode == 0, f"{args} exited {out.returncode}: {out.stdout}{out.stderr}"
    return out.stdout


def check_client(output: str, *_span: float) -> None:
    """Three requests pass, each leaving one less of 3; the fourth is OVER_LIMIT; GetRemaining says none is left and
    when the next one would pass, within the 30 s window."""
    lines = output.splitlines()
    decisions = [re.match(r"request (\d): (OK|OVER_LIMIT), (\d) of 3 left", line) for line in lines[:4]]
    assert all(decisions), output
    assert [(d.group(2), int(d.group(3))) for d in decisions] == [
        ("OK", 2),
        ("OK", 1),
        ("OK", 0),
        ("OVER_LIMIT", 0),
    ], output
    remaining = re.match(r"remaining: 0 of 3 per 30 seconds \(fixed_window\), next hit allowed in ([\d.]+)s", lines[4])
    assert remaining and 0 <= float(remaining.group(1)) <= 30, output


def check_budget(output: str, started: float, ended: float) -> None:
    """A reservation is held, then settled for less: what is refunded is the estimate less the actual cost, given back
    to the windows still in force. deploy/config/llm.yaml's `model=large` limits count output tokens per minute and,
    at 15 credits each, per day (input tokens are settled as estimated), so when a minute turns during the run the
    minute's 1/16 of the difference has no window to go back to, and when the day turns, nothing has."""
    assert re.search(r"^reserved [0-9a-f]{32} for 300s$", output, re.M), output
    settled = re.search(r"settled: estimate (\d+), actual (\d+).*refunded (\d+), charged (\d+)", output)
    assert settled, output
    estimate, actual, refunded, charged = map(int, settled.groups())
    difference = estimate - actual
    assert actual < estimate and difference % 16 == 0 and charged == 0, output
    if started // 86400 != ended // 86400:
        assert refunded in (difference, difference // 16 * 15, 0), output
    elif started // 60 != ended // 60:
        assert refunded in (difference, difference // 16 * 15), output
    else:
        assert refunded == difference, output


def check_wait(output: str, *_span: float) -> None:
    """A second's ten requests pass (more when the calls straddle a second), the next is refused, and a wait of at
    most 2 s gets a permit within the second (at once when the second turned between the refusal and the wait)."""
    passed = re.search(r"^(\d+) requests passed, the next is OVER_LIMIT$", output, re.M)
    assert passed and int(passed.group(1)) >= 10, output
    waited = re.search(r"^waited ([\d.]+)s for a permit: OK$", output, re.M)
    assert waited and 0 <= float(waited.group(1)) <= 1.0, output


@pytest.mark.parametrize(
    "program, check", [("client.py", check_client), ("budget.py", check_budget), ("wait.py", check_wait)]
)
def test_python_examples(sluice, sluice_stubs, program, check):
    started = time.time()
    output = run(
        [sys.executable, program, sluice.grpc_target],
        EXAMPLES / "python",
        env={"PYTHONPATH": str(sluice_stubs.dir)},
    )
    check(output, started, time.time())


@pytest.mark.parametrize(
    "program, check", [("client.js", check_client), ("budget.js", check_budget), ("wait.js", check_wait)]
)
def test_node_examples(sluice, program, check):
    node = shutil.which("node")
    assert node, "node is not installed (the README's test command installs it)"
    assert (EXAMPLES / "node" / "node_modules" / "@grpc" / "grpc-js").is_dir(), (
        "the Node example's packages are missing (the README's test command installs them)"
    )
    started = time.time()
    output = run([node, program, sluice.grpc_target], EXAMPLES / "node")
    check(output, started, time.time())
