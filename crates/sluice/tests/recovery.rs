//! Faults heal by themselves and stay as small as their cause, through the public gRPC and HTTP faces against real
//! `redis-server` processes: sluice started before its Redis (standalone, Sentinel, a cluster not yet created)
//! becomes ready on its own; a Redis frozen with SIGSTOP while clients give up before the store's timeout does not
//! latch the circuit breaker; one bad key fails only its own descriptor; a cached denial answers only for the limits
//! it was made under and never outlives a reload that was in flight.

use std::time::{Duration, Instant};

use sluice::breaker::BreakerSettings;
use sluice::limiter::LimiterSettings;
use sluice::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{Entry, RateLimitOverride};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice::proto::envoy::r#type::v3::RateLimitUnit;
use sluice::rules::{Algorithm, FailurePolicy};
use tonic::transport::Channel;

use crate::harness::{
    RedisCluster, RedisSentinel, RedisServer, ReplyGate, TestServer, counter_of, free_port, limiter_with,
    live_server_with, redis_store, rules,
};

const CONFIG: &str = "
domain: edge
failure_policy: fail_open
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: tight
    rate_limit: {unit: hour, requests_per_unit: 1}
";

fn request(entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: entries
            .iter()
            .map(|(k, v)| RateLimitDescriptor {
                entries: vec![Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                }],
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

async fn client(server: &TestServer) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(server.grpc_url())
        .await
        .expect("grpc connects")
}

/// One call with a deadline, as Envoy makes it.
async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    r: RateLimitRequest,
    deadline: Duration,
) -> Result<RateLimitResponse, tonic::Status> {
    let mut call = tonic::Request::new(r);
    call.set_timeout(deadline);
    client.should_rate_limit(call).await.map(|r| r.into_inner())
}

/// Polls `/readyz` until it answers 200, for at most `limit`; the time it took.
async fn ready_within(server: &TestServer, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if server.http_get("/readyz").await.0 == 200 {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Before the store is up: not ready, and calls answered by the failure policy (fail_open: OK, no limit applied).
async fn serves_by_policy_while_not_ready(server: &TestServer) {
    let (status, body) = server.http_get("/readyz").await;
    assert_eq!(status, 503, "not ready without a store: {body}");
    let mut c = client(server).await;
    let r = call(&mut c, request(&[("user", "early")]), Duration::from_secs(2))
        .await
        .expect("the failure policy answers");
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert!(
        r.statuses[0].current_limit.is_none(),
        "answered by fail_open, not by a counter"
    );
}

/// Once ready, decisions reach the store: a limit of one per hour admits one hit and denies the next.
async fn decides_with_the_store(server: &TestServer, value: &str) {
    let mut c = client(server).await;
    let first = call(&mut c, request(&[("tight", value)]), Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert!(first.statuses[0].current_limit.is_some(), "decided by a counter");
    let second = call(&mut c, request(&[("tight", value)]), Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(second.overall_code, Code::OverLimit as i32);
}

/// Starts sluice on `url` before its store exists, checks it serves by policy and says not ready, starts the store
/// with `start`, and checks it turns ready by itself within a few seconds and then decides with the store.
async fn becomes_ready_by_itself<T>(what: &str, url: &str, start: impl FnOnce() -> T) -> T {
    // The store's timeout bounds each call under the calls' deadline (2 s); a second, so that on a busy host a slow
    // call once the store is up is not answered by the failure policy.
    let server = live_server_with(url, CONFIG, Duration::from_secs(1), LimiterSettings::default()).await;
    serves_by_policy_while_not_ready(&server).await;
    let store = start();
    let took = ready_within(&server, Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("{what}: ready within a few seconds of the store coming up"));
    eprintln!("{what}: ready {took:?} after the store came up");
    for i in 0..12 {
        decides_with_the_store(&server, &format!("{what}{i}")).await;
    }
    server.shutdown().await;
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_before_its_redis_it_becomes_ready_by_itself() {
    let port = free_port();
    becomes_ready_by_itself("standalone", &format!("redis://127.0.0.1:{port}"), || {
        RedisServer::start_on(port)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_before_its_sentinel_it_becomes_ready_by_itself() {
    let ports = RedisSentinel::ports();
    becomes_ready_by_itself("sentinel", &RedisSentinel::url_for(ports.2), || {
        RedisSentinel::start_on(ports)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_before_its_cluster_is_created_it_becomes_ready_by_itself() {
    let cluster = RedisCluster::unformed();
    becomes_ready_by_itself("cluster", &cluster.url(), || cluster.create()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_give_up_while_redis_is_frozen_never_latch_the_breaker() {
    let redis = RedisServer::start();
    let cooldown = Duration::from_millis(500);
    let settings = LimiterSettings {
        breaker: BreakerSettings { failures: 2, cooldown },
        ..LimiterSettings::default()
    };
    // Envoy's default deadline (20 ms) in front of a store timeout of 100 ms.
    let server = live_server_with(&redis.url(), CONFIG, Duration::from_millis(100), settings).await;
    let mut c = client(&server).await;
    decides_with_the_store(&server, "before").await;

    redis.pause();
    let frozen = Instant::now();
    let mut gave_up = 0;
    // Long enough for the breaker to open and for several probes to be abandoned by their clients.
    while frozen.elapsed() < cooldown * 4 {
        if let Err(status) = call(&mut c, request(&[("user", "u")]), Duration::from_millis(20)).await {
            assert!(
                matches!(status.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled),
                "{status:?}"
            );
            gave_up += 1;
        }
    }
    let (status, _) = server.http_get("/readyz").await;
    assert_eq!(status, 503, "never ready while no decision can reach the store");
    redis.resume();
    let resumed = Instant::now();

    let mut recovered = None;
    while resumed.elapsed() < cooldown + Duration::from_secs(1) {
        let r = call(&mut c, request(&[("tight", "after")]), Duration::from_millis(20)).await;
        if r.is_ok_and(|r| r.statuses[0].current_limit.is_some()) {
            recovered = Some(resumed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovered = recovered.expect("decisions reach the store again within the cooldown plus one second");
    eprintln!("frozen redis: {gave_up} calls abandoned; recovered {recovered:?} after SIGCONT");
    assert!(gave_up > 5, "clients gave up while Redis was frozen");
    assert!(
        ready_within(&server, Duration::from_secs(2)).await.is_some(),
        "ready again"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_key_fails_only_its_own_descriptor() {
    let redis = RedisServer::start();
    let server = live_server_with(
        &redis.url(),
        CONFIG,
        Duration::from_millis(500),
        LimiterSettings::default(),
    )
    .await;
    let mut c = client(&server).await;
    // Create the counters, then turn `user=bad`'s into a list: its script call fails with WRONGTYPE.
    call(&mut c, request(&[("user", "bad")]), Duration::from_secs(2))
        .await
        .unwrap();
    let keys = redis.cli(&["--raw", "KEYS", "*"]);
    let bad = keys
        .lines()
        .find(|k| {
            k.starts_with(&counter_of(
                "sluice:",
                "edge",
                &[("user", "bad")],
                Algorithm::FixedWindow,
                3_600_000_000,
            ))
        })
        .expect("the counter of user=bad");
    redis.cli(&["DEL", bad]);
    redis.cli(&["LPUSH", bad, "not a counter"]);
    call(&mut c, request(&[("tight", "n")]), Duration::from_secs(2))
        .await
        .unwrap();

    let r = call(
        &mut c,
        request(&[("user", "bad"), ("tight", "n"), ("user", "good")]),
        Duration::from_secs(2),
    )
    .await
    .expect("fail_open answers for the bad descriptor alone");
    assert!(
        r.statuses[0].current_limit.is_none(),
        "the bad key gets the failure policy"
    );
    assert_eq!(
        r.statuses[1].code,
        Code::OverLimit as i32,
        "its over-limit neighbour stays over the limit"
    );
    assert_eq!(r.statuses[2].code, Code::Ok as i32);
    assert!(
        r.statuses[2].current_limit.is_some(),
        "its good neighbour is decided by its counter"
    );
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    server.shutdown().await;
}

fn overridden(value: &str, requests_per_unit: u32) -> RateLimitRequest {
    let mut r = request(&[("user", value)]);
    r.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit,
        unit: RateLimitUnit::Hour as i32,
    });
    r
}

#[tokio::test]
async fn an_override_denial_never_answers_for_the_configured_limit() {
    let redis = RedisServer::start();
    let (l, _) = limiter_with(CONFIG, redis_store(&redis.url()).await, LimiterSettings::default());
    let server = TestServer::start(l).await;
    let mut c = client(&server).await;
    let deadline = Duration::from_secs(2);
    // The override (1 per hour) and the configured limit (1000 per hour) count on the same counter.
    assert_eq!(
        call(&mut c, overridden("o", 1), deadline).await.unwrap().overall_code,
        Code::Ok as i32
    );
    assert_eq!(
        call(&mut c, overridden("o", 1), deadline).await.unwrap().overall_code,
        Code::OverLimit as i32
    );
    let r = call(&mut c, request(&[("user", "o")]), deadline).await.unwrap();
    assert_eq!(
        r.overall_code,
        Code::Ok as i32,
        "the configured limit is not shadowed by the override's denial"
    );
    assert_eq!(r.statuses[0].limit_remaining, 1000 - 3);
    assert_eq!(
        call(&mut c, overridden("o", 1), deadline).await.unwrap().overall_code,
        Code::OverLimit as i32,
        "the override's own limit still denies"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_in_flight_across_a_reload_is_not_kept() {
    let redis = RedisServer::start();
    let gate = ReplyGate::start(redis.port).await;
    let settings = LimiterSettings {
        failure_policy: FailurePolicy::Error,
        ..LimiterSettings::default()
    };
    let (l, _) = limiter_with(CONFIG, redis_store(&gate.url()).await, settings);
    let server = TestServer::start(l.clone()).await;
    let mut c = client(&server).await;
    let deadline = Duration::from_secs(5);
    assert_eq!(
        call(&mut c, request(&[("tight", "t")]), deadline)
            .await
            .unwrap()
            .overall_code,
        Code::Ok as i32
    );
    // The denial is on its way back when the limit is raised: the call counted from what Redis had run before it
    // (the first call's loading of the script included), and waited for as long as a busy host takes.
    let before = crate::harness::script_calls(redis.port);
    gate.hold();
    let mut held = c.clone();
    let pending =
        tokio::spawn(async move { call(&mut held, request(&[("tight", "t")]), Duration::from_secs(30)).await });
    let sent = crate::harness::poll_until(Duration::from_secs(20), || {
        crate::harness::script_calls(redis.port) > before
    });
    assert!(sent, "the second call reached Redis");
    let metrics = l.metrics().clone();
    l.reload(rules(
        &CONFIG.replace("requests_per_unit: 1}", "requests_per_unit: 10}"),
        &metrics,
    ));
    gate.release();
    let denied = pending.await.unwrap().expect("the call in flight is answered");
    assert_eq!(
        denied.overall_code,
        Code::OverLimit as i32,
        "decided under the old limit"
    );
    let r = call(&mut c, request(&[("tight", "t")]), deadline).await.unwrap();
    assert_eq!(
        r.overall_code,
        Code::Ok as i32,
        "the raised limit is not shadowed by the stale denial"
    );
    server.shutdown().await;
}
