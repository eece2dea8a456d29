"""Rules over xDS: sluice as the ADS client of a management server written here in Python grpcio, the way Envoy
Gateway pushes rate limit configuration to the reference.

The management server speaks Envoy's aggregated discovery service from PyPI's `xds-protos`; the resources are the
reference's `RateLimitConfig`, which xds-protos does not ship, so they are compiled at test time from this
repository's `proto/ratelimit/config/ratelimit/v3/rls_conf.proto` (same package and numbers as the reference's).
The rate limit calls use Envoy's official stubs, as test_interop.py does. Every counted limit has a window of a day:
no test waits for a window to pass; waits poll for a condition with a timeout.
"""

from __future__ import annotations

import contextlib
import importlib
import queue
import subprocess
import sys
import threading
import types
import urllib.error
import urllib.request
from concurrent import futures
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import any_pb2

from conftest import REPO, free_port, redis_server, running_sluice, wait_until

TYPE_URL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
DOMAIN = "gateway"
OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT
INVALID_ARGUMENT = 3
WAIT_S = 15.0
# Small reconnection delays, so that a restarted management server is found again within a second.
BACKOFF = ("--xds-backoff-initial-ms", "50", "--xds-backoff-max-ms", "400", "--xds-backoff-random-factor", "0.2")


@pytest.fixture(scope="session")
def rls_conf(tmp_path_factory: pytest.TempPathFactory) -> types.ModuleType:
    """`rls_conf_pb2`, compiled from this repository's copy of the reference's rls_conf.proto."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("rls_conf")
    well_known = Path(protoc.__file__).parent / "_proto"
    proto = REPO / "proto" / "ratelimit" / "config" / "ratelimit" / "v3" / "rls_conf.proto"
    args = ["grpc_tools.protoc", f"-I{REPO / 'proto'}", f"-I{well_known}", f"--python_out={out}", str(proto)]
    if protoc.main(args) != 0:
        pytest.fail(f"protoc failed: {' '.join(args)}")
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("ratelimit.config.ratelimit.v3.rls_conf_pb2")
    finally:
        sys.path.remove(str(out))


class ManagementServer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """A state-of-the-world ADS server: every stream gets the current snapshot after its first request, and every
    push goes to every open stream. Every request received, on any stream, is queued for the test to inspect."""

    def __init__(self) -> None:
        self.requests: queue.Queue = queue.Queue()
        self.metadata: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._streams: list[queue.Queue] = []
        self._snapshot: discovery_pb2.DiscoveryResponse | None = None
        self._nonce = 0

    def _stamped(self) -> discovery_pb2.DiscoveryResponse:
        self._nonce += 1
        response = discovery_pb2.DiscoveryResponse()
        response.CopyFrom(self._snapshot)
        response.nonce = f"nonce-{self._nonce}"
        return response

    def push(self, version: str, *configs) -> str:
        """Sends a snapshot of `configs` (RateLimitConfig messages) to every stream; returns its nonce."""
        resources = []
        for config in configs:
            resource = any_pb2.Any()
            resource.Pack(config)
            resources.append(resource)
        with self._lock:
            self._snapshot = discovery_pb2.DiscoveryResponse(
                version_info=version, type_url=TYPE_URL, resources=resources
            )
            response = self._stamped()
            for stream in self._streams:
                stream.put(response)
        return response.nonce

    def StreamAggregatedResources(self, request_iterator, context):
        outbound: queue.Queue = queue.Queue()
        self.metadata.append({k: v for k, v in context.invocation_metadata()})

        def read() -> None:
            first = True
            try:
                for request in request_iterator:
                    self.requests.put(request)
                    if first:
                        first = False
                        with self._lock:
                            if self._snapshot is not None:
                                outbound.put(self._stamped())
                            self._streams.append(outbound)
            except grpc.RpcError:
                pass
            finally:
                with self._lock:
                    if outbound in self._streams:
                        self._streams.remove(outbound)
                outbound.put(None)

        threading.Thread(target=read, daemon=True).start()
        while context.is_active():
            try:
                response = outbound.get(timeout=0.1)
            except queue.Empty:
                continue
            if response is None:
                return
            yield response

    def next_request(self, timeout: float = WAIT_S) -> discovery_pb2.DiscoveryRequest:
        try:
            return self.requests.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no DiscoveryRequest within {timeout:.0f}s")

    def answer_to(self, nonce: str, timeout: float = WAIT_S) -> discovery_pb2.DiscoveryRequest:
        """The request that answers the response of `nonce` (an ACK or a NACK); earlier requests are skipped."""
        while True:
            request = self.next_request(timeout)
            if request.response_nonce == nonce:
                return request


@contextlib.contextmanager
def management_server(
    ads: ManagementServer, port: int = 0, credentials: grpc.ServerCredentials | None = None
) -> Iterator[int]:
    """Serves `ads` on 127.0.0.1 (on `port` when given) while the block runs; yields the port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(ads, server)
    address = f"127.0.0.1:{port}"
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    server.start()
    try:
        yield bound
    finally:
        server.stop(grace=0).wait(5)


def descriptor(rls_conf, key: str, value: str = "", unit: str = "DAY", requests: int = 0, name: str = "", **fields):
    policy = rls_conf.RateLimitPolicy(unit=rls_conf.RateLimitUnit.Value(unit), requests_per_unit=requests, name=name)
    return rls_conf.RateLimitDescriptor(key=key, value=value, rate_limit=policy, **fields)


def check(target: str, *entries: tuple[str, str], domain: str = DOMAIN) -> rls_pb2.RateLimitResponse:
    request = rls_pb2.RateLimitRequest(
        domain=domain,
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
            )
        ],
    )
    with grpc.insecure_channel(target) as channel:
        return rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=5)


def readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def assert_ack(request: discovery_pb2.DiscoveryRequest, version: str, nonce: str) -> None:
    assert request.type_url == TYPE_URL
    assert (request.version_info, request.response_nonce) == (version, nonce)
    assert not request.HasField("error_detail"), request.error_detail


def test_snapshots_ack_nack_counters_and_reconnection(sluice_bin: Path, tmp_path: Path, rls_conf) -> None:
    ads = ManagementServer()
    port = free_port()
    user = descriptor(rls_conf, "user", requests=3, name="per-user")
    login = descriptor(rls_conf, "path", "/login", requests=1, name="login")
    signup = descriptor(rls_conf, "path", "/signup", requests=1, name="signup")
    snapshot_1 = rls_conf.RateLimitConfig(name="gateway-policy", domain=DOMAIN, descriptors=[user, login])
    # No unit on a limited rule: the whole snapshot is refused.
    broken = rls_conf.RateLimitConfig(
        name="broken-policy", domain="other", descriptors=[descriptor(rls_conf, "k", unit="UNKNOWN", requests=5)]
    )
    snapshot_2 = rls_conf.RateLimitConfig(name="gateway-policy", domain=DOMAIN, descriptors=[user, signup])
    args = (
        "--xds-server",
        f"http://127.0.0.1:{port}",
        "--xds-node-id",
        "sluice-test",
        "--xds-node-metadata",
        "cluster:edge,zone=eu-1",
        "--xds-header",
        "x-tenant:blue",
        *BACKOFF,
    )
    with contextlib.ExitStack() as stack:
        redis_url = stack.enter_context(redis_server(tmp_path))
        sluice = stack.enter_context(running_sluice(sluice_bin, None, tmp_path, (*args, "--redis-url", redis_url)))
        target = sluice.grpc_target
        with management_server(ads, port):
            subscribe = ads.next_request()
            assert subscribe.type_url == TYPE_URL
            assert (subscribe.version_info, subscribe.response_nonce) == ("", "")
            assert subscribe.node.id == "sluice-test"
            assert subscribe.node.user_agent_name == "sluice"
            assert set(subscribe.node.metadata.fields) == {"cluster", "zone"}
            assert subscribe.node.metadata.fields["zone"].string_value == "eu-1"
            assert ads.metadata[-1].get("x-tenant") == "blue"

            # Snapshot 1: ACKed, then obeyed.
            nonce = ads.push("1", snapshot_1)
            assert_ack(ads.answer_to(nonce), "1", nonce)
            assert readyz(sluice.http_port) == 200
            assert check(target, ("path", "/login")).overall_code == OK
            assert check(target, ("path", "/login")).overall_code == OVER_LIMIT
            assert check(target, ("path", "/signup")).overall_code == OK  # no rule for it yet
            assert check(target, ("user", "alice")).statuses[0].limit_remaining == 2
            assert check(target, ("user", "alice")).statuses[0].limit_remaining == 1

            # A snapshot that does not compile: NACKed with the error naming the resource; the old rules stay.
            nonce = ads.push("bad", snapshot_1, broken)
            nack = ads.answer_to(nonce)
            assert (nack.version_info, nack.response_nonce) == ("1", nonce)
            assert nack.error_detail.code == INVALID_ARGUMENT
            assert "xds:broken-policy" in nack.error_detail.message
            assert "descriptors[0].rate_limit.unit" in nack.error_detail.message
            assert check(target, ("path", "/login")).overall_code == OVER_LIMIT

            # Snapshot 2: /login's rule is gone, /signup's is new; the per-user counter (in Redis) survived.
            nonce = ads.push("2", snapshot_2)
            assert_ack(ads.answer_to(nonce), "2", nonce)
            assert check(target, ("path", "/login")).overall_code == OK
            assert check(target, ("path", "/signup")).overall_code == OK
            assert check(target, ("path", "/signup")).overall_code == OVER_LIMIT
            assert check(target, ("user", "alice")).statuses[0].limit_remaining == 0

        # The management server is gone: the last good rules keep deciding, readiness holds, sluice retries.
        assert check(target, ("user", "alice")).overall_code == OVER_LIMIT
        assert check(target, ("path", "/signup")).overall_code == OVER_LIMIT
        assert readyz(sluice.http_port) == 200
        wait_until(
            lambda: sluice.output.count("no stream to the xDS management server") >= 2,
            WAIT_S,
            "sluice to retry the management server while it is down",
        )

        # Back on the same port with its snapshot: sluice resubscribes with the version it holds, and ACKs.
        restarted = ManagementServer()
        reset = descriptor(rls_conf, "path", "/reset", requests=1, name="reset")
        snapshot_3 = rls_conf.RateLimitConfig(name="gateway-policy", domain=DOMAIN, descriptors=[user, reset])
        restarted.push("3", snapshot_3)
        with management_server(restarted, port):
            again = restarted.next_request()
            assert (again.version_info, again.response_nonce) == ("2", "")
            assert again.node.id == "sluice-test"
            answer = restarted.next_request()
            assert_ack(answer, "3", answer.response_nonce)
            assert answer.response_nonce.startswith("nonce-")
            assert check(target, ("path", "/reset")).statuses[0].current_limit.name == "reset"
            assert check(target, ("user", "alice")).overall_code == OVER_LIMIT


def test_not_ready_until_the_first_snapshot(sluice_bin: Path, tmp_path: Path, rls_conf) -> None:
    ads = ManagementServer()
    with management_server(ads) as port:
        args = ("--xds-server", f"http://127.0.0.1:{port}", *BACKOFF)
        with running_sluice(sluice_bin, None, tmp_path, args) as sluice:
            ads.next_request()
            # Serving already: with no rules, every domain is unknown, and unknown domains are not limited.
            assert readyz(sluice.http_port) == 503
            answer = check(sluice.grpc_target, ("user", "carol"))
            assert answer.overall_code == OK and not answer.statuses[0].HasField("current_limit")

            # A snapshot of no resources is applied as the reference applies it: no policy, no domain limited.
            nonce = ads.push("0")
            assert_ack(ads.answer_to(nonce), "0", nonce)
            assert readyz(sluice.http_port) == 200

            user = descriptor(rls_conf, "user", requests=1)
            nonce = ads.push("1", rls_conf.RateLimitConfig(name="p", domain=DOMAIN, descriptors=[user]))
            assert_ack(ads.answer_to(nonce), "1", nonce)
            assert readyz(sluice.http_port) == 200
            assert check(sluice.grpc_target, ("user", "carol")).statuses[0].current_limit.requests_per_unit == 1


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def certificates(tmp_path: Path) -> types.SimpleNamespace:
    """A throwaway CA, a server certificate for the name xds.test only (not 127.0.0.1), and a client certificate."""
    d = tmp_path / "pki"
    d.mkdir()
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    days = ("-days", "2")
    openssl("req", "-x509", *ec, *days, "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=xds test CA", cwd=d)
    for name, san in (("server", "DNS:xds.test"), ("client", "DNS:sluice.test")):
        subject = ("-subj", f"/CN={name}", "-addext", f"subjectAltName={san}")
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", *subject, cwd=d)
        signed = ("-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", f"{name}.pem")
        openssl("x509", "-req", *signed, *days, "-copy_extensions", "copy", cwd=d)
    return types.SimpleNamespace(dir=d, read=lambda name: (d / name).read_bytes())


def test_mutual_tls_with_a_name_override(sluice_bin: Path, tmp_path: Path, rls_conf, certificates) -> None:
    ads = ManagementServer()
    user = descriptor(rls_conf, "user", requests=2)
    ads.push("1", rls_conf.RateLimitConfig(name="p", domain=DOMAIN, descriptors=[user]))
    credentials = grpc.ssl_server_credentials(
        [(certificates.read("server.key"), certificates.read("server.pem"))],
        root_certificates=certificates.read("ca.pem"),
        require_client_auth=True,
    )
    pki = certificates.dir
    with management_server(ads, credentials=credentials) as port:
        tls = (
            "--xds-server", f"https://127.0.0.1:{port}",
            "--xds-tls-ca", str(pki / "ca.pem"),
            "--xds-tls-cert", str(pki / "client.pem"),
            "--xds-tls-key", str(pki / "client.key"),
            *BACKOFF,
        )
        # Without the override the certificate (for xds.test) does not match 127.0.0.1: no stream, no rules.
        with running_sluice(sluice_bin, None, tmp_path, tls) as sluice:
            refused = "certificate not valid for name"
            wait_until(lambda: refused in sluice.output, WAIT_S, "sluice to refuse the server's name")
            assert readyz(sluice.http_port) == 503
        assert ads.requests.empty()

        with running_sluice(sluice_bin, None, tmp_path, (*tls, "--xds-tls-san", "xds.test")) as sluice:
            assert ads.next_request().node.id == "default"
            assert_ack(ads.next_request(), "1", "nonce-2")
            assert readyz(sluice.http_port) == 200
            assert check(sluice.grpc_target, ("user", "dave")).statuses[0].limit_remaining == 1


def test_the_reference_xds_variables(sluice_bin: Path, tmp_path: Path, rls_conf) -> None:
    """A deployment of the reference configured for Envoy Gateway (CONFIG_TYPE=GRPC_XDS_SOTW and its variables),
    started under sluice's compatibility mode, subscribes as the reference would and applies what it is sent."""
    ads = ManagementServer()
    with management_server(ads) as port, redis_server(tmp_path) as redis_url:
        env = {
            "CONFIG_TYPE": "GRPC_XDS_SOTW",
            "CONFIG_GRPC_XDS_SERVER_URL": f"127.0.0.1:{port}",
            "CONFIG_GRPC_XDS_NODE_ID": "envoy-gateway-ratelimit",
            "CONFIG_GRPC_XDS_NODE_METADATA": "tier=edge",
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "x-tenant:green",
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "50ms",
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "400ms",
            "REDIS_SOCKET_TYPE": "tcp",
            "REDIS_URL": redis_url.removeprefix("redis://"),
            "HOST": "127.0.0.1",
            "PORT": str(free_port()),
        }
        with running_sluice(sluice_bin, None, tmp_path, ("--compat", "envoy-ratelimit"), env) as sluice:
            first = ads.next_request()
            assert first.node.id == "envoy-gateway-ratelimit" and first.type_url == TYPE_URL
            assert first.node.metadata.fields["tier"].string_value == "edge"
            assert ads.metadata[-1].get("x-tenant") == "green"
            user = descriptor(rls_conf, "user", requests=1)
            nonce = ads.push("1", rls_conf.RateLimitConfig(name="p", domain=DOMAIN, descriptors=[user]))
            assert_ack(ads.answer_to(nonce), "1", nonce)
            assert check(sluice.grpc_target, ("user", "dave")).overall_code == OK
            assert check(sluice.grpc_target, ("user", "dave")).overall_code == OVER_LIMIT
