//! The storage format and the key layouts: the format is recorded once per server and a server of another format is
//! refused; in the reference's layout a descriptor's one fixed window shares its counts with envoyproxy/ratelimit.

use sluice_core::limiter::{Code, Descriptor, Limiter, LimiterSettings, Request};
use sluice_core::store::KeyLayout;
use sluice_core::store::redis::{FORMAT, FormatCheck, RedisStore};

use crate::harness::{RedisServer, T0, limiter_with, redis_store};

fn config(algorithm: &str) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: 10, algorithm: {algorithm}}}\n"
    )
}

fn request(user: &str) -> Request {
    Request {
        domain: "d".into(),
        descriptors: vec![Descriptor {
            entries: vec![("user".into(), user.into())],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    }
}

/// How many of `n` hits of `user` pass.
async fn admitted(limiter: &Limiter<RedisStore>, user: &str, n: usize) -> usize {
    let mut passed = 0;
    for _ in 0..n {
        let answer = limiter
            .decisions()
            .should_rate_limit(&request(user))
            .await
            .expect("decided");
        passed += usize::from(answer.overall == Code::Ok);
    }
    passed
}

/// The keys of `redis` whose names hold `text`.
fn keys(redis: &RedisServer, text: &str) -> Vec<String> {
    redis
        .cli(&["--raw", "KEYS", "*"])
        .lines()
        .filter(|k| k.contains(text))
        .map(str::to_string)
        .collect()
}

/// The first check on a server records this version's format under the prefix, once, without expiry; a server
/// holding another format is refused, whatever it holds beside; each prefix has its own marker.
#[tokio::test]
async fn the_storage_format_is_recorded_once_and_another_refused() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    assert_eq!(store.check_format("sluice:").await.unwrap(), FormatCheck::Known);
    assert_eq!(redis.cli(&["--raw", "GET", "sluice:format"]).trim(), FORMAT);
    assert_eq!(redis.cli(&["--raw", "PTTL", "sluice:format"]).trim(), "-1");
    assert_eq!(store.check_format("sluice:").await.unwrap(), FormatCheck::Known);
    // A server written by another format: refused, and the marker left as it was.
    redis.cli(&["SET", "other:format", "0"]);
    assert_eq!(
        store.check_format("other:").await.unwrap(),
        FormatCheck::Unknown("0".into())
    );
    assert_eq!(redis.cli(&["--raw", "GET", "other:format"]).trim(), "0");
    assert_eq!(store.check_format("sluice:").await.unwrap(), FormatCheck::Known);
}

/// The documented least-privilege ACL user (docs/src/storage.md) may read and write the format's marker.
#[tokio::test]
async fn the_documented_acl_user_can_check_the_format() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.acl_user_url()).await;
    assert_eq!(store.check_format("test:").await.unwrap(), FormatCheck::Known);
    assert_eq!(redis.cli(&["--raw", "GET", "test:format"]).trim(), FORMAT);
}

/// In the reference's layout (the compatibility mode's), a descriptor's one fixed window counts under the key
/// envoyproxy/ratelimit gives it: counts carry over from the reference and back, with no burst. Other limits keep
/// compact keys.
#[tokio::test]
async fn the_reference_layout_shares_counts_with_envoyproxy_ratelimit() {
    let redis = RedisServer::start();
    let start_s = (T0 / 1_000_000) / 3_600 * 3_600;
    // What the reference wrote: 7 hits of user u1 in this hour, under its key (prefix "rl:").
    let key = format!("rl:d_user_u1_{start_s}");
    redis.cli(&["SET", &key, "7", "EX", "3600"]);
    let settings = LimiterSettings {
        key_prefix: "rl:".into(),
        key_layout: KeyLayout::Reference,
        local_cache_size: 0,
        ..LimiterSettings::default()
    };
    let (limiter, _) = limiter_with(
        &config("fixed_window"),
        redis_store(&redis.url()).await,
        settings.clone(),
    );
    assert_eq!(
        admitted(&limiter, "u1", 5).await,
        3,
        "7 of 10 were counted by the reference"
    );
    // sluice counts the reference's way: every hit, denials too (the reference adds its hits before it decides).
    assert_eq!(redis.cli(&["--raw", "GET", &key]).trim(), "12");
    let ttl: i64 = redis.cli(&["--raw", "TTL", &key]).trim().parse().unwrap();
    assert!(ttl > 0 && ttl <= 3_600, "{ttl}");
    // A descriptor of several limits is one the reference cannot express: compact keys, with the hash tag.
    let tiers = "domain: d\ndescriptors:\n  - key: user\n    rate_limits:\n      - {unit: minute, requests_per_unit: 2}\n      - {unit: hour, requests_per_unit: 5}\n";
    let (limiter, _) = limiter_with(tiers, redis_store(&redis.url()).await, settings.clone());
    assert_eq!(admitted(&limiter, "u2", 3).await, 2);
    assert!(keys(&redis, "rl:d_user_u2").is_empty());
    assert_eq!(
        keys(&redis, "rl:{").len(),
        1,
        "two windows, in one compact packed state"
    );
    // So is one that keeps hit records beside its count: they share the descriptor's hash tag.
    let recorded = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5, record: {key: user, size: 2}}\n";
    let settings = LimiterSettings {
        key_prefix: "rr:".into(),
        ..settings
    };
    let (limiter, _) = limiter_with(recorded, redis_store(&redis.url()).await, settings);
    assert_eq!(admitted(&limiter, "u3", 1).await, 1);
    assert!(keys(&redis, "rr:d_user_u3").is_empty());
    assert_eq!(keys(&redis, "rr:{").len(), 2, "the window and the records, compact");
}
