//! The services over real gRPC and HTTP, backed by a real Redis: round trips, read-only GetRemaining, errors on
//! the wire, store failures, script reloads, health and shutdown; the caps on every RPC, Reset's care for queued
//! work, and metrics that client-chosen text cannot grow.

use std::sync::Arc;
use std::time::Duration;

use sluice::proto::envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry};
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::sluice::v1::GetRemainingRequest;
use sluice::proto::sluice::v1::rate_limiter_client::RateLimiterClient;
use tonic::Code as GrpcCode;

use sluice::limiter::{Caps, Limiter, LimiterSettings};
use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use sluice::proto::sluice::v1::{ReleaseRequest, ResetRequest};
use sluice::rules::Algorithm;
use sluice::store::Store;
use sluice::store::redis::RedisStore;

use crate::harness::{
    RedisServer, ReplyGate, TestServer, counter_of, limiter, limiter_with, memory, redis_store, redis_store_with,
};

const CONFIG: &str = "
domain: edge
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: b
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: c
    rate_limit: {unit: minute, requests_per_unit: 5}
";

fn descriptor(key: &str, value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        ..Default::default()
    }
}

fn three() -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![descriptor("a", "1"), descriptor("b", "2"), descriptor("c", "3")],
        hits_addend: 0,
    }
}

async fn envoy_client(server: &TestServer) -> RateLimitServiceClient<tonic::transport::Channel> {
    RateLimitServiceClient::connect(server.grpc_url())
        .await
        .expect("connects")
}

fn script_calls(redis: &RedisServer) -> u64 {
    sluice_testkit::script_calls(redis.port)
}

/// Waits (a bounded poll of `INFO commandstats`, not a time window) until Redis has run `n` script calls since
/// `since`. The bound, 30 s, only stops a hang: a busy host can be slow to send a call.
async fn wait_for_script_calls(redis: &RedisServer, since: u64, n: u64) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let sent = script_calls(redis) - since;
        if sent >= n || std::time::Instant::now() > deadline {
            return sent;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A server whose Redis store (one connection, `timeout` per call) reaches Redis through a [`ReplyGate`].
async fn gated_server(timeout: Duration) -> (RedisServer, ReplyGate, TestServer) {
    let (redis, gate, server, _) = gated_server_and_limiter(timeout).await;
    (redis, gate, server)
}

/// [`gated_server`], and its limiter, whose store can be asked what waits in it.
async fn gated_server_and_limiter(timeout: Duration) -> (RedisServer, ReplyGate, TestServer, Arc<Limiter<RedisStore>>) {
    let redis = RedisServer::start();
    let gate = ReplyGate::start(redis.port).await;
    let (l, _) = limiter(CONFIG, redis_store_with(&gate.url(), timeout).await);
    let server = TestServer::start(l.clone()).await;
    (redis, gate, server, l)
}

#[tokio::test]
async fn three_descriptors_cost_one_round_trip_and_one_script_call() {
    let (redis, gate, server) = gated_server(Duration::from_secs(10)).await;
    let mut client = envoy_client(&server).await;
    // The first call loads the script (NOSCRIPT, SCRIPT LOAD, retry); measure a steady-state call.
    client.should_rate_limit(three()).await.unwrap();
    let calls = script_calls(&redis);

    // Hold every reply back: the request is decided by the one script call that reached Redis before any reply.
    gate.hold();
    let call = tokio::spawn(async move { client.should_rate_limit(three()).await });
    assert_eq!(
        wait_for_script_calls(&redis, calls, 1).await,
        1,
        "the script call reached Redis before any reply"
    );
    gate.release();
    let response = call.await.unwrap().unwrap().into_inner();
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert_eq!(
        response.statuses.iter().map(|s| s.limit_remaining).collect::<Vec<_>>(),
        [3, 3, 3]
    );
    assert_eq!(
        script_calls(&redis) - calls,
        1,
        "one script call for the request's three counters, nothing else"
    );
    for (key, _, ttl) in redis.snapshot() {
        assert!(ttl > 0, "{key} has no TTL");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn concurrent_requests_share_a_script_call() {
    let (redis, gate, server, l) = gated_server_and_limiter(Duration::from_secs(10)).await;
    let client = envoy_client(&server).await;
    let request = |value: usize| RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![descriptor("a", &value.to_string())],
        hits_addend: 0,
    };
    client.clone().should_rate_limit(request(0)).await.unwrap();
    // A counter of the wrong type fails its own request, not the others that share its call.
    client.clone().should_rate_limit(request(5)).await.unwrap();
    let poisoned = redis
        .snapshot()
        .into_iter()
        .map(|(key, _, _)| key)
        .find(|key| {
            key.starts_with(&counter_of(
                "sluice:",
                "edge",
                &[("a", "5")],
                Algorithm::FixedWindow,
                3_600_000_000,
            ))
        })
        .expect("the counter of a=5");
    redis.cli(&["DEL", &poisoned]);
    redis.cli(&["LPUSH", &poisoned, "x"]);
    let calls = script_calls(&redis);

    // Two calls may be in flight (the store's pool has one connection): hold their replies, so that the six requests
    // sent next wait together for the next call.
    gate.hold();
    let send = |value: usize| {
        let mut client = client.clone();
        tokio::spawn(async move { client.should_rate_limit(request(value)).await })
    };
    let mut answers = Vec::new();
    for value in 1..=2 {
        answers.push(send(value));
        assert_eq!(
            wait_for_script_calls(&redis, calls, value as u64).await,
            value as u64,
            "a free call goes out at once"
        );
    }
    answers.extend((3..=8).map(send));
    // Wait until the six requests are in the store's queue; nothing can leave it while both calls are held.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while l.store().waiting() < 6 {
        assert!(
            std::time::Instant::now() < deadline,
            "the six requests reach the store's queue"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        script_calls(&redis) - calls,
        2,
        "nothing else went out while both calls were in flight"
    );
    gate.release();
    for (value, answer) in (1..=8).zip(answers) {
        let answer = answer.await.unwrap();
        if value == 5 {
            assert_eq!(
                answer.unwrap_err().code(),
                GrpcCode::Unavailable,
                "a=5 has a list for a counter"
            );
            continue;
        }
        let response = answer.unwrap().into_inner();
        assert_eq!(response.overall_code, Code::Ok as i32, "a={value}");
        assert_eq!(response.statuses[0].limit_remaining, 4, "a={value}");
    }
    assert_eq!(
        script_calls(&redis) - calls,
        3,
        "the six waiting requests were decided by one script call"
    );
    let keys: Vec<String> = redis.snapshot().into_iter().map(|(key, _, _)| key).collect();
    assert_eq!(keys.len(), 9, "one key per descriptor value: {keys:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn requests_waiting_for_a_call_fail_within_the_timeouts_when_redis_hangs() {
    // A second: long beside the time a busy host takes to send 300 requests, so that three timeouts (3.5 s with
    // room) and the seven rounds of a queue sent in turn (7 s) stay apart however busy the host.
    let timeout = Duration::from_secs(1);
    let (redis, gate, server) = gated_server(timeout).await;
    let client = envoy_client(&server).await;
    client.clone().should_rate_limit(three()).await.unwrap();

    // Redis stops answering: two calls go out and hang, and 300 requests (900 descriptors) queue behind them. Each
    // round of two calls takes 128 descriptors and hangs for a timeout, so sent in turn the queue would take seven
    // rounds; the requests that have waited a timeout fail instead of going out.
    gate.hold();
    let calls = script_calls(&redis);
    let mut answers = Vec::new();
    for n in 1..=2 {
        let mut client = client.clone();
        answers.push(tokio::spawn(async move { client.should_rate_limit(three()).await }));
        assert_eq!(wait_for_script_calls(&redis, calls, n).await, n);
    }
    // Timed from when both calls are known to hang, not from the polls that saw them go out (slow on a busy host).
    let started = std::time::Instant::now();
    for _ in 0..300 {
        let mut client = client.clone();
        answers.push(tokio::spawn(async move { client.should_rate_limit(three()).await }));
    }
    for answer in answers {
        assert_eq!(answer.await.unwrap().unwrap_err().code(), GrpcCode::Unavailable);
    }
    assert!(
        started.elapsed() < 3 * timeout + Duration::from_millis(500),
        "every request failed within three timeouts: {:?}",
        started.elapsed()
    );
    gate.release();
    server.shutdown().await;
}

#[tokio::test]
async fn get_remaining_leaves_redis_unchanged() {
    let redis = RedisServer::start();
    let (l, _) = limiter(CONFIG, redis_store(&redis.url()).await);
    let server = TestServer::start(l).await;
    let mut envoy = envoy_client(&server).await;
    envoy.should_rate_limit(three()).await.unwrap();
    let before = redis.snapshot();
    assert_eq!(before.len(), 3);
    let mut client = RateLimiterClient::connect(server.grpc_url()).await.unwrap();
    let request = GetRemainingRequest {
        domain: "edge".into(),
        descriptors: vec![
            descriptor("a", "1"),
            descriptor("b", "2"),
            descriptor("c", "3"),
            descriptor("a", "new"),
        ],
        cost: Some(2),
    };
    let answer = client.get_remaining(request).await.unwrap().into_inner();
    assert_eq!(answer.descriptors.len(), 4);
    assert!(answer.descriptors.iter().all(|d| d.matched));
    assert_eq!(answer.descriptors[0].remaining, 4);
    assert_eq!(answer.descriptors[3].remaining, 5);
    assert_eq!(answer.descriptors[0].limit.as_ref().unwrap().algorithm, "fixed_window");
    let after = redis.snapshot();
    // TTLs tick down in real time between the two snapshots; compare keys and values exactly and TTLs to within
    // the time taken, never above what they were.
    assert_eq!(
        before.iter().map(|(k, v, _)| (k, v)).collect::<Vec<_>>(),
        after.iter().map(|(k, v, _)| (k, v)).collect::<Vec<_>>(),
        "no key created or changed"
    );
    for ((k, _, t0), (_, _, t1)) in before.iter().zip(&after) {
        assert!(t1 <= t0 && t0 - t1 < 2_000, "{k}: TTL {t0} -> {t1}");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn bad_requests_are_invalid_argument_on_the_wire() {
    let (l, _) = limiter(CONFIG, memory());
    let server = TestServer::start(l).await;
    let mut client = envoy_client(&server).await;
    let mut no_key = three();
    no_key.descriptors[1].entries[0].key.clear();
    let mut bad_override = three();
    bad_override.descriptors[0].limit = Some(Default::default());
    let cases = [
        (
            RateLimitRequest {
                domain: String::new(),
                ..three()
            },
            "domain is empty",
        ),
        (
            RateLimitRequest {
                descriptors: vec![],
                ..three()
            },
            "no descriptors",
        ),
        (no_key, "descriptors[1].entries[0].key is empty"),
        (bad_override, "descriptors[0].limit.unit 0 is not a valid unit"),
    ];
    for (request, want) in cases {
        let status = client.should_rate_limit(request).await.unwrap_err();
        assert_eq!(status.code(), GrpcCode::InvalidArgument);
        assert!(status.message().contains(want), "{}", status.message());
    }
    server.shutdown().await;
}

#[tokio::test]
async fn store_failures_are_unavailable_and_scripts_reload() {
    let redis = RedisServer::start();
    let port = redis.port;
    let (l, _) = limiter(CONFIG, redis_store_with(&redis.url(), Duration::from_millis(200)).await);
    let server = TestServer::start(l).await;
    let mut client = envoy_client(&server).await;
    client.should_rate_limit(three()).await.unwrap();
    assert_eq!(server.http_get("/readyz").await.0, 200);

    // Scripts flushed: the next call reloads and succeeds.
    redis.flush_scripts();
    let response = client.should_rate_limit(three()).await.unwrap().into_inner();
    assert_eq!(response.statuses[0].limit_remaining, 3);

    // Redis gone: UNAVAILABLE within the timeout, and not ready.
    redis.stop();
    let started = std::time::Instant::now();
    let status = client.should_rate_limit(three()).await.unwrap_err();
    assert_eq!(status.code(), GrpcCode::Unavailable);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "bounded by the store timeout"
    );
    let (code, body) = server.http_get("/readyz").await;
    assert_eq!(code, 503, "{body}");

    // Redis back on the same port (empty, no scripts): ready again, answers again.
    let redis = RedisServer::start_on(port);
    let mut ready = false;
    for _ in 0..100 {
        if server.http_get("/readyz").await.0 == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "ready again once Redis is back");
    let response = client.should_rate_limit(three()).await.unwrap().into_inner();
    assert_eq!(
        response.statuses[0].limit_remaining, 4,
        "a fresh Redis starts from zero"
    );
    let text = server.http_get("/metrics").await.1;
    assert!(text.contains(r#"sluice_store_errors_total{store="redis""#), "{text}");
    assert!(
        text.contains(r#"sluice_requests_total{domain="edge",rpc="should_rate_limit",result="unavailable"} 1"#),
        "{text}"
    );
    drop(redis);
    server.shutdown().await;
}

#[tokio::test]
async fn health_metrics_and_graceful_shutdown() {
    let (l, _) = limiter(CONFIG, memory());
    let server = TestServer::start(l).await;
    let mut client = envoy_client(&server).await;
    let response = client.should_rate_limit(three()).await.unwrap().into_inner();
    assert_eq!(response.overall_code, Code::Ok as i32);
    let status = &response.statuses[0];
    assert_eq!(status.current_limit.as_ref().unwrap().requests_per_unit, 5);
    assert_eq!(status.limit_remaining, 4);
    assert!(status.duration_until_reset.as_ref().unwrap().seconds >= 1);

    assert_eq!(server.http_get("/healthz").await.0, 200);
    assert_eq!(server.http_get("/readyz").await.0, 200);
    let (code, text) = server.http_get("/metrics").await;
    assert_eq!(code, 200);
    assert!(
        text.contains(r#"sluice_rule_hits_total{domain="edge",rule="edge.a"} 1"#),
        "{text}"
    );

    let channel = tonic::transport::Channel::from_shared(server.grpc_url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in [
        "",
        "envoy.service.ratelimit.v3.RateLimitService",
        "sluice.v1.RateLimiter",
    ] {
        let answer = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            answer.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
    }
    // Shutdown with a client connection open still returns within the grace period.
    tokio::time::timeout(Duration::from_secs(5), server.shutdown())
        .await
        .expect("drains and stops");
}

/// Calls are routed by the service their path names: each service answers its own methods, and a call to a service
/// or a method not served is answered UNIMPLEMENTED.
#[tokio::test]
async fn calls_reach_the_service_they_name() {
    use tokio_stream::StreamExt as _;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let (l, _) = limiter(CONFIG, memory());
    let server = TestServer::start(l).await;
    let channel = tonic::transport::Channel::from_shared(server.grpc_url())
        .unwrap()
        .connect()
        .await
        .unwrap();

    let response = RateLimitServiceClient::new(channel.clone())
        .should_rate_limit(three())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.overall_code, Code::Ok as i32);
    let remaining = RateLimiterClient::new(channel.clone())
        .get_remaining(GetRemainingRequest {
            domain: "edge".into(),
            descriptors: vec![descriptor("a", "1")],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(remaining.descriptors[0].remaining, 4);

    let mut reflection = ServerReflectionClient::new(channel.clone());
    let list = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter([list]))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(services)) = answers.next().await.unwrap().unwrap().message_response
    else {
        panic!("reflection answers a list of services");
    };
    let names: Vec<_> = services.service.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService"),
        "{names:?}"
    );
    assert!(names.contains(&"sluice.v1.RateLimiter"), "{names:?}");

    // A service not served, a method its service lacks, and a path with no method.
    for path in [
        "/no.such.Service/Call",
        "/envoy.service.ratelimit.v3.RateLimitService/NoSuchMethod",
        "/envoy.service.ratelimit.v3.RateLimitService/",
    ] {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<RateLimitRequest, RateLimitRequest>::default();
        let answer = grpc
            .unary(
                tonic::Request::new(three()),
                http::uri::PathAndQuery::from_static(path),
                codec,
            )
            .await;
        assert_eq!(answer.unwrap_err().code(), GrpcCode::Unimplemented, "{path}");
    }
    server.shutdown().await;
}

const ALGORITHMS: &str = "
domain: jobs
descriptors:
  - key: job
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: concurrency}
  - key: work
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: queue}
";

fn jobs(key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "jobs".into(),
        descriptors: vec![descriptor(key, value)],
        hits_addend: 0,
    }
}

/// `dynamic_metadata.sluice.<field>` as a string.
fn sluice_field(
    response: &sluice::proto::envoy::service::ratelimit::v3::RateLimitResponse,
    field: &str,
) -> Option<String> {
    use prost_types::value::Kind;
    let sluice = response.dynamic_metadata.as_ref()?.fields.get("sluice")?;
    let Some(Kind::StructValue(s)) = &sluice.kind else {
        return None;
    };
    match &s.fields.get(field)?.kind {
        Some(Kind::StringValue(v)) => Some(v.clone()),
        Some(Kind::ListValue(l)) => Some(format!("{} entries", l.values.len())),
        _ => None,
    }
}

#[tokio::test]
async fn leases_travel_in_metadata_and_release_and_reset_work_over_grpc() {
    let redis = RedisServer::start();
    let (l, _) = limiter(ALGORITHMS, redis_store(&redis.url()).await);
    let server = TestServer::start(l).await;
    let mut envoy = envoy_client(&server).await;
    let mut client = RateLimiterClient::connect(server.grpc_url()).await.unwrap();

    let first = envoy
        .should_rate_limit(jobs("job", "build"))
        .await
        .unwrap()
        .into_inner();
    let lease = sluice_field(&first, "lease_id").expect("lease id in dynamic_metadata");
    let second = client
        .should_rate_limit(jobs("job", "build"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.overall_code, Code::OverLimit as i32, "one job in flight");
    let release = |lease: &str| sluice::proto::sluice::v1::ReleaseRequest {
        domain: "jobs".into(),
        descriptors: vec![descriptor("job", "build")],
        lease_id: lease.into(),
    };
    assert_eq!(client.release(release(&lease)).await.unwrap().into_inner().released, 1);
    assert_eq!(client.release(release(&lease)).await.unwrap().into_inner().released, 0);
    let status = client.release(release("")).await.unwrap_err();
    assert_eq!(status.code(), GrpcCode::InvalidArgument);
    let third = envoy
        .should_rate_limit(jobs("job", "build"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(third.overall_code, Code::Ok as i32, "the released place is free again");

    let queued = envoy.should_rate_limit(jobs("work", "w")).await.unwrap().into_inner();
    assert_eq!(sluice_field(&queued, "queued").as_deref(), Some("1 entries"));
    let stream = redis
        .snapshot()
        .into_iter()
        .find(|(k, _, _)| k.ends_with("|queue/3600"))
        .expect("a stream");
    assert!(redis.cli(&["XLEN", &stream.0]).contains('1'));

    // Reset: refused without the admin token, done with it, and only for the given descriptors.
    let reset = || sluice::proto::sluice::v1::ResetRequest {
        domain: "jobs".into(),
        descriptors: vec![descriptor("job", "build")],
        ..Default::default()
    };
    let status = client.reset(reset()).await.unwrap_err();
    assert_eq!(status.code(), GrpcCode::Unauthenticated);
    let mut wrong = tonic::Request::new(reset());
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer nope".parse().unwrap());
    assert_eq!(client.reset(wrong).await.unwrap_err().code(), GrpcCode::Unauthenticated);
    let mut authorized = tonic::Request::new(reset());
    let bearer = format!("Bearer {}", crate::harness::ADMIN_TOKEN);
    authorized
        .metadata_mut()
        .insert("authorization", bearer.parse().unwrap());
    assert_eq!(client.reset(authorized).await.unwrap().into_inner().deleted, 1);
    assert_eq!(redis.snapshot().len(), 1, "the queue's stream is untouched");
    server.shutdown().await;
}

#[tokio::test]
async fn reset_is_disabled_without_an_admin_token() {
    let (l, _) = limiter(ALGORITHMS, memory());
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", grpc.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let options = sluice::server::ServeOptions::default();
        sluice::server::serve(l, grpc, http, async { drop(stopped.await) }, &options).await
    });
    let mut client = RateLimiterClient::connect(url).await.unwrap();
    let mut request = tonic::Request::new(sluice::proto::sluice::v1::ResetRequest {
        domain: "jobs".into(),
        descriptors: vec![descriptor("job", "x")],
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("authorization", "Bearer anything".parse().unwrap());
    assert_eq!(
        client.reset(request).await.unwrap_err().code(),
        GrpcCode::PermissionDenied
    );
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// `message` with the admin token Reset needs.
fn admin<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let bearer = format!("Bearer {}", crate::harness::ADMIN_TOKEN);
    request.metadata_mut().insert("authorization", bearer.parse().unwrap());
    request
}

/// Asserts that `status` is INVALID_ARGUMENT naming `cap`.
fn refused_by(status: tonic::Status, cap: &str) {
    assert_eq!(status.code(), GrpcCode::InvalidArgument, "{status:?}");
    assert!(status.message().contains(cap), "names {cap}: {status:?}");
}

#[tokio::test]
async fn release_and_reset_are_held_to_the_caps() {
    let settings = LimiterSettings {
        caps: Caps {
            max_descriptors: 2,
            max_value_bytes: 64,
            max_request_bytes: 512,
            ..Caps::default()
        },
        ..LimiterSettings::default()
    };
    let (l, _) = limiter_with(ALGORITHMS, memory(), settings);
    let server = TestServer::start(l).await;
    let mut client = RateLimiterClient::connect(server.grpc_url()).await.unwrap();
    // Two descriptors of eight 60-byte entries each: within every other cap, over 512 bytes.
    let wide = || {
        let entries = (0..8)
            .map(|i| Entry {
                key: format!("k{i}"),
                value: "v".repeat(60),
            })
            .collect::<Vec<_>>();
        vec![
            RateLimitDescriptor {
                entries: entries.clone(),
                ..Default::default()
            },
            RateLimitDescriptor {
                entries,
                ..Default::default()
            },
        ]
    };
    let release = |descriptors: Vec<RateLimitDescriptor>, lease: String| ReleaseRequest {
        domain: "jobs".into(),
        descriptors,
        lease_id: lease,
    };

    let at_cap = client
        .release(release(vec![descriptor("job", "x")], "l".repeat(64)))
        .await
        .unwrap();
    assert_eq!(at_cap.into_inner().released, 0, "a lease id at the cap is looked up");
    let over = client.release(release(vec![descriptor("job", "x")], "l".repeat(65)));
    refused_by(over.await.unwrap_err(), "--max-value-bytes");
    let three = vec![descriptor("job", "x"); 3];
    refused_by(
        client.release(release(three.clone(), "l".into())).await.unwrap_err(),
        "--max-descriptors",
    );
    refused_by(
        client.release(release(wide(), "l".into())).await.unwrap_err(),
        "--max-request-bytes",
    );

    let reset = |descriptors: Vec<RateLimitDescriptor>| {
        admin(ResetRequest {
            domain: "jobs".into(),
            descriptors,
            ..Default::default()
        })
    };
    refused_by(client.reset(reset(three)).await.unwrap_err(), "--max-descriptors");
    refused_by(client.reset(reset(wide())).await.unwrap_err(), "--max-request-bytes");
    assert_eq!(
        client
            .reset(reset(vec![descriptor("job", "x")]))
            .await
            .unwrap()
            .into_inner()
            .deleted,
        0
    );
    server.shutdown().await;
}

/// The stream a ShouldRateLimit answer says its `queue` entry went to.
fn queued_stream(response: &sluice::proto::envoy::service::ratelimit::v3::RateLimitResponse) -> Option<String> {
    use prost_types::value::Kind;
    let sluice = response.dynamic_metadata.as_ref()?.fields.get("sluice")?;
    let Some(Kind::StructValue(s)) = &sluice.kind else {
        return None;
    };
    let Some(Kind::ListValue(queued)) = &s.fields.get("queued")?.kind else {
        return None;
    };
    let Some(Kind::StructValue(entry)) = &queued.values.first()?.kind else {
        return None;
    };
    match &entry.fields.get("stream")?.kind {
        Some(Kind::StringValue(stream)) => Some(stream.clone()),
        _ => None,
    }
}

/// Queues one entry, then: Reset keeps the stream (and names it) while the entry waits; `drop_queued_work` deletes
/// it. Returns the server and the stream's key, with one entry queued again.
async fn reset_keeps_queued_work_unless_asked(store: impl Store) -> (TestServer, String) {
    let (l, _) = limiter(ALGORITHMS, store);
    let server = TestServer::start(l).await;
    let mut envoy = envoy_client(&server).await;
    let mut client = RateLimiterClient::connect(server.grpc_url()).await.unwrap();
    let queued = envoy.should_rate_limit(jobs("work", "w")).await.unwrap().into_inner();
    let stream = queued_stream(&queued).expect("the queue's stream in the answer");
    let reset = |drop_queued_work: bool| {
        admin(ResetRequest {
            domain: "jobs".into(),
            descriptors: vec![descriptor("work", "w")],
            drop_queued_work,
        })
    };
    let remaining = || GetRemainingRequest {
        domain: "jobs".into(),
        descriptors: vec![descriptor("work", "w")],
        cost: None,
    };

    let kept = client.reset(reset(false)).await.unwrap().into_inner();
    assert_eq!((kept.deleted, kept.kept_streams), (0, vec![stream.clone()]));
    let left = client.get_remaining(remaining()).await.unwrap().into_inner();
    assert_eq!(left.descriptors[0].remaining, 4, "the entry still waits");

    let dropped = client.reset(reset(true)).await.unwrap().into_inner();
    assert_eq!((dropped.deleted, dropped.kept_streams), (1, vec![]));
    let left = client.get_remaining(remaining()).await.unwrap().into_inner();
    assert_eq!(
        left.descriptors[0].remaining, 5,
        "asked to, Reset drops the waiting entry"
    );

    envoy.should_rate_limit(jobs("work", "w")).await.unwrap();
    (server, stream)
}

#[tokio::test]
async fn reset_keeps_queued_work_unless_asked_in_memory() {
    let (server, _) = reset_keeps_queued_work_unless_asked(memory()).await;
    server.shutdown().await;
}

#[tokio::test]
async fn reset_keeps_queued_work_unless_asked_in_redis() {
    let redis = RedisServer::start();
    let (server, stream) = reset_keeps_queued_work_unless_asked(redis_store(&redis.url()).await).await;
    // Once a worker has taken the entry off, the empty stream is reset without asking.
    let entries = redis.cli(&["--raw", "XRANGE", &stream, "-", "+"]);
    let id = entries.lines().next().expect("one entry").to_string();
    assert_eq!(redis.cli(&["XDEL", &stream, &id]).trim(), "(integer) 1");
    let mut client = RateLimiterClient::connect(server.grpc_url()).await.unwrap();
    let done = client
        .reset(admin(ResetRequest {
            domain: "jobs".into(),
            descriptors: vec![descriptor("work", "w")],
            drop_queued_work: false,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((done.deleted, done.kept_streams), (1, vec![]));
    assert_eq!(redis.cli(&["EXISTS", &stream]).trim(), "(integer) 0");
    server.shutdown().await;
}

/// Series in a Prometheus exposition.
fn series(metrics: &str) -> usize {
    metrics.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).count()
}

#[tokio::test]
async fn client_chosen_text_never_grows_the_metrics() {
    let (l, _) = limiter(CONFIG, memory());
    let server = TestServer::start(l).await;
    let mut envoy = envoy_client(&server).await;
    let mut client = RateLimiterClient::connect(server.grpc_url()).await.unwrap();
    let round = |i: usize| {
        let override_descriptor = RateLimitDescriptor {
            entries: vec![Entry {
                key: format!("override-key-{i}"),
                value: format!("v{i}"),
            }],
            limit: Some(RateLimitOverride {
                requests_per_unit: 1_000,
                unit: 1,
            }),
            ..Default::default()
        };
        let known = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![
                override_descriptor,
                descriptor(&format!("unknown-key-{i}"), "v"),
                descriptor("a", &format!("value-{i}")),
            ],
            hits_addend: 0,
        };
        let unknown_domain = RateLimitRequest {
            domain: format!("unknown-domain-{i}"),
            descriptors: vec![descriptor(&format!("k{i}"), "v")],
            hits_addend: 0,
        };
        let invalid = RateLimitRequest {
            domain: format!("invalid-{i}"),
            descriptors: vec![descriptor("", &format!("v{i}"))],
            hits_addend: 0,
        };
        let bad_unit = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: format!("bad-unit-{i}"),
                    value: "v".into(),
                }],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 1,
                    unit: 99,
                }),
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let remaining = GetRemainingRequest {
            domain: format!("remaining-{i}"),
            descriptors: vec![descriptor(&format!("r{i}"), "v")],
            cost: None,
        };
        (known, unknown_domain, invalid, bad_unit, remaining)
    };
    let mut sizes = Vec::new();
    for (from, to) in [(0, 10), (10, 2_000)] {
        for i in from..to {
            let (known, unknown_domain, invalid, bad_unit, remaining) = round(i);
            envoy.should_rate_limit(known).await.unwrap();
            client.should_rate_limit(unknown_domain).await.unwrap();
            envoy.should_rate_limit(invalid).await.unwrap_err();
            envoy.should_rate_limit(bad_unit).await.unwrap_err();
            client.get_remaining(remaining).await.unwrap();
        }
        let (code, metrics) = server.http_get("/metrics").await;
        assert_eq!(code, 200);
        for text in [
            "override-key",
            "unknown-key",
            "unknown-domain",
            "invalid-",
            "bad-unit",
            "value-",
            "remaining-",
        ] {
            assert!(!metrics.contains(text), "request text '{text}' in a label:\n{metrics}");
        }
        assert!(metrics.contains("edge.(override)"), "overrides are counted:\n{metrics}");
        sizes.push(series(&metrics));
    }
    assert_eq!(
        sizes[0], sizes[1],
        "the same series after 10 and after 2 000 distinct keys"
    );
    server.shutdown().await;
}

const EVERY_ALGORITHM: &str = "
domain: edge
descriptors:
  - key: fixed_window
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: sliding_window
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window}
  - key: sliding_log
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_log}
  - key: token_bucket
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: token_bucket}
  - key: leaky_bucket
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: leaky_bucket, burst: 3}
  - key: tiers
    rate_limits:
      - {unit: second, requests_per_unit: 3}
      - {unit: hour, requests_per_unit: 4294967295, algorithm: sliding_window}
  - key: concurrency
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: concurrency}
  - key: queue
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: queue}
";

/// The largest costs the wire carries, Envoy's `hits_addend` (uint32) and a descriptor's own (UInt64Value), on every
/// algorithm: denied without an error and without consuming anything, so the next hit of 1 finds the whole limit.
/// (`concurrency` and `queue` take one place for any positive cost.)
async fn the_largest_costs_are_denied_and_consume_nothing(server: &TestServer) {
    let mut client = envoy_client(server).await;
    for key in [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "leaky_bucket",
        "tiers",
        "concurrency",
        "queue",
    ] {
        let places = matches!(key, "concurrency" | "queue");
        let mut request32 = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![descriptor(key, "v")],
            hits_addend: u32::MAX,
        };
        let mut request64 = request32.clone();
        request64.hits_addend = 0;
        request64.descriptors[0].hits_addend = Some(u64::MAX);
        for (what, request) in [("u32::MAX", &request32), ("u64::MAX", &request64)] {
            let response = client.should_rate_limit(request.clone()).await.unwrap().into_inner();
            let status = &response.statuses[0];
            let limit = status.current_limit.as_ref().expect("the limit is reported");
            if key != "tiers" {
                assert_eq!(limit.requests_per_unit, 3, "{key} {what}");
            }
            assert!(status.duration_until_reset.is_some(), "{key} {what}");
            if places {
                assert_eq!(response.overall_code, Code::Ok as i32, "{key} {what}: one place");
            } else {
                assert_eq!(
                    (response.overall_code, status.limit_remaining),
                    (Code::OverLimit as i32, 0),
                    "{key} {what}"
                );
            }
        }
        request32.hits_addend = 0;
        let response = client.should_rate_limit(request32).await.unwrap().into_inner();
        assert_eq!(response.overall_code, Code::Ok as i32, "{key}");
        let left = if places { 0 } else { 2 };
        assert_eq!(response.statuses[0].limit_remaining, left, "{key}: nothing consumed");
    }
}

#[tokio::test]
async fn the_largest_costs_are_denied_and_consume_nothing_in_memory() {
    let (l, _) = limiter(EVERY_ALGORITHM, memory());
    let server = TestServer::start(l).await;
    the_largest_costs_are_denied_and_consume_nothing(&server).await;
    server.shutdown().await;
}

#[tokio::test]
async fn the_largest_costs_are_denied_and_consume_nothing_in_redis() {
    let redis = RedisServer::start();
    let (l, _) = limiter(EVERY_ALGORITHM, redis_store(&redis.url()).await);
    let server = TestServer::start(l).await;
    the_largest_costs_are_denied_and_consume_nothing(&server).await;
    server.shutdown().await;
}

/// WaitForPermit over gRPC: a call with room passes at once, one that would wait past its `max_wait` gets the
/// OVER_LIMIT answer at once with nothing consumed, one held until the window turns (the test's clock moves it) gets
/// its permit with the exact wait, one whose client gives up mid-wait consumes nothing, and a malformed `max_wait` is
/// refused naming the field.
#[tokio::test]
async fn wait_for_permit_over_grpc() {
    use sluice::proto::sluice::v1::WaitForPermitRequest;
    let (l, clock) = limiter(
        "domain: edge\ndescriptors:\n  - key: job\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
        memory(),
    );
    let server = TestServer::start(l).await;
    let mut client = RateLimiterClient::connect(server.grpc_url()).await.unwrap();
    let request = |seconds: i64, nanos: i32| WaitForPermitRequest {
        domain: "edge".into(),
        descriptors: vec![descriptor("job", "j")],
        hits_addend: 0,
        max_wait: Some(prost_types::Duration { seconds, nanos }),
    };
    let first = client.wait_for_permit(request(0, 0)).await.unwrap().into_inner();
    assert_eq!(first.decision.unwrap().overall_code, Code::Ok as i32);
    assert_eq!(first.waited, Some(prost_types::Duration::default()));
    let short = client.wait_for_permit(request(1, 0)).await.unwrap().into_inner();
    let decision = short.decision.unwrap();
    assert_eq!(
        decision.overall_code,
        Code::OverLimit as i32,
        "50 s to wait, 1 s allowed"
    );
    assert_eq!(decision.statuses[0].duration_until_reset.as_ref().unwrap().seconds, 50);
    let waiting = {
        let mut client = client.clone();
        tokio::spawn(async move { client.wait_for_permit(request(120, 0)).await })
    };
    for _ in 0..10_000 {
        if clock.sleepers() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    clock.advance(50_000_000);
    let held = waiting.await.unwrap().unwrap().into_inner();
    assert_eq!(held.decision.unwrap().overall_code, Code::Ok as i32);
    assert_eq!(held.waited, Some(prost_types::Duration { seconds: 50, nanos: 0 }));
    // A client that gives up mid-wait (its deadline, shorter than the wait) consumed nothing: the server drops its
    // wait, and once the window turns the whole limit is there.
    let mut impatient = tonic::Request::new(request(120, 0));
    impatient.set_timeout(Duration::from_millis(200));
    let gave_up = client.wait_for_permit(impatient).await.unwrap_err();
    assert!(
        matches!(gave_up.code(), GrpcCode::DeadlineExceeded | GrpcCode::Cancelled),
        "{gave_up:?}"
    );
    for _ in 0..10_000 {
        if clock.sleepers() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(clock.sleepers(), 0, "the server still waits for a client that left");
    clock.advance(60_000_000);
    let remaining = client
        .get_remaining(GetRemainingRequest {
            domain: "edge".into(),
            descriptors: vec![descriptor("job", "j")],
            cost: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        remaining.descriptors[0].remaining, 1,
        "the caller that gave up consumed nothing"
    );
    for (seconds, nanos, want) in [
        (-1, 0, "max_wait is negative"),
        (3_601, 0, "over the most a call may wait"),
    ] {
        let refused = client.wait_for_permit(request(seconds, nanos)).await.unwrap_err();
        assert_eq!(refused.code(), GrpcCode::InvalidArgument);
        assert!(refused.message().contains(want), "{}", refused.message());
    }
    server.shutdown().await;
}
