//! Expiry: the memory store evicts expired state and expired reservations' records, and Redis keeps a TTL of at most
//! two windows on every algorithm's key (where the largest costs the limiter sends do not overflow either).

use sluice_core::rules::Algorithm;
use sluice_core::store::Store;

use super::{MINUTE, SECOND, apply, one, peek, reserving};
use crate::harness::{RedisServer, T0, memory, redis_store};

/// Two seconds and the reaping grace after [`T0`], peeks at many descriptors: every shard that is touched sweeps, and
/// touching many reaches every shard.
async fn sweep_every_shard(store: &impl Store) {
    let later = T0 + 2 * SECOND + sluice_core::store::RESERVATION_GRACE_US;
    for i in 0..1000 {
        peek(
            store,
            later,
            &one(&format!("f{i}"), Algorithm::FixedWindow, 5, SECOND, 1),
        )
        .await;
    }
}

#[tokio::test]
async fn memory_store_evicts_expired_state() {
    let store = memory();
    for i in 0..100 {
        apply(&store, T0, &one(&format!("e{i}"), Algorithm::FixedWindow, 5, SECOND, 1)).await;
    }
    assert_eq!(store.len(), 100);
    sweep_every_shard(&store).await;
    assert_eq!(store.len(), 0, "expired state is evicted and peeks create nothing");
}

#[tokio::test]
async fn memory_store_evicts_expired_reservations() {
    let store = memory();
    for i in 0..100 {
        let name = format!("res-evict{i}");
        let h = one(&name, Algorithm::FixedWindow, 5, SECOND, 1);
        apply(&store, T0, &reserving(h, &name, "a", 500_000)).await;
    }
    assert_eq!(store.len(), 200);
    sweep_every_shard(&store).await;
    assert_eq!(store.len(), 0, "records expire, a grace after their reservations");
}

#[tokio::test]
async fn redis_state_carries_ttls_and_huge_costs_do_not_overflow() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    for algorithm in Algorithm::ALL {
        apply(&store, T0, &one("ttl", algorithm, 3, MINUTE, 1)).await;
    }
    let snapshot = redis.snapshot();
    // The sliding window and the two buckets share their descriptor's packed state.
    assert_eq!(snapshot.len(), Algorithm::ALL.len() - 2);
    for (key, _, ttl) in &snapshot {
        assert!(key.starts_with("test:{"), "{key}");
        assert!(*ttl > 0 && *ttl <= 120_000, "{key}: TTL {ttl}, at most two windows");
    }
    // The largest cost the limiter sends is the capacity + 1; many of them stay far from overflow.
    let big = u64::from(u32::MAX) + 1;
    for _ in 0..3 {
        let o = apply(
            &store,
            T0,
            &one("big", Algorithm::FixedWindow, u64::from(u32::MAX), MINUTE, big),
        )
        .await;
        assert!(!o.admitted);
    }
}
