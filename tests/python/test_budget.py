"""Cost budgets against a real sluice process.

- Through a real Envoy 1.40 (deploy/envoy-llm.yaml, ports replaced) in front of a small model API that answers with
  the tokens it spent in x-tokens: Envoy checks each user's budget before the request and reports the tokens after
  it; once reported tokens spend the budget, the next request gets 429 with Envoy's x-ratelimit-* headers, and
  another user is unaffected.
- From a Python client built from this repository's proto (sluice.v1): 20 callers at once reserve an estimate, run a
  slow fake call, and settle the actual cost; the reservations never together exceed the budget, and settling
  gives back what was not spent.
- With the defaults users run (the local over-limit cache on), in memory and with two instances on one Redis: a
  refund settled on either instance is in force on both at once (a refused reservation's remembered denial never
  outlives it), a reservation of nothing is refused naming `estimate`, and an unknown domain gets no id.
"""

from __future__ import annotations

import concurrent.futures
import http.server
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2

import contextlib

from conftest import redis_server, running_sluice, wait_until
from test_envoy import Upstream, running_envoy, serving, with_ports

RPC_TIMEOUT_S = 5.0


class ModelApi(Upstream):
    """The protected model: answers 200 with `x-tokens: <n>`, n from the request's `tokens` query parameter."""

    def __init__(self):
        http.server.ThreadingHTTPServer.__init__(self, ("127.0.0.1", 0), _ModelHandler)
        self.paths = []
        self._lock = threading.Lock()


class _ModelHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        with self.server._lock:
            self.server.paths.append(self.path)
        tokens = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query).get("tokens", ["0"])[0]
        body = b"generated text\n"
        self.send_response(200)
        self.send_header("x-tokens", tokens)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass


def llm_envoy_config(listener_port: int, admin_port: int, upstream_port: int, sluice_port: int) -> dict:
    """deploy/envoy-llm.yaml with its ports replaced."""
    return with_ports("envoy-llm.yaml", listener_port, admin_port, {"model": upstream_port, "sluice": sluice_port})


@pytest.fixture(scope="module")
def model() -> Iterator[ModelApi]:
    with serving(ModelApi()) as server:
        yield server


def descriptor(*entries: tuple[str, str]) -> ratelimit_pb2.RateLimitDescriptor:
    return ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )


def test_envoy_charges_reported_tokens_and_answers_429_once_spent(
    sluice_bin: Path, model: ModelApi, tmp_path: Path, sluice_stubs
):
    config = tmp_path / "llm.yaml"
    config.write_text(
        "domain: llm\ndescriptors:\n"
        "  - key: user\n    cost_reports: true\n"
        "    rate_limits:\n"
        "      - {unit: day, requests_per_unit: 1000, name: user_tokens_per_day}\n"
        "      - {unit: week, requests_per_unit: 100000, name: user_tokens_per_week}\n"
        "  - key: api_key\n    cost_reports: true\n"
        "    rate_limit: {unit: day, requests_per_unit: 100000, name: key_tokens_per_day}\n"
    )
    with running_sluice(sluice_bin, config, tmp_path) as sluice:
        channel = grpc.insecure_channel(sluice.grpc_target)
        stub = sluice_stubs.grpc.RateLimiterStub(channel)

        def remaining(user: str) -> int:
            request = sluice_stubs.pb2.GetRemainingRequest(domain="llm", descriptors=[descriptor(("user", user))])
            return stub.GetRemaining(request, timeout=RPC_TIMEOUT_S).descriptors[0].remaining

        with running_envoy(tmp_path, model, sluice.grpc_port, llm_envoy_config) as edge:
            alice = {"x-user": "alice", "x-api-key": "k1"}
            for spent in (400, 800, 1200):
                status, headers = edge.get("/v1/chat?tokens=400", alice)
                assert status == 200, headers
                # Envoy reports the tokens once the stream is done: wait until sluice has counted them.
                wait_until(lambda: remaining("alice") == max(0, 1000 - spent), 10, f"{spent} tokens counted")
            # 1 200 of 1 000 tokens spent (the last call passed with 200 left, and its tokens still count).
            status, headers = edge.get("/v1/chat?tokens=400", alice)
            assert status == 429, headers
            assert headers.get("x-ratelimit-remaining") == "0", headers
            assert headers["x-ratelimit-limit"].startswith("1000"), headers
            assert int(headers["x-ratelimit-reset"]) >= 1
            # The refused request reached nothing and was charged nothing.
            assert model.paths.count("/v1/chat?tokens=400") == 3
            # Another user (same key) is unaffected.
            assert edge.get("/v1/chat?tokens=10", {"x-user": "bob", "x-api-key": "k1"})[0] == 200
            wait_until(lambda: remaining("bob") == 990, 10, "bob's 10 tokens counted")
        channel.close()


BUDGET = 1000
ESTIMATE = 100
CALLERS = 20


def test_concurrent_reservations_never_overspend_and_settle_refunds(
    sluice_bin: Path, tmp_path: Path, sluice_stubs
):
    config = tmp_path / "budget.yaml"
    config.write_text(
        "domain: llm\ndescriptors:\n"
        f"  - key: user\n    rate_limit: {{unit: day, requests_per_unit: {BUDGET}, name: tokens}}\n"
    )
    pb2 = sluice_stubs.pb2
    with running_sluice(sluice_bin, config, tmp_path) as sluice:
        channel = grpc.insecure_channel(sluice.grpc_target)
        stub = sluice_stubs.grpc.RateLimiterStub(channel)
        user = [descriptor(("user", "carol"))]
        barrier = threading.Barrier(CALLERS)

        def caller(i: int) -> tuple[bool, int]:
            barrier.wait()
            reserved = stub.Reserve(
                pb2.ReserveRequest(domain="llm", descriptors=user, estimate=ESTIMATE), timeout=RPC_TIMEOUT_S
            )
            if not reserved.reservation_id:
                assert reserved.overall_code == 2  # OVER_LIMIT
                return False, 0
            assert reserved.overall_code == 1 and reserved.ttl.seconds > 0
            time.sleep(0.2)  # the slow call the reservation covers
            actual = 10 + i  # every call spends less than it estimated
            settled = stub.Settle(
                pb2.SettleRequest(
                    domain="llm", descriptors=user, reservation_id=reserved.reservation_id, actual=actual
                ),
                timeout=RPC_TIMEOUT_S,
            )
            assert settled.settled
            (settlement,) = settled.settlements
            assert (settlement.estimate, settlement.actual, settlement.refunded) == (ESTIMATE, actual, ESTIMATE - actual)
            # Settling twice finds nothing.
            again = stub.Settle(
                pb2.SettleRequest(domain="llm", descriptors=user, reservation_id=reserved.reservation_id, actual=0),
                timeout=RPC_TIMEOUT_S,
            )
            assert not again.settled
            return True, actual

        with concurrent.futures.ThreadPoolExecutor(CALLERS) as pool:
            results = list(pool.map(caller, range(CALLERS)))
        admitted = [actual for ok, actual in results if ok]
        # 20 estimates of 100 against 1 000: exactly 10 held at once, the others refused.
        assert len(admitted) == BUDGET // ESTIMATE, results
        # Settling gave back the unspent estimates: what is left is the budget minus what was spent.
        left = stub.GetRemaining(pb2.GetRemainingRequest(domain="llm", descriptors=user), timeout=RPC_TIMEOUT_S)
        assert left.descriptors[0].remaining == BUDGET - sum(admitted)
        # Check decides without counting; Report counts past the limit and the next Check denies.
        check = stub.Check(pb2.CostRequest(domain="llm", descriptors=user, cost=BUDGET), timeout=RPC_TIMEOUT_S)
        assert check.overall_code == 2
        report = stub.Report(pb2.CostRequest(domain="llm", descriptors=user, cost=2**64 - 1), timeout=RPC_TIMEOUT_S)
        assert report.overall_code == 1 and report.statuses[0].limit_remaining == 0
        assert stub.Check(pb2.CostRequest(domain="llm", descriptors=user), timeout=RPC_TIMEOUT_S).overall_code == 2
        channel.close()


@contextlib.contextmanager
def budget_instances(sluice_bin: Path, tmp_path: Path, store: str):
    """One in-memory sluice, or two sluice processes on one Redis, each with its default flags (cache on)."""
    config = tmp_path / "budget.yaml"
    config.write_text(
        "domain: llm\ndescriptors:\n"
        f"  - key: user\n    rate_limit: {{unit: day, requests_per_unit: {BUDGET}, name: tokens}}\n"
    )
    with contextlib.ExitStack() as stack:
        if store == "memory":
            yield [stack.enter_context(running_sluice(sluice_bin, config, tmp_path))]
            return
        url = stack.enter_context(redis_server(tmp_path))
        instances = []
        for name in ("a", "b"):
            workdir = tmp_path / name
            workdir.mkdir()
            instances.append(stack.enter_context(running_sluice(sluice_bin, config, workdir, ("--redis-url", url))))
        yield instances


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_refund_is_in_force_at_once_with_the_cache_on(sluice_bin: Path, tmp_path: Path, sluice_stubs, store):
    pb2 = sluice_stubs.pb2
    with budget_instances(sluice_bin, tmp_path, store) as instances:
        stubs = [sluice_stubs.grpc.RateLimiterStub(grpc.insecure_channel(i.grpc_target)) for i in instances]
        lags = []
        for round in range(20):
            user = [descriptor(("user", f"u{round}"))]
            mine, other = stubs[round % len(stubs)], stubs[(round + 1) % len(stubs)]

            def reserve(stub, estimate):
                return stub.Reserve(
                    pb2.ReserveRequest(domain="llm", descriptors=user, estimate=estimate), timeout=RPC_TIMEOUT_S
                )

            held = reserve(mine, BUDGET)
            assert held.overall_code == 1 and held.reservation_id
            for _ in range(2):
                refused = reserve(mine, 1)
                assert (refused.overall_code, refused.reservation_id) == (2, "")
            asked = time.monotonic()
            settled = other.Settle(
                pb2.SettleRequest(domain="llm", descriptors=user, reservation_id=held.reservation_id, actual=0),
                timeout=RPC_TIMEOUT_S,
            )
            assert settled.settled and settled.settlements[0].refunded == BUDGET
            done = time.monotonic()
            # Bounded by the stated 100 ms on a quiet host, and by as much more as twice the settlement's own round
            # trip on a busy one; the first try passes unless the notice is still on its way.
            bound = 0.1 + 2 * (done - asked)
            while reserve(mine, 1).overall_code != 1:
                assert time.monotonic() - done < bound, f"round {round}: a stale denial outlived the refund"
            lags.append(time.monotonic() - done)
            check = mine.Check(pb2.CostRequest(domain="llm", descriptors=user, cost=1), timeout=RPC_TIMEOUT_S)
            assert check.overall_code == 1
        print(f"{store}: a refund in force on the reserving instance after at most {max(lags) * 1000:.1f} ms")

        user = [descriptor(("user", "nobody"))]
        with pytest.raises(grpc.RpcError) as zero:
            stubs[0].Reserve(pb2.ReserveRequest(domain="llm", descriptors=user, estimate=0), timeout=RPC_TIMEOUT_S)
        assert zero.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert zero.value.details().startswith("estimate: descriptors[0]"), zero.value.details()
        unknown = stubs[0].Reserve(
            pb2.ReserveRequest(domain="nowhere", descriptors=user, estimate=5), timeout=RPC_TIMEOUT_S
        )
        assert (unknown.overall_code, unknown.reservation_id) == (1, "")

