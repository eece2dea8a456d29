//! The bucket algorithms: a token bucket bursts up to its size, then refills at its rate; a leaky bucket spaces hits
//! evenly.

use sluice_core::rules::Algorithm;
use sluice_core::store::Store;

use super::{SECOND, apply, hit, one, peek};
use crate::harness::{T0, tier};

every_store!(token_bucket_bursts_then_refills, leaky_bucket_spaces_hits_evenly);

async fn token_bucket_bursts_then_refills(store: impl Store) {
    // 10 per second, bucket of 5.
    let t = tier("tb", Algorithm::TokenBucket, 10, SECOND, 5);
    let h = hit(vec![t.clone()], 1);
    for left in (0..5).rev() {
        let o = apply(&store, T0, &h).await;
        assert!(o.admitted);
        assert_eq!(o.tiers[0].remaining, left);
    }
    let o = apply(&store, T0, &h).await;
    assert!(!o.admitted);
    assert_eq!(o.tiers[0].retry_after_us, Some(100_000), "one token every 100 ms");
    assert_eq!(o.tiers[0].reset_after_us, 500_000, "full again after 5 tokens");
    assert!(!apply(&store, T0 + 99_999, &h).await.admitted);
    assert!(apply(&store, T0 + 100_000, &h).await.admitted);
    let three = hit(vec![t.clone()], 3);
    assert_eq!(
        peek(&store, T0 + 100_000, &three).await.tiers[0].retry_after_us,
        Some(300_000)
    );
    let six = hit(vec![t], 6);
    assert_eq!(
        peek(&store, T0 + 100_000, &six).await.tiers[0].retry_after_us,
        None,
        "more than the bucket"
    );
}

async fn leaky_bucket_spaces_hits_evenly(store: impl Store) {
    // 4 per second, burst 1: one hit every 250 ms.
    let h = one("lb", Algorithm::LeakyBucket, 4, SECOND, 1);
    assert!(apply(&store, T0, &h).await.admitted);
    assert!(!apply(&store, T0 + 249_999, &h).await.admitted);
    assert!(apply(&store, T0 + 250_000, &h).await.admitted);
    assert!(!apply(&store, T0 + 250_001, &h).await.admitted);
}
