//! The queue: a hit appends an entry and is told its id, until the queue is full.

use sluice_core::rules::Algorithm;
use sluice_core::store::Store;

use super::{MINUTE, apply, one, peek};
use crate::harness::T0;

every_store!(queue_admits_until_full_and_returns_ids);

async fn queue_admits_until_full_and_returns_ids(store: impl Store) {
    let h = one("q", Algorithm::Queue, 2, MINUTE, 1);
    let first = apply(&store, T0, &h).await;
    let second = apply(&store, T0, &h).await;
    assert!(first.admitted && second.admitted);
    let (a, b) = (first.tiers[0].id.clone().unwrap(), second.tiers[0].id.clone().unwrap());
    assert_ne!(a, b);
    let third = apply(&store, T0, &h).await;
    assert!(!third.admitted);
    assert_eq!(third.tiers[0].id, None);
    assert_eq!(peek(&store, T0, &h).await.tiers[0].remaining, 0);
}
