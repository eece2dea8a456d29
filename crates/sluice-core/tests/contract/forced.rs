//! Forced hits, the usage reports: counted whatever the limits say, in every tier and each at its own cost, up to
//! a tier's capacity + 1 (a bucket runs into debt that drains at its rate); a forced hit of cost 0 writes nothing,
//! and one beside a tier that does not count is an ordinary hit.

use sluice_core::rules::Algorithm;
use sluice_core::store::{Hit, Store};

use super::{MINUTE, SECOND, apply, costing, counts, forced, hit, one, peek};
use crate::harness::{RedisServer, T0, memory, redis_store, tier};

every_store!(
    a_forced_fixed_window_hit_past_the_limit_is_counted,
    a_forced_sliding_window_hit_past_the_limit_is_counted,
    a_forced_bucket_hit_runs_into_debt_that_drains_at_the_refill_rate,
    a_forced_hit_counts_in_every_tier_even_those_it_does_not_fit,
    a_forced_hit_with_a_tier_that_does_not_count_is_an_ordinary_hit,
    a_forced_hit_of_cost_zero_writes_nothing,
    a_forced_hit_of_any_size_is_counted_as_the_capacity_plus_one,
    a_forced_hit_with_per_tier_costs_counts_each,
);

async fn a_forced_fixed_window_hit_past_the_limit_is_counted(store: impl Store) {
    // 3 a minute; T0 is 10 s into its minute.
    let h = |cost| one("force-fw", Algorithm::FixedWindow, 3, MINUTE, cost);
    assert!(apply(&store, T0, &h(1)).await.admitted);
    let o = apply(&store, T0, &forced(h(3))).await;
    assert!(!o.admitted && !o.tiers[0].ok, "it did not fit: {o:?}");
    let t = &o.tiers[0];
    assert_eq!((t.used, t.remaining), (4, 0), "but it was counted");
    assert_eq!((t.reset_after_us, t.retry_after_us), (50 * SECOND, Some(50 * SECOND)));
    let o = apply(&store, T0 + SECOND, &h(1)).await;
    assert!(!o.admitted, "the next ordinary hit is denied: {o:?}");
    assert_eq!(peek(&store, T0 + SECOND, &h(0)).await.tiers[0].used, 5);
    let o = apply(&store, T0 + MINUTE, &h(1)).await;
    assert!(o.admitted, "the next window starts empty");
    assert_eq!(o.tiers[0].used, 1);
}

async fn a_forced_sliding_window_hit_past_the_limit_is_counted(store: impl Store) {
    // 10 per 10 s window.
    let w = 10 * SECOND;
    let start = T0 - T0 % w;
    let h = |cost| one("force-sw", Algorithm::SlidingWindow, 10, w, cost);
    let o = apply(&store, start + SECOND, &forced(h(6))).await;
    assert!(o.admitted, "a forced hit that fits is an ordinary one: {o:?}");
    assert_eq!((o.tiers[0].used, o.tiers[0].remaining), (6, 4));
    let o = apply(&store, start + SECOND, &forced(h(6))).await;
    assert!(!o.admitted && !o.tiers[0].ok, "{o:?}");
    let t = &o.tiers[0];
    assert_eq!((t.used, t.remaining, t.reset_after_us), (12, 0, 2 * w - SECOND));
    assert!(t.retry_after_us.is_some_and(|r| r > 0), "{o:?}");
    assert!(
        !apply(&store, start + SECOND, &h(1)).await.admitted,
        "the next ordinary hit is denied"
    );
    // Half way through the next window, half of the 12 still counts: 4 places, not the 5 that 10 would leave.
    let mid = start + w + 5 * SECOND;
    let p = peek(&store, mid, &h(1)).await;
    assert_eq!((p.tiers[0].used, p.tiers[0].remaining), (6, 4), "{p:?}");
}

async fn a_forced_bucket_hit_runs_into_debt_that_drains_at_the_refill_rate(store: impl Store) {
    // 10 per second, bucket of 5: one token every 100 ms.
    let t = tier("force-tb", Algorithm::TokenBucket, 10, SECOND, 5);
    let h = |cost| hit(vec![t.clone()], cost);
    assert!(apply(&store, T0, &forced(h(5))).await.admitted);
    let o = apply(&store, T0, &forced(h(3))).await;
    assert!(!o.admitted, "{o:?}");
    let out = &o.tiers[0];
    assert_eq!(
        out.retry_after_us,
        Some(300_000),
        "as an ordinary hit of 3 would be told"
    );
    assert_eq!(
        (out.used, out.remaining, out.reset_after_us),
        (5, 0, 800_000),
        "3 tokens of debt"
    );
    let o = apply(&store, T0, &h(1)).await;
    assert!(!o.admitted);
    assert_eq!(
        o.tiers[0].retry_after_us,
        Some(400_000),
        "the debt, then the token itself"
    );
    assert!(!apply(&store, T0 + 399_999, &h(1)).await.admitted);
    assert!(apply(&store, T0 + 400_000, &h(1)).await.admitted);
    // The leaky bucket alike: 4 per second, burst 1.
    let l = |cost| one("force-lb", Algorithm::LeakyBucket, 4, SECOND, cost);
    assert!(apply(&store, T0, &forced(l(1))).await.admitted);
    let o = apply(&store, T0, &forced(l(1))).await;
    assert_eq!((o.admitted, o.tiers[0].reset_after_us), (false, 500_000), "{o:?}");
    assert!(!apply(&store, T0 + 499_999, &l(1)).await.admitted);
    assert!(apply(&store, T0 + 500_000, &l(1)).await.admitted);
}

async fn a_forced_hit_counts_in_every_tier_even_those_it_does_not_fit(store: impl Store) {
    // 2 per second AND 10 per minute: 3 fits only the minute tier, and both count it.
    let tiers = vec![
        tier("force-mt", Algorithm::FixedWindow, 2, SECOND, 2),
        tier("force-mt", Algorithm::FixedWindow, 10, MINUTE, 10),
    ];
    let o = apply(&store, T0, &forced(hit(tiers.clone(), 3))).await;
    assert!(!o.admitted, "{o:?}");
    assert_eq!((o.tiers[0].ok, o.tiers[0].used, o.tiers[0].remaining), (false, 3, 0));
    assert_eq!(
        (o.tiers[1].ok, o.tiers[1].used, o.tiers[1].remaining),
        (true, 3, 7),
        "what is left after the count"
    );
    let p = peek(&store, T0 + SECOND, &hit(tiers, 1)).await;
    assert_eq!(
        (p.tiers[0].used, p.tiers[1].used),
        (0, 3),
        "the second's window is new; the minute's is not"
    );
}

async fn a_forced_hit_with_a_tier_that_does_not_count_is_an_ordinary_hit(store: impl Store) {
    // A sliding log keeps a time per hit: forcing it could make it hold any number of them.
    let tiers = vec![
        tier("force-mixed", Algorithm::FixedWindow, 2, MINUTE, 2),
        tier("force-mixed", Algorithm::SlidingLog, 5, MINUTE, 5),
    ];
    let o = apply(&store, T0, &forced(hit(tiers.clone(), 3))).await;
    assert!(!o.admitted && !o.tiers[0].ok && o.tiers[1].ok, "{o:?}");
    assert_eq!((o.tiers[0].remaining, o.tiers[1].remaining), (0, 5), "nothing counted");
    let p = peek(&store, T0, &hit(tiers, 1)).await;
    assert_eq!((p.tiers[0].used, p.tiers[1].used), (0, 0));
}

async fn a_forced_hit_of_cost_zero_writes_nothing(store: impl Store) {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ] {
        let name = format!("force-zero-{}", algorithm.name());
        let h = |cost| one(&name, algorithm, 3, MINUTE, cost);
        let capacity = if algorithm == Algorithm::LeakyBucket { 1 } else { 3 };
        let o = apply(&store, T0, &forced(h(0))).await;
        assert!(o.admitted, "{algorithm:?}: {o:?}");
        assert_eq!((o.tiers[0].used, o.tiers[0].remaining), (0, capacity), "{algorithm:?}");
        assert_eq!(peek(&store, T0, &h(1)).await.tiers[0].used, 0, "{algorithm:?}");
        // Nor on a counter it would not fit: the forced hit of 0 reports, as an ordinary one does.
        apply(&store, T0, &forced(h(capacity + 1))).await;
        let before = peek(&store, T0, &h(0)).await;
        let o = apply(&store, T0, &forced(h(0))).await;
        assert_eq!(o.tiers[0].used, before.tiers[0].used, "{algorithm:?}");
        assert_eq!(peek(&store, T0, &h(0)).await, before, "{algorithm:?}");
    }
}

async fn a_forced_hit_of_any_size_is_counted_as_the_capacity_plus_one(store: impl Store) {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let name = format!("force-huge-{}", algorithm.name());
        let h = |cost| one(&name, algorithm, 3, MINUTE, cost);
        for reports in 1..=3 {
            let o = apply(&store, T0, &forced(h(u64::MAX))).await;
            assert!(!o.admitted, "{algorithm:?}: {o:?}");
            assert_eq!(o.tiers[0].retry_after_us, None, "{algorithm:?}: it can never fit");
            assert_eq!(
                (o.tiers[0].used, o.tiers[0].remaining),
                (4 * reports, 0),
                "{algorithm:?}"
            );
        }
        assert_eq!(peek(&store, T0, &h(1)).await.tiers[0].used, 12, "{algorithm:?}");
    }
    // Beside a roomy tier each tier counts its own capacity + 1. (The bound was once the largest tier's capacity + 1
    // for every tier, and the small tier counted roomy + 1 too; any count above its limit answers the same.)
    let roomy = u64::from(u32::MAX);
    let tiers = vec![
        tier("force-huge-tiered", Algorithm::FixedWindow, 3, MINUTE, 3),
        tier(
            "force-huge-tiered",
            Algorithm::FixedWindow,
            roomy,
            3_600 * SECOND,
            roomy,
        ),
    ];
    let o = apply(&store, T0, &forced(hit(tiers, u64::MAX))).await;
    assert_eq!((o.tiers[0].used, o.tiers[1].used), (4, roomy + 1), "{o:?}");
    // A bucket is charged its burst + 1 tokens; 10 per second, bucket of 3.
    let t = tier("force-huge-tb", Algorithm::TokenBucket, 10, SECOND, 3);
    let o = apply(&store, T0, &forced(hit(vec![t.clone()], u64::MAX))).await;
    assert_eq!((o.admitted, o.tiers[0].retry_after_us), (false, None), "{o:?}");
    assert_eq!(o.tiers[0].reset_after_us, 400_000, "4 tokens");
    assert_eq!(
        peek(&store, T0, &hit(vec![t], 1)).await.tiers[0].retry_after_us,
        Some(200_000)
    );
    // However many reports arrive, a bucket's debt stops 2^48 us past an empty bucket: 1 a year, bucket of 3.
    let year = 31_536_000 * SECOND;
    let slow = tier("force-huge-slow", Algorithm::TokenBucket, 1, year, 3);
    let tolerance = 3 * year;
    let mut reset = 0;
    for _ in 0..5 {
        let o = apply(&store, T0, &forced(hit(vec![slow.clone()], u64::MAX))).await;
        assert!(o.tiers[0].reset_after_us > reset || o.tiers[0].reset_after_us == tolerance + (1 << 48));
        reset = o.tiers[0].reset_after_us;
    }
    assert_eq!(reset, tolerance + (1 << 48));
    let p = peek(&store, T0, &hit(vec![slow], 1)).await;
    assert_eq!(
        p.tiers[0].retry_after_us,
        Some((1 << 48) + year),
        "the debt, then the token"
    );
}

async fn a_forced_hit_with_per_tier_costs_counts_each(store: impl Store) {
    // 5 a minute; a bucket of 5 refilling 10 a second; and 100 a minute charged the hit's cost.
    let name = "force-tier-costs";
    let h = |a, b, cost| {
        forced(hit(
            vec![
                costing(tier(name, Algorithm::FixedWindow, 5, MINUTE, 5), a),
                costing(tier(name, Algorithm::TokenBucket, 10, SECOND, 5), b),
                tier(name, Algorithm::SlidingWindow, 100, MINUTE, 100),
            ],
            cost,
        ))
    };
    let o = apply(&store, T0, &h(7, 2, 3)).await;
    assert!(!o.admitted, "{o:?}");
    assert_eq!(
        o.tiers.iter().map(|t| (t.ok, t.retry_after_us)).collect::<Vec<_>>(),
        [(false, None), (true, Some(0)), (true, Some(0))],
        "an ordinary hit's answers"
    );
    assert_eq!(
        counts(&o),
        [(6, 0), (2, 3), (3, 97)],
        "each tier counted its own cost, the first its capacity + 1"
    );
    // Costs of any size, each bounded at its own tier's capacity + 1; a tier whose cost is 0 is not written.
    let o = apply(&store, T0, &h(u64::MAX, 0, u64::MAX)).await;
    assert_eq!(counts(&o), [(12, 0), (2, 3), (104, 0)], "{o:?}");
    let p = peek(&store, T0, &h(1, 1, 1)).await;
    assert_eq!(p.tiers.iter().map(|t| t.used).collect::<Vec<_>>(), [12, 2, 104]);
}

/// The four counting algorithms, each with a key of its own under `name`: 3 a minute, a bucket of 3 (1 leaky).
fn counting(name: &str) -> Vec<Hit> {
    [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ]
    .into_iter()
    .map(|a| one(&format!("{name}-{}", a.name()), a, 3, MINUTE, 0))
    .collect()
}

#[tokio::test]
async fn a_forced_hit_of_cost_zero_creates_no_state() {
    let store = memory();
    for h in counting("force-none") {
        apply(&store, T0, &forced(h)).await;
    }
    assert!(store.is_empty());
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    for h in counting("force-none") {
        apply(&store, T0, &forced(h)).await;
    }
    assert_eq!(redis.snapshot(), [], "no key written");
}

/// Counts that forced hits keep pushing stop where the scripts' doubles are still exact: a fixed window's at 2^52, a
/// sliding window's current count at 2^51 (the memory store's twin is in `store/memory.rs`). Reaching them by hits
/// takes a million calls, so the state is written directly.
#[tokio::test]
async fn redis_forced_counts_stop_at_their_bounds() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    for (algorithm, bound) in [
        (Algorithm::FixedWindow, 1u64 << 52),
        (Algorithm::SlidingWindow, 1 << 51),
    ] {
        let h = forced(one("force-bound", algorithm, 3, MINUTE, 5));
        let key = &h.tiers[0].key;
        let start = T0 - T0 % MINUTE;
        // A lone fixed window keeps a string per window; a sliding window, a record in its packed state.
        let window = key.window(start);
        let count = || match algorithm {
            Algorithm::FixedWindow => redis
                .cli(&["--raw", "GET", window.as_str()])
                .trim()
                .parse()
                .unwrap_or(0),
            _ => redis.record(key).map_or(0, |r| r[2]),
        };
        match algorithm {
            Algorithm::FixedWindow => {
                redis.cli(&["SET", window.as_str(), &(bound - 1).to_string(), "PX", "60000"]);
            }
            _ => redis.set_record(key, [start + 2 * MINUTE, start, bound - 1, 0], 60_000),
        }
        let o = apply(&store, T0, &h).await;
        assert_eq!(o.tiers[0].used, bound - 1 + 4, "{algorithm:?}: the cost counts as 4");
        assert_eq!(count(), bound, "{algorithm:?}");
        apply(&store, T0, &h).await;
        assert_eq!(count(), bound, "{algorithm:?}");
    }
}
