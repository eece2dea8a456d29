//! The store contract: every behaviour, run against the in-memory store and against a real Redis, so the two can
//! never drift apart.

use sluice::store::{CounterKey, Hit, Store};

use crate::harness::{RedisServer, T0, memory, redis_store};

const SECOND: u64 = 1_000_000;
const MINUTE: u64 = 60 * SECOND;

fn hit(name: &str, limit: u64, window_us: u64, cost: u64, now_us: u64) -> Hit {
    Hit {
        key: CounterKey::builder("contract:", "d")
            .entry("k", name)
            .window("fixed_window", window_us, now_us),
        limit,
        window_us,
        cost,
    }
}

both_stores!(
    counts_up_to_the_limit_then_over,
    cost_zero_reads_without_creating,
    a_new_window_starts_from_zero,
    costs_add_and_over_is_strictly_greater,
    limit_zero_rejects_every_hit,
    counters_are_independent,
    peek_reports_and_never_changes,
    one_call_applies_many_hits_in_order,
);

async fn counts_up_to_the_limit_then_over(store: impl Store) {
    let now = T0 + 5 * SECOND;
    for expected in 1..=3 {
        let out = store
            .hit(now, &[hit("a", 3, MINUTE, 1, now)])
            .await
            .unwrap();
        assert!(out[0].allowed);
        assert_eq!(out[0].used, expected);
        assert_eq!(out[0].remaining, 3 - expected);
        assert_eq!(
            out[0].reset_after_us,
            MINUTE - 15 * SECOND,
            "T0 is 10 s into its minute"
        );
    }
    let out = store
        .hit(now, &[hit("a", 3, MINUTE, 1, now)])
        .await
        .unwrap();
    assert!(!out[0].allowed);
    assert_eq!((out[0].used, out[0].remaining), (4, 0));
}

async fn cost_zero_reads_without_creating(store: impl Store) {
    let out = store.hit(T0, &[hit("z", 2, MINUTE, 0, T0)]).await.unwrap();
    assert_eq!(
        (out[0].allowed, out[0].used, out[0].remaining),
        (true, 0, 2)
    );
    // Still nothing counted: the next real hit is the first.
    let out = store.hit(T0, &[hit("z", 2, MINUTE, 1, T0)]).await.unwrap();
    assert_eq!(out[0].used, 1);
    let out = store.hit(T0, &[hit("z", 2, MINUTE, 0, T0)]).await.unwrap();
    assert_eq!((out[0].used, out[0].remaining), (1, 1));
}

async fn a_new_window_starts_from_zero(store: impl Store) {
    let out = store.hit(T0, &[hit("w", 1, SECOND, 1, T0)]).await.unwrap();
    assert!(out[0].allowed);
    let out = store.hit(T0, &[hit("w", 1, SECOND, 1, T0)]).await.unwrap();
    assert!(!out[0].allowed);
    let next = T0 + SECOND;
    let out = store
        .hit(next, &[hit("w", 1, SECOND, 1, next)])
        .await
        .unwrap();
    assert!(out[0].allowed, "the next epoch-aligned window starts empty");
    assert_eq!(out[0].used, 1);
}

async fn costs_add_and_over_is_strictly_greater(store: impl Store) {
    let out = store.hit(T0, &[hit("c", 10, MINUTE, 7, T0)]).await.unwrap();
    assert_eq!((out[0].allowed, out[0].remaining), (true, 3));
    let out = store.hit(T0, &[hit("c", 10, MINUTE, 3, T0)]).await.unwrap();
    assert_eq!(
        (out[0].allowed, out[0].used, out[0].remaining),
        (true, 10, 0),
        "reaching the limit is allowed"
    );
    let out = store.hit(T0, &[hit("c", 10, MINUTE, 1, T0)]).await.unwrap();
    assert!(!out[0].allowed);
}

async fn limit_zero_rejects_every_hit(store: impl Store) {
    let out = store
        .hit(T0, &[hit("zero", 0, MINUTE, 1, T0)])
        .await
        .unwrap();
    assert!(!out[0].allowed);
    assert_eq!(out[0].remaining, 0);
}

async fn counters_are_independent(store: impl Store) {
    store.hit(T0, &[hit("x", 1, MINUTE, 1, T0)]).await.unwrap();
    let out = store.hit(T0, &[hit("y", 1, MINUTE, 1, T0)]).await.unwrap();
    assert!(out[0].allowed);
    let other_window = hit("x", 1, SECOND, 1, T0);
    assert!(
        store.hit(T0, &[other_window]).await.unwrap()[0].allowed,
        "a different window length is another counter"
    );
}

async fn peek_reports_and_never_changes(store: impl Store) {
    let probe = |cost| hit("p", 5, MINUTE, cost, T0);
    let r = store.peek(T0, &[probe(1)]).await.unwrap()[0];
    assert_eq!((r.used, r.remaining, r.retry_after_us), (0, 5, Some(0)));
    store.hit(T0, &[hit("p", 5, MINUTE, 4, T0)]).await.unwrap();
    for _ in 0..3 {
        let r = store.peek(T0, &[probe(1)]).await.unwrap()[0];
        assert_eq!((r.used, r.remaining, r.retry_after_us), (4, 1, Some(0)));
    }
    let r = store.peek(T0, &[probe(2)]).await.unwrap()[0];
    assert_eq!(
        r.retry_after_us,
        Some(50 * SECOND),
        "waits for the next window"
    );
    let r = store.peek(T0, &[probe(6)]).await.unwrap()[0];
    assert_eq!(r.retry_after_us, None, "more than the limit never fits");
    let out = store.hit(T0, &[probe(1)]).await.unwrap()[0];
    assert_eq!(out.used, 5, "peeks consumed nothing");
}

async fn one_call_applies_many_hits_in_order(store: impl Store) {
    let hits = [
        hit("m1", 1, MINUTE, 1, T0),
        hit("m1", 1, MINUTE, 1, T0),
        hit("m2", 5, MINUTE, 2, T0),
    ];
    let out = store.hit(T0, &hits).await.unwrap();
    assert_eq!(
        out.iter().map(|o| o.allowed).collect::<Vec<_>>(),
        [true, false, true]
    );
    assert_eq!(out.iter().map(|o| o.used).collect::<Vec<_>>(), [1, 2, 2]);
}

#[tokio::test]
async fn memory_store_evicts_expired_windows() {
    let store = memory();
    for i in 0..100 {
        store
            .hit(T0, &[hit(&format!("e{i}"), 5, SECOND, 1, T0)])
            .await
            .unwrap();
    }
    assert_eq!(store.len(), 100);
    // Two seconds on, every shard that is touched sweeps; touching many keys reaches every shard.
    let later = T0 + 2 * SECOND;
    for i in 0..1000 {
        store
            .peek(later, &[hit(&format!("f{i}"), 5, SECOND, 1, later)])
            .await
            .unwrap();
    }
    assert_eq!(
        store.len(),
        0,
        "expired windows are evicted and peeks create nothing"
    );
}

#[tokio::test]
async fn redis_counters_carry_ttls_and_huge_costs_do_not_overflow() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    store
        .hit(T0, &[hit("ttl", 3, MINUTE, 1, T0)])
        .await
        .unwrap();
    let snapshot = redis.snapshot();
    assert_eq!(snapshot.len(), 1);
    let (key, value, ttl) = &snapshot[0];
    assert!(key.starts_with("contract:{"), "{key}");
    assert_eq!(value, "1");
    assert!(
        *ttl > 0 && *ttl <= 50_000,
        "TTL ends with the window (50 s left): {ttl}"
    );
    // The largest cost the limiter sends is limit + 1; many of them stay far from i64 overflow.
    let big = u64::from(u32::MAX) + 1;
    for _ in 0..3 {
        let out = store
            .hit(T0, &[hit("big", u64::from(u32::MAX), MINUTE, big, T0)])
            .await
            .unwrap();
        assert!(!out[0].allowed);
    }
}
