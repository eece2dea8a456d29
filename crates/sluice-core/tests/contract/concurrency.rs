//! The concurrency limit: a hit holds a lease until it is released, or until it expires, so a caller that crashes
//! never leaks capacity.

use sluice_core::rules::Algorithm;
use sluice_core::store::Store;

use super::{SECOND, apply, one, peek};
use crate::harness::T0;

every_store!(concurrency_leases_release_and_expire);

async fn concurrency_leases_release_and_expire(store: impl Store) {
    let lease = |id: &str| {
        let mut h = one("cc", Algorithm::Concurrency, 2, 30 * SECOND, 1);
        h.lease = id.into();
        h
    };
    let a = apply(&store, T0, &lease("a")).await;
    assert!(a.admitted);
    assert_eq!(a.tiers[0].id.as_deref(), Some("a"));
    assert!(apply(&store, T0, &lease("b")).await.admitted);
    let c = apply(&store, T0 + SECOND, &lease("c")).await;
    assert!(!c.admitted);
    assert_eq!(
        c.tiers[0].retry_after_us,
        Some(29 * SECOND),
        "until the first lease expires"
    );
    let key = lease("x").tiers[0].key.clone();
    assert_eq!(store.release(std::slice::from_ref(&key), "a").await.unwrap(), 1);
    assert_eq!(
        store.release(std::slice::from_ref(&key), "a").await.unwrap(),
        0,
        "released once"
    );
    assert!(apply(&store, T0 + SECOND, &lease("c")).await.admitted);
    // Leases b and c expire: a crashed caller never leaks capacity.
    let later = T0 + 31 * SECOND;
    let p = peek(&store, later, &lease("d")).await;
    assert_eq!(p.tiers[0].remaining, 2);
}
