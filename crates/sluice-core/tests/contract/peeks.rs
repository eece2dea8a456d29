//! Peeks: they answer as a hit would without counting it, so that repeated peeks answer alike, and a descriptor
//! never hit reads as empty, under every algorithm.

use sluice_core::rules::Algorithm;
use sluice_core::store::Store;

use super::{MINUTE, apply, hit, peek};
use crate::harness::{T0, tier};

every_store!(peek_never_changes_anything);

async fn peek_never_changes_anything(store: impl Store) {
    for algorithm in Algorithm::ALL {
        let burst = if algorithm == Algorithm::LeakyBucket { 1 } else { 3 };
        let h = hit(vec![tier("pk", algorithm, 3, MINUTE, burst)], 1);
        apply(&store, T0, &h).await;
        let before = peek(&store, T0, &h).await;
        for _ in 0..3 {
            assert_eq!(peek(&store, T0, &h).await, before, "{algorithm:?}");
        }
        let fresh = hit(vec![tier("never-hit", algorithm, 3, MINUTE, burst)], 2);
        let p = peek(&store, T0, &fresh).await;
        assert_eq!(
            p.tiers[0].remaining,
            if algorithm == Algorithm::LeakyBucket { 1 } else { 3 },
            "{algorithm:?}"
        );
        assert_eq!(p.tiers[0].used, 0, "{algorithm:?}");
    }
}
