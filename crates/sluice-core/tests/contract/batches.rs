//! Many hits in one call: each descriptor is decided on its own, and hits on one counter are answered exactly as
//! the same hits one after the other.

use sluice_core::rules::Algorithm;
use sluice_core::store::{Hit, Store};

use super::{MINUTE, apply, one, peek};
use crate::harness::{T0, memory};

every_store!(
    many_descriptors_in_one_call,
    hits_on_one_counter_in_one_call_are_answered_as_serial_hits,
    hits_on_one_bucket_in_one_call_are_answered_as_serial_hits,
);

async fn many_descriptors_in_one_call(store: impl Store) {
    let hits = [
        one("m1", Algorithm::FixedWindow, 1, MINUTE, 1),
        one("m1", Algorithm::FixedWindow, 1, MINUTE, 1),
        one("m2", Algorithm::SlidingLog, 5, MINUTE, 2),
    ];
    let out = crate::harness::decided(store.hit(T0, &hits).await);
    assert_eq!(out.iter().map(|o| o.admitted).collect::<Vec<_>>(), [true, false, true]);
    assert_eq!(out.iter().map(|o| o.tiers[0].used).collect::<Vec<_>>(), [1, 2, 2]);
}

/// Hits on the same counter in one call (a hot key: one tenant, one route) are answered exactly as the same hits one
/// after the other: on Redis they share one count of their summed costs, and each reads the count before it from
/// the hits ahead of it. Costs of 0 and above the limit among them, and another counter in between.
async fn hits_on_one_counter_in_one_call_are_answered_as_serial_hits(store: impl Store) {
    let lone = |name: &str, limit, cost| {
        let mut h = one(name, Algorithm::FixedWindow, limit, MINUTE, cost);
        h.fields.clear();
        h.lease.clear();
        h
    };
    let hits: Vec<Hit> = [1, 2, 0, 3, 7, 2, 1, 0]
        .into_iter()
        .enumerate()
        .flat_map(|(i, cost)| {
            let mut hits = vec![lone("hot", 6, cost)];
            if i % 3 == 0 {
                hits.push(lone("other", 6, 1));
            }
            hits
        })
        .collect();
    let together = crate::harness::decided(store.hit(T0, &hits).await);
    let serial = memory();
    for (h, got) in hits.iter().zip(&together) {
        assert_eq!(got, &apply(&serial, T0, h).await, "{h:?}");
    }
    let counts: Vec<u64> = together.iter().map(|o| o.tiers[0].used).collect();
    assert_eq!(counts[..4], [1, 1, 3, 3], "hot, other, hot, hot");
    assert_eq!(
        peek(&store, T0, &lone("hot", 6, 0)).await.tiers[0].used,
        9,
        "denials count, 7 never"
    );
}

/// Hits on one token bucket, or one sliding window, in one call are answered exactly as the same hits one after the
/// other: on Redis the counter is read once and written once, at the end, or before a descriptor of the driver's
/// form, which here reads it in the middle. Costs of 0 and above the limit among them.
async fn hits_on_one_bucket_in_one_call_are_answered_as_serial_hits(store: impl Store) {
    for (name, algorithm) in [
        ("hot-bucket", Algorithm::TokenBucket),
        ("hot-sliding", Algorithm::SlidingWindow),
    ] {
        let lone = |cost| {
            let mut h = one(name, algorithm, 6, MINUTE, cost);
            h.fields.clear();
            h.lease.clear();
            h
        };
        let mut hits: Vec<Hit> = [1, 2, 0, 3, 7, 1].into_iter().map(lone).collect();
        hits.insert(3, one(name, algorithm, 6, MINUTE, 1));
        hits.push(lone(1));
        let together = crate::harness::decided(store.hit(T0, &hits).await);
        let serial = memory();
        for (h, got) in hits.iter().zip(&together) {
            assert_eq!(got, &apply(&serial, T0, h).await, "{h:?}");
        }
        let admitted: Vec<bool> = together.iter().map(|o| o.admitted).collect();
        assert_eq!(admitted, [true, true, true, true, false, false, true, true], "{name}");
        for at in [T0, T0 + MINUTE] {
            assert_eq!(
                peek(&store, at, &lone(0)).await,
                peek(&serial, at, &lone(0)).await,
                "{name}"
            );
        }
    }
}
