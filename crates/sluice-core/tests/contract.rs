//! The store contract: every algorithm's behaviour, run against the in-memory store and against a real Redis, so the
//! two can never drift apart, and once more against Redis as the documented least-privilege ACL user, so that the
//! documented ACL allows every command the store sends. Time is passed explicitly.
//!
//! Each concern is a module of its own under `contract/`, whose cases `every_store!` runs over every store; this
//! root holds what they share: the units of time, the hits they build and the calls they make.

mod batches;
mod bounds;
mod buckets;
mod concurrency;
mod expiry;
mod forced;
mod peeks;
mod queue;
mod records;
mod redis_keys;
mod refunds;
mod reservations;
mod resets;
mod tiers;
mod windows;

use sluice_core::rules::Algorithm;
use sluice_core::store::{
    CounterKey, Hit, Outcome, ReservationSpec, Settled, Settlement, Store, TierSettled, TierSpec,
};

use crate::harness::tier;
use sluice_core::store::Mode;

const SECOND: u64 = 1_000_000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 3_600 * SECOND;

/// The four counting algorithms, the only ones a reservation holds.
const COUNTING: [Algorithm; 4] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
];

/// A hit on `tiers` at `cost`, carrying one field and a lease id: nothing recorded, forced or reserved.
fn hit(tiers: Vec<TierSpec>, cost: u64) -> Hit {
    Hit {
        tiers,
        cost,
        lease: "lease-1".into(),
        fields: vec![("k".into(), "v".into())],
        record: None,
        mode: Mode::Hit,
    }
}

/// One descriptor, one tier.
fn one(name: &str, algorithm: Algorithm, limit: u64, window_us: u64, cost: u64) -> Hit {
    let burst = if algorithm == Algorithm::LeakyBucket { 1 } else { limit };
    let mut t = tier(name, algorithm, limit, window_us, burst);
    if algorithm == Algorithm::FixedWindow {
        // As the limiter names a descriptor's one fixed window.
        t.key = t.key.plain();
    }
    hit(vec![t], cost)
}

/// `h` alone, counted at `now`.
async fn apply(store: &impl Store, now: u64, h: &Hit) -> Outcome {
    crate::harness::decided(store.hit(now, std::slice::from_ref(h)).await).remove(0)
}

/// `h` alone, answered at `now` and not counted.
async fn peek(store: &impl Store, now: u64, h: &Hit) -> Outcome {
    let peek = Hit {
        mode: Mode::Peek,
        ..h.clone()
    };
    crate::harness::decided(store.hit(now, std::slice::from_ref(&peek)).await).remove(0)
}

/// `h`, forced: a usage report, counted whatever the limits say.
fn forced(mut h: Hit) -> Hit {
    h.mode = Mode::of(true, h.reservation().cloned());
    h
}

/// `t`, counting its own cost instead of the hit's.
fn costing(mut t: TierSpec, cost: u64) -> TierSpec {
    t.cost = Some(cost);
    t
}

/// (used, remaining) of every tier.
fn counts(o: &Outcome) -> Vec<(u64, u64)> {
    o.tiers.iter().map(|t| (t.used, t.remaining)).collect()
}

/// One budget tier of `algorithm` on `k=<name>`: `limit` per `window`, a bucket of `limit` for both buckets.
fn budget(name: &str, algorithm: Algorithm, limit: u64, window: u64) -> TierSpec {
    tier(name, algorithm, limit, window, limit)
}

/// The record of the reservation `id` on the descriptor `k=<name>` of [`tier`].
fn reservation_key(name: &str, id: &str) -> CounterKey {
    CounterKey::builder("test:", "d")
        .entry("k", name)
        .finish()
        .reservation(id)
}

/// `h` (on the descriptor `k=<name>`), holding the reservation `id` for `ttl_us` if it is counted.
fn reserving(mut h: Hit, name: &str, id: &str, ttl_us: u64) -> Hit {
    h.mode = Mode::of(
        h.reports(),
        Some(ReservationSpec {
            key: reservation_key(name, id),
            ttl_us,
        }),
    );
    h
}

/// Settles the reservation `id` of `h`'s descriptor (`k=<name>`) with the actual cost `actual`.
async fn settle(store: &impl Store, now: u64, h: &Hit, name: &str, id: &str, actual: u64) -> Settled {
    let settlement = Settlement {
        tiers: h.tiers.clone(),
        cost: actual,
        reservation: reservation_key(name, id),
        reap: false,
    };
    store
        .settle(now, std::slice::from_ref(&settlement))
        .await
        .remove(0)
        .expect("the store settles")
}

/// What a `Done` settlement says, per tier: (what each tier settled, outcome).
fn done_tiers(settled: Settled) -> (Vec<TierSettled>, Outcome) {
    match settled {
        Settled::Done { tiers, outcome } => (tiers, outcome),
        Settled::Unknown => panic!("the reservation was not found"),
    }
}

/// What a `Done` settlement whose tiers all settled alike says: (estimate, charged, refunded, outcome).
fn done(settled: Settled) -> (u64, u64, u64, Outcome) {
    let (tiers, outcome) = done_tiers(settled);
    let first = tiers[0];
    assert!(tiers.iter().all(|t| *t == first), "the tiers settled alike: {tiers:?}");
    (first.estimate, first.charged, first.refunded, outcome)
}
