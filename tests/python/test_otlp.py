"""Tracing and logs as an operator sees them: sluice's spans arrive at an OTLP/gRPC collector inside the caller's
trace, at an OTLP/HTTP collector when the reference's TRACING_* variables ask for it, and `--log-format json` writes
nothing but JSON.

The collectors are a real gRPC server implementing OpenTelemetry's `TraceService/Export` with the stubs PyPI's
`opentelemetry-proto` ships, and an HTTP server decoding `POST /v1/traces` bodies with the same messages, so the
spans are checked as any collector would decode them. sluice batches its spans and
sends what it holds when it stops; every test here stops sluice (SIGTERM, graceful shutdown) before it looks.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from concurrent import futures
from pathlib import Path
from typing import Callable, Iterator

import grpc
import pytest
from conftest import free_port, redis_server, running_sluice, wait_until
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

DOMAIN = "traced"
CONFIG = f"""\
domain: {DOMAIN}
descriptors:
  - key: client
    rate_limit: {{unit: day, requests_per_unit: 100}}
"""
RPC_TIMEOUT_S = 5
EXPORT_TIMEOUT_S = 5
SERVICE_NAME = "sluice-test"
SERVER = trace_pb2.Span.SpanKind.SPAN_KIND_SERVER


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver that keeps every span it is sent, with its resource's attributes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[tuple[dict[str, str], trace_pb2.Span]] = []

    def Export(self, request, context):  # noqa: N802 (the gRPC method's name)
        with self._lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    self._spans.extend((resource, span) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[dict[str, str], trace_pb2.Span]]:
        with self._lock:
            return list(self._spans)


@pytest.fixture
def collector() -> Iterator[tuple[Collector, str]]:
    """A running collector and its endpoint, as OTEL_EXPORTER_OTLP_ENDPOINT takes it."""
    receiver = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield receiver, f"http://127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def otel_env(endpoint: str) -> dict[str, str]:
    """Export to `endpoint`, whatever OTEL_* variables the test run itself inherited."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "",  # empty is unset; it would win over the one above
        "OTEL_SERVICE_NAME": SERVICE_NAME,
        "OTEL_SDK_DISABLED": "false",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
    }


def request(client: str) -> rls_pb2.RateLimitRequest:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="client", value=client)
    return rls_pb2.RateLimitRequest(domain=DOMAIN, descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])])


def attributes(span: trace_pb2.Span) -> dict[str, str]:
    return {a.key: a.value.string_value for a in span.attributes}


def test_spans_join_the_callers_trace(
    sluice_bin: Path, sluice_stubs, write_config: Callable[[str], Path], tmp_path: Path, collector
) -> None:
    receiver, endpoint = collector
    trace_id, parent_id, other_parent_id = secrets.token_hex(16), secrets.token_hex(8), secrets.token_hex(8)

    with running_sluice(sluice_bin, write_config(CONFIG), tmp_path, env=otel_env(endpoint)) as server:
        with grpc.insecure_channel(server.grpc_target) as channel:
            envoy = rls_pb2_grpc.RateLimitServiceStub(channel)
            response = envoy.ShouldRateLimit(
                request("a"), timeout=RPC_TIMEOUT_S, metadata=[("traceparent", f"00-{trace_id}-{parent_id}-01")]
            )
            assert response.overall_code == rls_pb2.RateLimitResponse.OK
            remaining = sluice_stubs.grpc.RateLimiterStub(channel).GetRemaining(
                sluice_stubs.pb2.GetRemainingRequest(domain=DOMAIN, descriptors=request("a").descriptors),
                timeout=RPC_TIMEOUT_S,
                metadata=[("traceparent", f"00-{trace_id}-{other_parent_id}-01"), ("tracestate", "envoy=1")],
            )
            assert len(remaining.descriptors) == 1
            # No trace context: sluice starts a trace of its own.
            envoy.ShouldRateLimit(request("b"), timeout=RPC_TIMEOUT_S)
        # Leaving the block stops sluice with SIGTERM and checks it exits 0: the batch is flushed on the way out.

    def exported(name: str) -> bool:
        return any(span.name == name for _, span in receiver.spans())

    for name in ("envoy.ShouldRateLimit", "store.hit", "sluice.GetRemaining", "store.peek"):
        wait_until(lambda: exported(name), EXPORT_TIMEOUT_S, f"a '{name}' span at the collector")
    spans = receiver.spans()

    assert {resource.get("service.name") for resource, _ in spans} == {SERVICE_NAME}
    in_trace = [span for _, span in spans if span.trace_id.hex() == trace_id]
    by_name = {span.name: span for span in in_trace}
    assert set(by_name) >= {
        "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        "envoy.ShouldRateLimit",
        "store.hit",
        "sluice.v1.RateLimiter/GetRemaining",
        "sluice.GetRemaining",
        "store.peek",
    }, f"spans in trace {trace_id}: {sorted(by_name)}"

    # Call span <- caller's span; handler span <- call span; store span <- handler span.
    rpc = by_name["envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"]
    assert rpc.parent_span_id.hex() == parent_id
    assert rpc.kind == SERVER
    assert {k: attributes(rpc).get(k) for k in ("rpc.system", "rpc.service", "rpc.method")} == {
        "rpc.system": "grpc",
        "rpc.service": "envoy.service.ratelimit.v3.RateLimitService",
        "rpc.method": "ShouldRateLimit",
    }
    handler = by_name["envoy.ShouldRateLimit"]
    assert handler.parent_span_id == rpc.span_id
    assert attributes(handler)["domain"] == DOMAIN
    hit = by_name["store.hit"]
    assert hit.parent_span_id == handler.span_id
    assert attributes(hit)["store"] == "memory"

    remaining_rpc = by_name["sluice.v1.RateLimiter/GetRemaining"]
    assert remaining_rpc.parent_span_id.hex() == other_parent_id
    assert remaining_rpc.trace_state == "envoy=1"
    assert by_name["store.peek"].parent_span_id == by_name["sluice.GetRemaining"].span_id

    # The call without context is the root of a new trace, not a child of the previous call's.
    roots = [
        span
        for _, span in spans
        if span.name == "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" and span.trace_id.hex() != trace_id
    ]
    assert len(roots) == 1 and roots[0].parent_span_id == b""


def test_a_bad_endpoint_stops_sluice_with_an_error_naming_the_variable(
    sluice_bin: Path, write_config: Callable[[str], Path]
) -> None:
    env = otel_env("http://not a uri:4317")
    completed = subprocess.run(
        [str(sluice_bin), "serve", "--config", str(write_config(CONFIG))]
        + ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=RPC_TIMEOUT_S,
    )
    assert completed.returncode == 1, completed.stderr
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in completed.stderr


def test_json_logs_are_json_on_every_line(
    sluice_bin: Path, sluice_stubs, write_config: Callable[[str], Path], tmp_path: Path, collector
) -> None:
    _, endpoint = collector
    token = secrets.token_hex(8)
    # Debug logs bring in tonic, h2 and the exporter's own events: all of them must be JSON too.
    env = otel_env(endpoint) | {"RUST_LOG": "debug"}
    with running_sluice(
        sluice_bin, write_config(CONFIG), tmp_path, ("--log-format", "json", "--admin-token", token), env
    ) as server:
        with grpc.insecure_channel(server.grpc_target) as channel:
            rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request("a"), timeout=RPC_TIMEOUT_S)
            sluice_stubs.grpc.RateLimiterStub(channel).Reset(
                sluice_stubs.pb2.ResetRequest(domain=DOMAIN, descriptors=request("a").descriptors),
                timeout=RPC_TIMEOUT_S,
                metadata=[("authorization", f"Bearer {token}")],
            )
    lines = server.log_path.read_text().splitlines()

    logs = []
    for number, line in enumerate(lines, 1):
        try:
            logs.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"line {number} of sluice's log is not JSON: {line!r}")
    messages = [log.get("fields", {}).get("message") for log in logs]
    assert "serving" in messages and "drained; stopped" in messages, messages
    # An event inside a call carries the call's spans as structured fields.
    (reset,) = [log for log in logs if log.get("fields", {}).get("message") == "reset"]
    assert reset["level"] == "INFO"
    assert [span["name"] for span in reset["spans"]] == ["grpc", "sluice.Reset"]
    assert reset["spans"][0]["rpc.method"] == "Reset"


@pytest.fixture
def http_collector() -> Iterator[tuple[Collector, str]]:
    """An OTLP/HTTP receiver (protobuf bodies at /v1/traces) and its base URL."""
    receiver = Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the handler's name)
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            receiver.Export(trace_service_pb2.ExportTraceServiceRequest.FromString(body), None)
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_reference_tracing_variables_export_over_otlp_http(
    sluice_bin: Path, write_config: Callable[[str], Path], tmp_path: Path, http_collector
) -> None:
    receiver, endpoint = http_collector
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    with redis_server(tmp_path) as redis_url:
        env = {
            "TRACING_ENABLED": "true",
            "TRACING_EXPORTER_PROTOCOL": "http",
            "TRACING_SERVICE_NAME": "ratelimit-test",
            "TRACING_SERVICE_NAMESPACE": "edge",
            "TRACING_SAMPLING_RATE": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "",
            "OTEL_SDK_DISABLED": "false",
            "REDIS_SOCKET_TYPE": "tcp",
            "REDIS_URL": redis_url.removeprefix("redis://"),
            "HOST": "127.0.0.1",
            "PORT": str(free_port()),
        }
        # The listeners and the configuration come from the flags running_sluice adds after the derived ones.
        with running_sluice(
            sluice_bin, write_config(CONFIG), tmp_path, ("--compat", "envoy-ratelimit"), env
        ) as server:
            with grpc.insecure_channel(server.grpc_target) as channel:
                response = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(
                    request("a"), timeout=RPC_TIMEOUT_S, metadata=[("traceparent", f"00-{trace_id}-{parent_id}-01")]
                )
                assert response.overall_code == rls_pb2.RateLimitResponse.OK

    def exported() -> bool:
        return any(span.trace_id.hex() == trace_id and span.name == "store.hit" for _, span in receiver.spans())

    wait_until(exported, EXPORT_TIMEOUT_S, "the call's spans at the OTLP/HTTP collector")
    resources = {tuple(sorted(resource.items())) for resource, span in receiver.spans() if span.trace_id.hex() == trace_id}
    assert len(resources) == 1
    (resource,) = [dict(r) for r in resources]
    assert resource["service.name"] == "ratelimit-test" and resource["service.namespace"] == "edge", resource
    hit = next(span for _, span in receiver.spans() if span.trace_id.hex() == trace_id and span.name == "store.hit")
    assert attributes(hit)["store"] == "redis"
