"""The `queue` algorithm end to end: sluice on a real Redis admits requests while the stream has room, returns the
stream and entry ids in dynamic_metadata, and examples/queue_worker.py drains the stream, which frees the places."""

import subprocess
import sys

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from conftest import REPO, redis_server

CONFIG = """
domain: jobs
descriptors:
  - key: export
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: queue}
"""


def request(user: str) -> rls_pb2.RateLimitRequest:
    entries = [ratelimit_pb2.RateLimitDescriptor.Entry(key="export", value=user)]
    return rls_pb2.RateLimitRequest(domain="jobs", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=entries)])


def queued(response: rls_pb2.RateLimitResponse) -> list:
    fields = response.dynamic_metadata.fields
    if "sluice" not in fields:
        return []
    return list(fields["sluice"].struct_value.fields["queued"].list_value.values)


def test_worker_drains_the_queue_and_frees_places(tmp_path, start_sluice, write_config):
    with redis_server(tmp_path) as url:
        sluice = start_sluice(write_config(CONFIG), "--redis-url", url)
        with grpc.insecure_channel(sluice.grpc_target) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            first = stub.ShouldRateLimit(request("alice"), timeout=5)
            second = stub.ShouldRateLimit(request("alice"), timeout=5)
            assert first.overall_code == second.overall_code == rls_pb2.RateLimitResponse.OK
            entry = queued(first)[0].struct_value.fields
            stream = entry["stream"].string_value
            assert entry["descriptor"].number_value == 0
            assert entry["entry_id"].string_value != queued(second)[0].struct_value.fields["entry_id"].string_value
            full = stub.ShouldRateLimit(request("alice"), timeout=5)
            assert full.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
            assert queued(full) == []

            worker = subprocess.run(
                [sys.executable, str(REPO / "examples" / "queue_worker.py"), "--redis", url, "--stream", stream, "--once"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert worker.returncode == 0, worker.stderr
            assert "handled 2 entries" in worker.stderr
            assert worker.stdout.count("{'export': 'alice'}") == 2, worker.stdout

            again = stub.ShouldRateLimit(request("alice"), timeout=5)
            assert again.overall_code == rls_pb2.RateLimitResponse.OK, "the worker freed the places"
