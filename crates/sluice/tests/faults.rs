//! Surviving faults: the failure policy per domain and globally, the circuit breaker, the local over-limit cache,
//! and the caps on hostile requests.

use std::time::{Duration, Instant};

use sluice::breaker::BreakerSettings;
use sluice::limiter::{Caps, Code, Descriptor, LimitError, LimiterSettings, Request};
use sluice::rules::FailurePolicy;
use sluice::store::StoreError;

use crate::harness::{RedisServer, ReplyGate, limiter_with, memory, redis_store, redis_store_with};
use sluice_core::store::Announcements;

const CONFIG: &str = "
domain: strict
failure_policy: fail_closed
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
";

const OPEN: &str = "
domain: open
failure_policy: fail_open
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
";

fn request(domain: &str, value: &str) -> Request {
    Request {
        domain: domain.into(),
        descriptors: vec![Descriptor {
            entries: vec![("user".into(), value.into())],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    }
}

fn settings(policy: FailurePolicy) -> LimiterSettings {
    LimiterSettings {
        failure_policy: policy,
        breaker: BreakerSettings {
            failures: 2,
            cooldown: Duration::from_secs(1),
        },
        ..LimiterSettings::default()
    }
}

#[tokio::test]
async fn failure_policies_answer_when_redis_is_gone_and_the_breaker_answers_fast() {
    // A domain's own policy wins over the server's default.
    for (yaml, domain, policy, expected) in [
        (CONFIG, "strict", FailurePolicy::Error, Some(Code::OverLimit)),
        (OPEN, "open", FailurePolicy::Error, Some(Code::Ok)),
        (OPEN, "open", FailurePolicy::FailClosed, Some(Code::Ok)),
    ] {
        let store = redis_store_with(
            &format!("redis://127.0.0.1:{}", crate::harness::free_port()),
            Duration::from_millis(100),
        )
        .await;
        let (l, _) = limiter_with(yaml, store, settings(policy));
        let d = l
            .decisions()
            .should_rate_limit(&request(domain, "a"))
            .await
            .expect("the domain's policy answers");
        assert_eq!(Some(d.overall), expected, "{domain}");
        if d.overall == Code::OverLimit {
            assert!(d.statuses[0].limit.is_some() && d.statuses[0].remaining == 0);
        } else {
            assert!(d.statuses[0].limit.is_none());
        }
        let text = l.metrics().render();
        assert!(text.contains("sluice_store_fallback_total"), "{text}");
    }
    // The global default applies to a domain without its own policy; `error` answers UNAVAILABLE.
    let yaml = "domain: plain\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    let dead = format!("redis://127.0.0.1:{}", crate::harness::free_port());
    let (l, _) = limiter_with(
        yaml,
        redis_store_with(&dead, Duration::from_millis(100)).await,
        settings(FailurePolicy::Error),
    );
    assert!(matches!(
        l.decisions().should_rate_limit(&request("plain", "a")).await,
        Err(LimitError::Store(_))
    ));
    let (l, clock) = limiter_with(
        yaml,
        redis_store_with(&dead, Duration::from_millis(100)).await,
        settings(FailurePolicy::FailOpen),
    );
    for _ in 0..2 {
        assert_eq!(
            l.decisions()
                .should_rate_limit(&request("plain", "a"))
                .await
                .unwrap()
                .overall,
            Code::Ok
        );
    }
    // The breaker is open now: answers follow the policy at once, without waiting on Redis.
    let started = Instant::now();
    for _ in 0..100 {
        assert_eq!(
            l.decisions()
                .should_rate_limit(&request("plain", "a"))
                .await
                .unwrap()
                .overall,
            Code::Ok
        );
    }
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "100 answers took {:?}",
        started.elapsed()
    );
    let text = l.metrics().render();
    assert!(text.contains("sluice_breaker_state 1"), "{text}");
    clock.advance(1_000_000);
    l.decisions().should_rate_limit(&request("plain", "a")).await.unwrap();
    assert!(
        l.metrics().render().contains("sluice_breaker_state 1"),
        "the failed probe opened it again"
    );
}

/// A Redis that stops answering (its replies held back by a proxy) costs each call one timeout, reported as a
/// timeout, and the calls answer again once the replies flow. A call whose answer was lost may have been counted:
/// these were, once each, and the metric of unknown outcomes says how many there may be.
#[tokio::test]
async fn a_redis_that_stops_answering_times_out_within_the_bound() {
    let redis = RedisServer::start();
    let gate = ReplyGate::start(redis.port).await;
    let yaml = "domain: plain\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let (l, _) = limiter_with(
        yaml,
        redis_store_with(&gate.url(), Duration::from_millis(100)).await,
        LimiterSettings::default(),
    );
    assert_eq!(
        l.decisions()
            .should_rate_limit(&request("plain", "a"))
            .await
            .unwrap()
            .overall,
        Code::Ok
    );
    gate.hold();
    for _ in 0..2 {
        let started = Instant::now();
        let answer = l.decisions().should_rate_limit(&request("plain", "a")).await;
        let took = started.elapsed();
        assert!(
            matches!(answer, Err(LimitError::Store(StoreError::Timeout(t))) if t == Duration::from_millis(100)),
            "{answer:?}"
        );
        assert!(
            took >= Duration::from_millis(100) && took < Duration::from_secs(2),
            "{took:?}"
        );
    }
    gate.release();
    let mut answered = false;
    for _ in 0..50 {
        if l.decisions().should_rate_limit(&request("plain", "b")).await.is_ok() {
            answered = true;
            break;
        }
    }
    assert!(answered, "no answer after the replies flowed again");
    // The two calls whose answers were lost ran: the documented bound, each counted once at its cost, and counted in
    // the metric of unknown outcomes.
    let d = l.decisions().should_rate_limit(&request("plain", "a")).await.unwrap();
    assert_eq!(d.statuses[0].remaining, 5 - 4, "{d:?}");
    let text = l.metrics().render();
    let unknown: u64 = text
        .lines()
        .find(|l| l.starts_with("sluice_store_unknown_outcomes_total{store=\"redis\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no unknown outcomes counted: {text}"));
    assert!(unknown >= 2, "{unknown} unknown outcomes");
}

#[tokio::test]
async fn the_breaker_closes_when_redis_answers_again() {
    let redis = RedisServer::start();
    let gate = ReplyGate::start(redis.port).await;
    let yaml = "domain: plain\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let store = redis_store_with(&gate.url(), Duration::from_millis(150)).await;
    let (l, clock) = limiter_with(yaml, store, settings(FailurePolicy::FailOpen));
    assert_eq!(
        l.decisions()
            .should_rate_limit(&request("plain", "a"))
            .await
            .unwrap()
            .statuses[0]
            .remaining,
        4
    );
    // Redis hangs: calls time out, the breaker opens.
    gate.hold();
    for _ in 0..2 {
        let d = l.decisions().should_rate_limit(&request("plain", "a")).await.unwrap();
        assert!(d.statuses[0].limit.is_none(), "answered by fail_open");
    }
    assert!(l.metrics().render().contains("sluice_breaker_state 1"));
    gate.release();
    // Before the cooldown the breaker still answers alone; after it, the probe succeeds and closes it.
    assert!(
        l.decisions()
            .should_rate_limit(&request("plain", "a"))
            .await
            .unwrap()
            .statuses[0]
            .limit
            .is_none()
    );
    clock.advance(1_000_000);
    let mut closed = false;
    for _ in 0..50 {
        let d = l.decisions().should_rate_limit(&request("plain", "b")).await.unwrap();
        if d.statuses[0].limit.is_some() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        clock.advance(1_000_000);
    }
    assert!(closed, "a probe reached Redis and closed the breaker");
    assert!(l.metrics().render().contains("sluice_breaker_state 0"));
}

fn script_calls(redis: &RedisServer) -> u64 {
    crate::harness::script_calls(redis.port)
}

#[tokio::test]
async fn the_local_cache_answers_a_flood_of_one_over_limit_key() {
    let redis = RedisServer::start();
    let yaml = "
domain: flood
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    let (l, clock) = limiter_with(yaml, redis_store(&redis.url()).await, LimiterSettings::default());
    // The cache answers only once the store hears the other instances' notices (its subscription is up).
    let subscribed = std::time::Instant::now();
    while !l.store().hearing() {
        assert!(
            subscribed.elapsed() < std::time::Duration::from_secs(10),
            "never subscribed to notices"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let mut flood = request("flood", "x");
    flood.descriptors[0].entries[0].0 = "ip".into();
    for _ in 0..3 {
        l.decisions().should_rate_limit(&flood).await.unwrap();
    }
    let before = script_calls(&redis);
    for _ in 0..200 {
        let d = l.decisions().should_rate_limit(&flood).await.unwrap();
        assert_eq!(d.overall, Code::OverLimit);
        assert_eq!(
            d.statuses[0].reset_after_us,
            Some(50_000_000),
            "the script's own reset time"
        );
        assert!(d.statuses[0].limit.is_some());
    }
    assert_eq!(script_calls(&redis), before, "no Redis call while the denial holds");
    assert!(l.metrics().render().contains("sluice_local_cache_hits_total 200"));
    // At the window's end the cache lets the next hit through to Redis, which admits it.
    clock.advance(50_000_000);
    assert_eq!(l.decisions().should_rate_limit(&flood).await.unwrap().overall, Code::Ok);
    assert_eq!(script_calls(&redis), before + 1);
    // Shadow-mode rules still answer OK from the cache.
    let mut trial = request("flood", "t");
    trial.descriptors[0].entries[0].0 = "trial".into();
    for _ in 0..5 {
        assert_eq!(l.decisions().should_rate_limit(&trial).await.unwrap().overall, Code::Ok);
    }
}

#[tokio::test]
async fn a_reload_forgets_cached_denials() {
    let small = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1}\n";
    let (l, _) = limiter_with(small, memory(), LimiterSettings::default());
    let r = request("d", "a");
    assert_eq!(l.decisions().should_rate_limit(&r).await.unwrap().overall, Code::Ok);
    assert_eq!(
        l.decisions().should_rate_limit(&r).await.unwrap().overall,
        Code::OverLimit
    );
    let metrics = l.metrics().clone();
    l.reload(crate::harness::rules(
        &small.replace("requests_per_unit: 1", "requests_per_unit: 10"),
        &metrics,
    ));
    assert_eq!(
        l.decisions().should_rate_limit(&r).await.unwrap().overall,
        Code::Ok,
        "the raised limit applies at once"
    );
}

#[tokio::test]
async fn caps_on_hostile_requests_are_invalid_argument_naming_the_cap() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    let caps = Caps {
        max_descriptors: 3,
        max_entries: 2,
        max_value_bytes: 16,
        max_request_bytes: 1_000,
    };
    let (l, _) = limiter_with(
        yaml,
        memory(),
        LimiterSettings {
            caps,
            ..LimiterSettings::default()
        },
    );
    let entry = |v: &str| ("k".to_string(), v.to_string());
    let mut many = request("d", "a");
    many.descriptors = vec![many.descriptors[0].clone(); 4];
    let mut deep = request("d", "a");
    deep.descriptors[0].entries = vec![entry("a"), entry("b"), entry("c")];
    let long = request("d", &"x".repeat(17));
    let mut long_domain = request("d", "a");
    long_domain.domain = "d".repeat(17);
    for (r, want) in [
        (many, "4 descriptors, over the cap of 3 (--max-descriptors)"),
        (deep, "descriptors[0] has 3 entries, over the cap of 2 (--max-entries)"),
        (
            long,
            "descriptors[0].entries[0] is over the cap of 16 bytes per key or value (--max-value-bytes)",
        ),
        (
            long_domain,
            "domain is 17 bytes, over the cap of 16 (--max-value-bytes)",
        ),
    ] {
        // The core names the setting; the service maps it onto the flag that sets it.
        match l.decisions().should_rate_limit(&r).await {
            Err(LimitError::OverCap { cap, message }) => {
                assert_eq!(sluice::faces::errors::over_cap(cap, &message), want);
                let setting = format!("({})", cap.setting());
                let core = LimitError::OverCap { cap, message }.to_string();
                assert!(core.ends_with(&setting), "{core}");
            }
            other => panic!("{want}: {other:?}"),
        }
    }
    // Over the wire, the encoded size too.
    let server = crate::harness::TestServer::start(l).await;
    let mut client =
        sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(
            server.grpc_url(),
        )
        .await
        .unwrap();
    let big = sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest {
        domain: "x".repeat(2_000),
        ..Default::default()
    };
    let status = client.should_rate_limit(big).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("over the cap of 1000 (--max-request-bytes)"),
        "{}",
        status.message()
    );
    server.shutdown().await;
}
