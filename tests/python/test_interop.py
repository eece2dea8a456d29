"""Wire compatibility over TCP: a Python client built from Envoy's official API stubs (PyPI `xds-protos`) talks to
the sluice binary, through Envoy's RateLimitService and through sluice.v1.RateLimiter.

Every test gets a fresh server (the store is in memory), so counters never leak between tests. All counted limits
use windows of a day or longer: a test lasts well under a second, so a window boundary can only fall inside one
with a negligible chance, and no test ever waits for a window to pass.
"""

from __future__ import annotations

from typing import Callable

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from envoy.type.v3 import ratelimit_unit_pb2
from google.protobuf import wrappers_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

DOMAIN = "interop"

CONFIG = f"""\
domain: {DOMAIN}
descriptors:
  # Key only: every distinct value gets its own counter.
  - key: client
    rate_limit: {{unit: day, requests_per_unit: 3}}

  # Exact value, reported to Envoy under a name.
  - key: path
    value: /login
    rate_limit: {{unit: month, requests_per_unit: 2, name: login}}

  # Wildcard with a limit of its own (per matching value) and a nested rule for the next entry.
  - key: path
    value: /api/*
    rate_limit: {{unit: day, requests_per_unit: 4}}
    descriptors:
      - key: user
        rate_limit: {{unit: year, requests_per_unit: 2, name: api-user}}

  - key: tier
    value: internal
    rate_limit: {{unlimited: true}}

  # Enforced in metrics only: over-limit hits still answer OK.
  - key: plan
    value: trial
    shadow_mode: true
    rate_limit: {{unit: day, requests_per_unit: 1, name: trial}}

  # A rule that takes the place of another matched in the same request.
  - key: team
    rate_limit: {{unit: day, requests_per_unit: 1, name: team}}
  - key: region
    rate_limit: {{unit: day, requests_per_unit: 10, name: region, replaces: [{{name: team}}]}}

  # sluice's extensions under rate_limit: a two-day window and an explicit algorithm.
  - key: batch
    rate_limit: {{unit: day, unit_multiplier: 2, requests_per_unit: 5, algorithm: fixed_window}}
"""

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT
Unit = rls_pb2.RateLimitResponse.RateLimit  # Unit values live on the RateLimit message: Unit.DAY, Unit.YEAR, ...
U32_MAX = 4294967295
DAY_S = 86400
RPC_TIMEOUT_S = 5


def descriptor(*entries: tuple[str, str], **fields) -> ratelimit_pb2.RateLimitDescriptor:
    """A descriptor from (key, value) pairs; `fields` sets `limit` or `hits_addend`."""
    return ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries], **fields
    )


def rls_request(*descriptors: ratelimit_pb2.RateLimitDescriptor, domain: str = DOMAIN, hits_addend: int = 0):
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits_addend)


def assert_no_rule(status: rls_pb2.RateLimitResponse.DescriptorStatus) -> None:
    """The status of a descriptor no rule applies to: OK and nothing else."""
    assert status.code == OK
    assert not status.HasField("current_limit")
    assert status.limit_remaining == 0
    assert not status.HasField("duration_until_reset")


def assert_limited(status, code, requests_per_unit, unit, remaining, name="", window_s=DAY_S) -> None:
    """The status of a descriptor a finite rule applied to; Envoy's x-ratelimit headers are built from these fields."""
    assert status.code == code
    assert status.HasField("current_limit")
    assert status.current_limit.requests_per_unit == requests_per_unit
    assert status.current_limit.unit == unit
    assert status.current_limit.name == name
    assert status.limit_remaining == remaining
    assert status.HasField("duration_until_reset")
    assert 1 <= status.duration_until_reset.seconds <= window_s


@pytest.fixture
def sluice(start_sluice, write_config):
    return start_sluice(write_config(CONFIG))


@pytest.fixture
def channel(sluice):
    # Closed before the server is stopped, so graceful shutdown has no idle client connection to wait for.
    with grpc.insecure_channel(sluice.grpc_target) as ch:
        grpc.channel_ready_future(ch).result(timeout=RPC_TIMEOUT_S)
        yield ch


@pytest.fixture
def envoy_rls(channel) -> rls_pb2_grpc.RateLimitServiceStub:
    return rls_pb2_grpc.RateLimitServiceStub(channel)


@pytest.fixture
def sluice_rls(channel, sluice_stubs):
    return sluice_stubs.grpc.RateLimiterStub(channel)


@pytest.fixture(params=["envoy.service.ratelimit.v3.RateLimitService", "sluice.v1.RateLimiter"])
def should_rate_limit(
    request, envoy_rls, sluice_rls
) -> Callable[[rls_pb2.RateLimitRequest], rls_pb2.RateLimitResponse]:
    """ShouldRateLimit through either service: both must give the same answers to the same Envoy messages."""
    stub = envoy_rls if request.param.startswith("envoy.") else sluice_rls
    return lambda req: stub.ShouldRateLimit(req, timeout=RPC_TIMEOUT_S)


@pytest.fixture
def get_remaining(sluice_rls, sluice_stubs):
    def call(*descriptors, cost=None, domain=DOMAIN):
        req = sluice_stubs.pb2.GetRemainingRequest(domain=domain, descriptors=descriptors)
        if cost is not None:
            req.cost = cost
        return sluice_rls.GetRemaining(req, timeout=RPC_TIMEOUT_S).descriptors

    return call


# --- ShouldRateLimit -------------------------------------------------------------------------------------------------


def test_key_only_rule_allows_the_limit_then_rejects(should_rate_limit):
    alice = descriptor(("client", "alice"))
    for remaining in (2, 1, 0):
        resp = should_rate_limit(rls_request(alice))
        assert resp.overall_code == OK
        assert len(resp.statuses) == 1
        assert_limited(resp.statuses[0], OK, 3, Unit.DAY, remaining)
        # The service adds no headers of its own unless told to: Envoy builds x-ratelimit-* from the status.
        assert not resp.response_headers_to_add and not resp.request_headers_to_add

    for _ in range(2):
        resp = should_rate_limit(rls_request(alice))
        assert resp.overall_code == OVER_LIMIT
        assert_limited(resp.statuses[0], OVER_LIMIT, 3, Unit.DAY, 0)

    # Another value of the same key has a counter of its own.
    resp = should_rate_limit(rls_request(descriptor(("client", "bob"))))
    assert resp.overall_code == OK
    assert_limited(resp.statuses[0], OK, 3, Unit.DAY, 2)


def test_exact_value_rule_reports_its_name(should_rate_limit):
    login = descriptor(("path", "/login"))
    for remaining in (1, 0):
        resp = should_rate_limit(rls_request(login))
        assert resp.overall_code == OK
        assert_limited(resp.statuses[0], OK, 2, Unit.MONTH, remaining, name="login", window_s=30 * DAY_S)
    resp = should_rate_limit(rls_request(login))
    assert resp.overall_code == OVER_LIMIT
    assert_limited(resp.statuses[0], OVER_LIMIT, 2, Unit.MONTH, 0, name="login", window_s=30 * DAY_S)

    # An exact value matches only itself.
    assert_no_rule(should_rate_limit(rls_request(descriptor(("path", "/login/extra")))).statuses[0])


def test_wildcard_rule_counts_each_matching_value(should_rate_limit):
    for remaining in (3, 2):
        resp = should_rate_limit(rls_request(descriptor(("path", "/api/orders"))))
        assert_limited(resp.statuses[0], OK, 4, Unit.DAY, remaining)
    # Without share_threshold, each value the wildcard matches has its own counter.
    resp = should_rate_limit(rls_request(descriptor(("path", "/api/users"))))
    assert_limited(resp.statuses[0], OK, 4, Unit.DAY, 3)
    # The '*' needs the prefix.
    assert_no_rule(should_rate_limit(rls_request(descriptor(("path", "/apix")))).statuses[0])


def test_nested_rule_matches_the_next_entry(should_rate_limit):
    alice = descriptor(("path", "/api/orders"), ("user", "alice"))
    for remaining in (1, 0):
        resp = should_rate_limit(rls_request(alice))
        assert resp.overall_code == OK
        assert_limited(resp.statuses[0], OK, 2, Unit.YEAR, remaining, name="api-user", window_s=365 * DAY_S)
    resp = should_rate_limit(rls_request(alice))
    assert resp.overall_code == OVER_LIMIT
    assert_limited(resp.statuses[0], OVER_LIMIT, 2, Unit.YEAR, 0, name="api-user", window_s=365 * DAY_S)

    # Another user under the same wildcard is counted apart.
    resp = should_rate_limit(rls_request(descriptor(("path", "/api/orders"), ("user", "bob"))))
    assert_limited(resp.statuses[0], OK, 2, Unit.YEAR, 1, name="api-user", window_s=365 * DAY_S)
    # Deeper than the tree, or an entry that matches nothing at its level: no rule.
    assert_no_rule(should_rate_limit(rls_request(descriptor(("path", "/login"), ("user", "alice")))).statuses[0])
    assert_no_rule(should_rate_limit(rls_request(descriptor(("path", "/api/orders"), ("team", "x")))).statuses[0])


def test_one_status_per_descriptor_in_request_order(should_rate_limit):
    resp = should_rate_limit(
        rls_request(
            descriptor(("tier", "internal")),
            descriptor(("client", "carol")),
            descriptor(("no-such-key", "x")),
            descriptor(("path", "/login")),
        )
    )
    assert resp.overall_code == OK
    assert len(resp.statuses) == 4
    assert resp.statuses[0].limit_remaining == U32_MAX
    assert_limited(resp.statuses[1], OK, 3, Unit.DAY, 2)
    assert_no_rule(resp.statuses[2])
    assert_limited(resp.statuses[3], OK, 2, Unit.MONTH, 1, name="login", window_s=30 * DAY_S)


def test_one_descriptor_over_the_limit_rejects_the_request(should_rate_limit):
    dave = descriptor(("client", "dave"))
    should_rate_limit(rls_request(dave, hits_addend=3))
    resp = should_rate_limit(rls_request(descriptor(("tier", "internal")), dave, descriptor(("client", "erin"))))
    assert resp.overall_code == OVER_LIMIT
    assert [s.code for s in resp.statuses] == [OK, OVER_LIMIT, OK]
    # Every descriptor is evaluated, even after one is over: erin's hit was counted.
    assert_limited(resp.statuses[2], OK, 3, Unit.DAY, 2)


def test_unknown_domain_is_ok_with_empty_statuses(should_rate_limit):
    resp = should_rate_limit(
        rls_request(descriptor(("client", "alice")), descriptor(("path", "/login")), domain="nowhere")
    )
    assert resp.overall_code == OK
    assert len(resp.statuses) == 2
    for status in resp.statuses:
        assert_no_rule(status)


def test_unlimited_rule_never_limits(should_rate_limit):
    internal = descriptor(("tier", "internal"))
    for _ in range(5):
        resp = should_rate_limit(rls_request(internal, hits_addend=1000))
        assert resp.overall_code == OK
        status = resp.statuses[0]
        assert status.code == OK
        assert status.limit_remaining == U32_MAX
        assert not status.HasField("current_limit")
        assert not status.HasField("duration_until_reset")


def test_shadow_mode_rule_over_the_limit_answers_ok(should_rate_limit):
    trial = descriptor(("plan", "trial"))
    resp = should_rate_limit(rls_request(trial))
    assert resp.overall_code == OK
    assert_limited(resp.statuses[0], OK, 1, Unit.DAY, 0, name="trial")
    for _ in range(2):
        resp = should_rate_limit(rls_request(trial))
        assert resp.overall_code == OK
        # Over the limit, yet OK: the limit and its window are still reported.
        assert_limited(resp.statuses[0], OK, 1, Unit.DAY, 0, name="trial")


def test_request_hits_addend_is_the_cost_of_each_descriptor(should_rate_limit):
    resp = should_rate_limit(
        rls_request(descriptor(("client", "frank")), descriptor(("client", "gina")), hits_addend=2)
    )
    assert [s.limit_remaining for s in resp.statuses] == [1, 1]
    resp = should_rate_limit(rls_request(descriptor(("client", "frank")), hits_addend=2))
    assert resp.overall_code == OVER_LIMIT
    assert_limited(resp.statuses[0], OVER_LIMIT, 3, Unit.DAY, 0)


def test_descriptor_hits_addend_overrides_the_request_and_zero_only_checks(should_rate_limit):
    def henry(addend):
        return descriptor(("client", "henry"), hits_addend=wrappers_pb2.UInt64Value(value=addend))

    # 0 checks without consuming, however often.
    for _ in range(3):
        resp = should_rate_limit(rls_request(henry(0)))
        assert_limited(resp.statuses[0], OK, 3, Unit.DAY, 3)
    # The descriptor's own cost wins over the request's.
    resp = should_rate_limit(rls_request(henry(2), hits_addend=3))
    assert_limited(resp.statuses[0], OK, 3, Unit.DAY, 1)
    resp = should_rate_limit(rls_request(henry(0), hits_addend=3))
    assert resp.overall_code == OK
    assert_limited(resp.statuses[0], OK, 3, Unit.DAY, 1)
    resp = should_rate_limit(rls_request(henry(2)))
    assert resp.overall_code == OVER_LIMIT
    assert_limited(resp.statuses[0], OVER_LIMIT, 3, Unit.DAY, 0)


def test_limit_override_is_used_instead_of_the_configuration(should_rate_limit):
    def limited(requests_per_unit, unit, *entries):
        override = ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(requests_per_unit=requests_per_unit, unit=unit)
        return descriptor(*entries, limit=override)

    # A key with no rule at all is limited by the override.
    adhoc = limited(2, ratelimit_unit_pb2.DAY, ("tenant", "acme"))
    for remaining in (1, 0):
        resp = should_rate_limit(rls_request(adhoc))
        assert resp.overall_code == OK
        assert_limited(resp.statuses[0], OK, 2, Unit.DAY, remaining)
    resp = should_rate_limit(rls_request(adhoc))
    assert resp.overall_code == OVER_LIMIT
    assert_limited(resp.statuses[0], OVER_LIMIT, 2, Unit.DAY, 0)

    # On a configured key the override replaces the configured limit (3 per day).
    resp = should_rate_limit(rls_request(limited(1, ratelimit_unit_pb2.YEAR, ("client", "ivan"))))
    assert resp.overall_code == OK
    assert_limited(resp.statuses[0], OK, 1, Unit.YEAR, 0, window_s=365 * DAY_S)


def test_limit_override_of_zero_rejects_every_hit(should_rate_limit):
    zero = descriptor(
        ("tenant", "closed"),
        limit=ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(requests_per_unit=0, unit=ratelimit_unit_pb2.DAY),
    )
    resp = should_rate_limit(rls_request(zero))
    assert resp.overall_code == OVER_LIMIT
    assert_limited(resp.statuses[0], OVER_LIMIT, 0, Unit.DAY, 0)


# UNKNOWN, then numbers outside envoy.type.v3.RateLimitUnit (7 is WEEK only in the response's Unit).
@pytest.mark.parametrize("unit", [ratelimit_unit_pb2.UNKNOWN, 7, 99], ids=["UNKNOWN", "7", "99"])
def test_limit_override_with_invalid_unit_is_invalid_argument(should_rate_limit, unit):
    bad = descriptor(
        ("tenant", "acme"),
        limit=ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(requests_per_unit=5, unit=unit),
    )
    with pytest.raises(grpc.RpcError) as err:
        should_rate_limit(rls_request(bad))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details()


def test_replaced_rule_is_neither_counted_nor_reported(should_rate_limit):
    # `region` names `team` in its replaces: when both match in one request, only `region` applies.
    for remaining in (9, 8):
        resp = should_rate_limit(rls_request(descriptor(("team", "red")), descriptor(("region", "eu"))))
        assert resp.overall_code == OK
        assert_no_rule(resp.statuses[0])
        assert_limited(resp.statuses[1], OK, 10, Unit.DAY, remaining, name="region")
    # Alone, `team` applies, and the replaced hits above were not counted.
    resp = should_rate_limit(rls_request(descriptor(("team", "red"))))
    assert_limited(resp.statuses[0], OK, 1, Unit.DAY, 0, name="team")


@pytest.mark.parametrize(
    "bad_request",
    [
        pytest.param(rls_request(descriptor(("client", "alice")), domain=""), id="empty-domain"),
        pytest.param(rls_request(), id="no-descriptors"),
        pytest.param(rls_request(descriptor(("client", "alice")), descriptor()), id="descriptor-without-entries"),
        pytest.param(rls_request(descriptor(("client", "alice"), ("", "x"))), id="empty-key"),
    ],
)
def test_malformed_request_is_invalid_argument(should_rate_limit, bad_request):
    with pytest.raises(grpc.RpcError) as err:
        should_rate_limit(bad_request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details(), "INVALID_ARGUMENT should say what is wrong"


def test_both_services_share_the_same_counters(envoy_rls, sluice_rls):
    jane = rls_request(descriptor(("client", "jane")))
    assert envoy_rls.ShouldRateLimit(jane, timeout=RPC_TIMEOUT_S).statuses[0].limit_remaining == 2
    assert sluice_rls.ShouldRateLimit(jane, timeout=RPC_TIMEOUT_S).statuses[0].limit_remaining == 1
    assert envoy_rls.ShouldRateLimit(jane, timeout=RPC_TIMEOUT_S).statuses[0].limit_remaining == 0


# --- GetRemaining ----------------------------------------------------------------------------------------------------


def test_get_remaining_reports_the_limit_without_consuming(get_remaining, envoy_rls):
    kim = descriptor(("client", "kim"))
    for _ in range(3):
        (report,) = get_remaining(kim)
        assert report.matched and not report.unlimited and not report.never
        assert report.limit.name == ""
        assert report.limit.requests_per_unit == 3
        assert report.limit.unit == Unit.DAY
        assert report.limit.unit_multiplier == 1
        assert report.limit.algorithm == "fixed_window"
        assert report.remaining == 3
        assert 0 < report.reset_after.ToTimedelta().total_seconds() <= DAY_S
        # A hit of cost 1 fits now.
        assert report.HasField("retry_after") and report.retry_after.ToTimedelta().total_seconds() == 0

    envoy_rls.ShouldRateLimit(rls_request(kim), timeout=RPC_TIMEOUT_S)
    (report,) = get_remaining(kim)
    assert report.remaining == 2
    (report,) = get_remaining(kim)
    assert report.remaining == 2


def test_get_remaining_answers_one_report_per_descriptor(get_remaining):
    reports = get_remaining(
        descriptor(("no-such-key", "x")),
        descriptor(("tier", "internal")),
        descriptor(("path", "/api/orders"), ("user", "lee")),
        descriptor(("batch", "nightly")),
    )
    assert len(reports) == 4
    unmatched, unlimited, nested, batch = reports

    assert not unmatched.matched and not unmatched.unlimited and not unmatched.HasField("limit")
    assert unlimited.matched and unlimited.unlimited and not unlimited.HasField("limit")

    assert nested.matched and not nested.unlimited
    assert (nested.limit.name, nested.limit.requests_per_unit, nested.limit.unit) == ("api-user", 2, Unit.YEAR)
    assert nested.remaining == 2

    # A two-day window: the multiplier is reported, and the reset can be up to two days away.
    assert batch.limit.unit == Unit.DAY and batch.limit.unit_multiplier == 2
    assert batch.limit.algorithm == "fixed_window"
    assert batch.remaining == 5
    assert 0 < batch.reset_after.ToTimedelta().total_seconds() <= 2 * DAY_S


def test_get_remaining_cost_above_the_limit_is_never_allowed(get_remaining):
    (report,) = get_remaining(descriptor(("client", "mia")), cost=4)
    assert report.matched
    assert report.never
    assert not report.HasField("retry_after")
    assert report.remaining == 3


def test_get_remaining_cost_that_does_not_fit_now_says_when(get_remaining, envoy_rls):
    nick = descriptor(("client", "nick"))
    envoy_rls.ShouldRateLimit(rls_request(nick, hits_addend=2), timeout=RPC_TIMEOUT_S)

    (fits,) = get_remaining(nick, cost=1)
    assert not fits.never and fits.retry_after.ToTimedelta().total_seconds() == 0

    (later,) = get_remaining(nick, cost=2)
    assert later.remaining == 1
    assert not later.never
    wait = later.retry_after.ToTimedelta().total_seconds()
    # A fixed window frees everything at its end: the wait is the time to the reset.
    assert 0 < wait <= DAY_S
    assert wait <= later.reset_after.ToTimedelta().total_seconds() + 1


def test_get_remaining_with_unknown_domain_matches_nothing(get_remaining):
    (report,) = get_remaining(descriptor(("client", "alice")), domain="nowhere")
    assert not report.matched and not report.HasField("limit")


def test_get_remaining_malformed_request_is_invalid_argument(get_remaining):
    with pytest.raises(grpc.RpcError) as err:
        get_remaining(domain=DOMAIN)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# --- gRPC health -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("service", ["", "envoy.service.ratelimit.v3.RateLimitService", "sluice.v1.RateLimiter"])
def test_grpc_health_reports_serving(channel, service):
    health = health_pb2_grpc.HealthStub(channel)
    resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
