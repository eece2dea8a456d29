//! The switch of key layout on a Redis that holds counters of the full layout: every algorithm's counts are moved to
//! their compact names as they are read, with no burst and no count lost; a window counted under both names is
//! added up; a reset while the layout moves deletes both; a server that held nothing moves nothing.

use std::sync::Arc;

use sluice_core::limiter::{Code, Descriptor, Limiter, LimiterSettings, QueuedWork, Request};
use sluice_core::store::KeyLayout;
use sluice_core::store::redis::RedisStore;

use crate::harness::{RedisServer, T0, limiter_with, redis_store};

const HOUR: u64 = 3_600_000_000;

fn config(algorithm: &str) -> String {
    let extra = match algorithm {
        "token_bucket" => ", burst: 10",
        "bucketed_window" => ", buckets: 6",
        _ => "",
    };
    format!(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: 10, algorithm: {algorithm}{extra}}}\n"
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

/// A limiter over its own connections to `redis`, writing keys in `layout`, its clock at `now`.
async fn instance(redis: &RedisServer, algorithm: &str, layout: KeyLayout, now: u64) -> Arc<Limiter<RedisStore>> {
    instance_at(&redis.url(), "sluice:", algorithm, layout, now).await
}

/// [`instance`] on the Redis at `url`, under `prefix`.
async fn instance_at(
    url: &str,
    prefix: &str,
    algorithm: &str,
    layout: KeyLayout,
    now: u64,
) -> Arc<Limiter<RedisStore>> {
    let settings = LimiterSettings {
        key_prefix: prefix.into(),
        key_layout: layout,
        local_cache_size: 0,
        ..LimiterSettings::default()
    };
    let (limiter, clock) = limiter_with(&config(algorithm), redis_store(url).await, settings);
    clock.set(now);
    limiter
}

/// How many of `n` hits of `user` pass.
async fn admitted(limiter: &Limiter<RedisStore>, user: &str, n: usize) -> usize {
    let mut passed = 0;
    for _ in 0..n {
        let answer = limiter.should_rate_limit(&request(user)).await.expect("decided");
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

/// The layout an instance started now on `redis` would write in, as the server starts it.
async fn chosen(redis: &RedisServer, now: u64) -> KeyLayout {
    let store = redis_store(&redis.url()).await;
    store.key_layout(KeyLayout::Compact, "sluice:", HOUR, now).await
}

#[tokio::test]
async fn switching_to_compact_keys_moves_every_counter_with_no_burst() {
    for algorithm in [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "leaky_bucket",
        "concurrency",
        "bucketed_window",
    ] {
        let redis = RedisServer::start();
        // Counted by a version that writes the full layout: 6 of 10 (a leaky bucket passes one).
        let before = instance(&redis, algorithm, KeyLayout::Full, T0).await;
        let first = if algorithm == "leaky_bucket" { 1 } else { 6 };
        assert_eq!(admitted(&before, "u1", 6).await, first, "{algorithm}");
        assert!(
            !keys(&redis, &format!("|{algorithm}/")).is_empty(),
            "{algorithm}: full keys"
        );

        // Restarted with compact keys a second later: the server held counters, so the layout moves.
        let layout = chosen(&redis, T0 + 1_000_000).await;
        assert!(
            matches!(layout, KeyLayout::Moving { until_us } if until_us >= T0 + 2 * HOUR),
            "{algorithm}: {layout:?}"
        );
        let after = instance(&redis, algorithm, layout, T0 + 1_000_000).await;
        let rest = if algorithm == "leaky_bucket" { 0 } else { 4 };
        assert_eq!(
            admitted(&after, "u1", 10).await,
            rest,
            "{algorithm}: no burst, no count lost"
        );
        assert!(keys(&redis, &format!("|{algorithm}/")).is_empty(), "{algorithm}: moved");
        // Another descriptor starts from nothing.
        assert_eq!(
            admitted(&after, "u2", 3).await,
            if algorithm == "leaky_bucket" { 1 } else { 3 }
        );
    }
}

/// The documented least-privilege ACL user (docs/src/storage.md) may run what the switch runs: the marker's script
/// and the move's.
#[tokio::test]
async fn the_documented_acl_user_can_switch_layouts() {
    let redis = RedisServer::start();
    let url = redis.acl_user_url();
    let before = instance_at(&url, "test:", "sliding_window", KeyLayout::Full, T0).await;
    assert_eq!(admitted(&before, "u", 6).await, 6);
    let store = redis_store(&url).await;
    let layout = store.key_layout(KeyLayout::Compact, "test:", HOUR, T0).await;
    assert!(matches!(layout, KeyLayout::Moving { .. }), "{layout:?}");
    let after = instance_at(&url, "test:", "sliding_window", layout, T0).await;
    assert_eq!(admitted(&after, "u", 10).await, 4, "moved as the ACL user");
    assert!(keys(&redis, "|sliding_window/").is_empty());
}

#[tokio::test]
async fn a_window_counted_under_both_names_is_added_up() {
    for algorithm in ["fixed_window", "sliding_window"] {
        let redis = RedisServer::start();
        redis.cli(&["SET", "unrelated", "1"]);
        let layout = chosen(&redis, T0).await;
        assert!(matches!(layout, KeyLayout::Moving { .. }), "{layout:?}");
        let new = instance(&redis, algorithm, layout, T0).await;
        let old = instance(&redis, algorithm, KeyLayout::Full, T0).await;
        // The new version counts 3 under the compact name; one of the previous version, during a rollout, 2 under
        // the full one. An instance that has not moved the counter yet (one started since) adds them up: 5 of 10.
        assert_eq!(admitted(&new, "u", 3).await, 3, "{algorithm}");
        assert_eq!(admitted(&old, "u", 2).await, 2, "{algorithm}");
        let started = instance(&redis, algorithm, layout, T0).await;
        assert_eq!(admitted(&started, "u", 10).await, 5, "{algorithm}: 5 of 10 left");
        assert!(
            keys(&redis, &format!("|{algorithm}/")).is_empty(),
            "{algorithm}: added and deleted"
        );
        // An instance moves a counter once: what the previous version counts after that, it does not see.
        assert_eq!(admitted(&old, "u", 1).await, 1, "{algorithm}");
        assert_eq!(admitted(&started, "u", 1).await, 0, "{algorithm}");
        assert_eq!(
            keys(&redis, &format!("|{algorithm}/")).len(),
            1,
            "{algorithm}: left under the full name"
        );
    }
}

#[tokio::test]
async fn a_reset_while_the_layout_moves_deletes_both_names() {
    let redis = RedisServer::start();
    let old = instance(&redis, "fixed_window", KeyLayout::Full, T0).await;
    assert_eq!(admitted(&old, "u", 10).await, 10);
    let layout = chosen(&redis, T0).await;
    let new = instance(&redis, "fixed_window", layout, T0).await;
    new.reset(&request("u"), QueuedWork::Keep).await.expect("reset");
    assert_eq!(admitted(&new, "u", 12).await, 10, "the full name's count is gone too");
}

#[tokio::test]
async fn the_layout_is_chosen_once_per_server() {
    let redis = RedisServer::start();
    // Nothing to move on a server that held no key when compact keys first came.
    assert_eq!(chosen(&redis, T0).await, KeyLayout::Compact);
    let old = instance(&redis, "fixed_window", KeyLayout::Full, T0).await;
    assert_eq!(admitted(&old, "u", 1).await, 1);
    assert_eq!(chosen(&redis, T0 + HOUR).await, KeyLayout::Compact, "the marker stays");
    let marker = redis.cli(&["--raw", "GET", "sluice:layout"]);
    assert_eq!(marker.trim(), "fresh");

    // On a server with counters: the move lasts from the first start for twice the longest window and a minute,
    // whenever an instance starts; then the layout is compact.
    let redis = RedisServer::start();
    redis.cli(&["SET", "sluice:{0}old", "1"]);
    let first = chosen(&redis, T0).await;
    assert_eq!(
        first,
        KeyLayout::Moving {
            until_us: T0 + 2 * HOUR + 60_000_000
        }
    );
    assert_eq!(chosen(&redis, T0 + HOUR).await, first);
    assert_eq!(chosen(&redis, T0 + 3 * HOUR).await, KeyLayout::Compact);
    // Asked for the full layout, sluice writes it and leaves the marker alone.
    let store = redis_store(&redis.url()).await;
    assert_eq!(store.key_layout(KeyLayout::Full, "p:", HOUR, T0).await, KeyLayout::Full);
    assert_eq!(redis.cli(&["--raw", "EXISTS", "p:layout"]).trim(), "0");
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
    assert_eq!(keys(&redis, "rl:{").len(), 2, "two windows, compact");
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
