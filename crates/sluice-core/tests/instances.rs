//! Several sluice instances sharing one Redis stay exact: many concurrent clients across three limiters (each with
//! its own connections) against one limit get exactly the limit admitted; an instance whose Redis user may not use
//! the notices channel never counts on hearing the others.

use std::sync::Arc;

use sluice_core::limiter::{Code, Descriptor, LimiterSettings, Request};

use crate::harness::{RedisServer, limiter_with, redis_store};
use sluice_core::store::Announcements;

async fn admitted_across_instances(algorithm: &str, limit: u32) -> usize {
    let redis = RedisServer::start();
    let yaml = format!(
        "domain: shared\ndescriptors:\n  - key: tenant\n    rate_limit: {{unit: hour, requests_per_unit: {limit}, algorithm: {algorithm}}}\n"
    );
    let mut instances = Vec::new();
    for _ in 0..3 {
        // No local cache: every decision must come from the shared Redis.
        let settings = LimiterSettings {
            local_cache_size: 0,
            ..LimiterSettings::default()
        };
        let (l, _) = limiter_with(&yaml, redis_store(&redis.url()).await, settings);
        instances.push(l);
    }
    let request = Arc::new(Request {
        domain: "shared".into(),
        descriptors: vec![Descriptor {
            entries: vec![("tenant".into(), "t".into())],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    });
    let mut tasks = Vec::new();
    for client in 0..30 {
        let (l, request) = (instances[client % 3].clone(), request.clone());
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..10 {
                if l.decisions().should_rate_limit(&request).await.unwrap().overall == Code::Ok {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_sharing_redis_admit_exactly_the_limit() {
    // 300 attempts within one window (the injected clock stands still) against a limit of 50.
    for algorithm in ["fixed_window", "sliding_log", "concurrency", "token_bucket"] {
        assert_eq!(admitted_across_instances(algorithm, 50).await, 50, "{algorithm}");
    }
}

/// A reservation made on one instance and settled on another is not counted as expired by the first.
#[tokio::test]
async fn a_reservation_settled_elsewhere_is_never_reaped() {
    use sluice_core::limiter::Costs;
    let redis = RedisServer::start();
    let yaml = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";
    let settings = LimiterSettings::default();
    let (a, clock_a) = limiter_with(yaml, redis_store(&redis.url()).await, settings.clone());
    let (b, _) = limiter_with(yaml, redis_store(&redis.url()).await, settings);
    let request = Request {
        domain: "d".into(),
        descriptors: vec![Descriptor {
            entries: vec![("user".into(), "u".into())],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    };
    let cost = |c| Costs {
        cost: c,
        named: Vec::new(),
    };
    let elsewhere = a
        .budgets()
        .reserve(&request, &cost(30), 2_000_000)
        .await
        .unwrap()
        .id
        .unwrap();
    let unsettled = a
        .budgets()
        .reserve(&request, &cost(20), 2_000_000)
        .await
        .unwrap()
        .id
        .unwrap();
    assert!(
        b.budgets()
            .settle(&request, &elsewhere, &cost(5))
            .await
            .unwrap()
            .is_some()
    );
    clock_a.advance(3_000_000);
    assert_eq!(a.budgets().reap_expired().await.unwrap(), 20);
    let _ = unsettled;
}

/// Redis refuses a SUBSCRIBE to a channel the user may not use with an error the subscriber does not report: the
/// instance tries the channel when it starts, and, refused, does not claim to hear the others, while one whose user
/// may does. Once the user's ACL allows the channel, the instance hears again without a restart.
#[tokio::test]
async fn a_user_refused_the_notices_channel_hears_once_allowed() {
    let redis = RedisServer::start();
    let allowed = redis_store(&redis.acl_user_url()).await;
    let mut rules = vec!["ACL".to_string(), "SETUSER".into(), "deaf".into()];
    rules.extend(
        crate::harness::readme_acl_user("test:")
            .into_iter()
            .skip(1)
            .filter(|r| r != "&sluice:notices"),
    );
    let args: Vec<&str> = rules.iter().map(String::as_str).collect();
    assert_eq!(redis.cli(&args).trim(), "OK");
    let url = redis
        .url()
        .replace("redis://", &format!("redis://deaf:{}@", crate::harness::ACL_PASSWORD));
    let deaf = redis_store(&url).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !allowed.hearing() {
        assert!(
            std::time::Instant::now() < deadline,
            "the allowed user never subscribed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // The refused user's subscriber connected and "subscribed" as early: it still does not claim to hear.
    for _ in 0..20 {
        assert!(!deaf.hearing(), "a user refused the channel claims to hear the notices");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(redis.cli(&["ACL", "SETUSER", "deaf", "&sluice:notices"]).trim(), "OK");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !deaf.hearing() {
        assert!(
            std::time::Instant::now() < deadline,
            "the mended user never heard again"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
