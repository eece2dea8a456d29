//! Settlements far from their estimates: what a refund gives back once the window has rolled or the bucket has
//! drained (never more, never a bucket's arrival time before now), and actual costs of any size, bounded as any
//! cost is.

use sluice_core::rules::Algorithm;
use sluice_core::store::{Store, TierSettled};

use super::{
    COUNTING, HOUR, MINUTE, SECOND, apply, budget, done, done_tiers, forced, hit, one, peek, reserving, settle,
};
use crate::harness::{T0, tier};

every_store!(
    a_refund_after_the_window_rolled,
    a_bucket_refund_never_moves_the_arrival_time_before_now,
    huge_actual_costs_neither_panic_nor_wrap,
);

async fn a_refund_after_the_window_rolled(store: impl Store) {
    // A fixed window gives back nothing once its window has passed: 10 a minute, T0 is 10 s into its minute.
    let h = |cost| hit(vec![budget("res-roll-fw", Algorithm::FixedWindow, 10, MINUTE)], cost);
    assert!(
        apply(&store, T0, &reserving(h(8), "res-roll-fw", "a", HOUR))
            .await
            .admitted
    );
    assert!(apply(&store, T0 + MINUTE, &h(4)).await.admitted);
    let (estimate, charged, refunded, o) = done(settle(&store, T0 + MINUTE, &h(0), "res-roll-fw", "a", 0).await);
    assert_eq!(
        (estimate, charged, refunded),
        (8, 0, 0),
        "nothing came back to a window in force"
    );
    assert_eq!(o.tiers[0].used, 4, "but the new window keeps its count");
    // A sliding window gives it back to the previous window: 10 per 10 s, T0 starts a window.
    let w = 10 * SECOND;
    let mid = T0 + w + 5 * SECOND;
    for (name, hit_in_the_new_window) in [("res-roll-sw-a", false), ("res-roll-sw-b", true)] {
        let h = |cost| hit(vec![budget(name, Algorithm::SlidingWindow, 10, w)], cost);
        assert!(
            apply(&store, T0 + SECOND, &reserving(h(8), name, "a", HOUR))
                .await
                .admitted
        );
        let mut current = 0;
        if hit_in_the_new_window {
            let o = apply(&store, mid, &h(2)).await;
            assert_eq!((o.admitted, o.tiers[0].used), (true, 6), "{name}: half of 8, and 2");
            current = 2;
        } else {
            assert_eq!(peek(&store, mid, &h(1)).await.tiers[0].used, 4, "{name}: half of 8");
        }
        let (_, _, refunded, o) = done(settle(&store, mid, &h(0), name, "a", 2).await);
        assert_eq!(refunded, 6);
        assert_eq!(
            o.tiers[0].used,
            1 + current,
            "{name}: half of the 2 left, and the new window's"
        );
    }
    // Two windows on, nothing is left to give back.
    let h = |cost| hit(vec![budget("res-roll-sw-c", Algorithm::SlidingWindow, 10, w)], cost);
    assert!(
        apply(&store, T0 + SECOND, &reserving(h(8), "res-roll-sw-c", "a", HOUR))
            .await
            .admitted
    );
    assert!(apply(&store, T0 + 2 * w + SECOND, &h(3)).await.admitted);
    let (_, _, refunded, o) = done(settle(&store, T0 + 2 * w + SECOND, &h(0), "res-roll-sw-c", "a", 0).await);
    assert_eq!((refunded, o.tiers[0].used), (0, 3), "nothing came back");
}

async fn a_bucket_refund_never_moves_the_arrival_time_before_now(store: impl Store) {
    // 10 a second, a bucket of 5: one token every 100 ms.
    let h = |name: &str, cost| hit(vec![tier(name, Algorithm::TokenBucket, 10, SECOND, 5)], cost);
    assert!(
        apply(&store, T0, &reserving(h("res-tb-a", 3), "res-tb-a", "a", HOUR))
            .await
            .admitted
    );
    assert!(apply(&store, T0, &h("res-tb-a", 2)).await.admitted);
    let (_, _, refunded, o) = done(settle(&store, T0 + 100_000, &h("res-tb-a", 0), "res-tb-a", "a", 0).await);
    assert_eq!(refunded, 3);
    let t = &o.tiers[0];
    assert_eq!(
        (t.used, t.remaining, t.reset_after_us),
        (1, 4, 100_000),
        "the other hit's 2 tokens, 100 ms of them drained"
    );
    // A refund larger than what is left to drain leaves the bucket full at now, not earlier.
    assert!(
        apply(&store, T0, &reserving(h("res-tb-b", 5), "res-tb-b", "a", HOUR))
            .await
            .admitted
    );
    let now = T0 + 300_000;
    let (_, _, refunded, o) = done(settle(&store, now, &h("res-tb-b", 0), "res-tb-b", "a", 0).await);
    assert_eq!(refunded, 2, "3 of the 5 tokens had drained by now: 2 came back");
    let t = &o.tiers[0];
    assert_eq!((t.used, t.remaining, t.reset_after_us), (0, 5, 0));
    assert!(apply(&store, now, &h("res-tb-b", 5)).await.admitted);
    let o = apply(&store, now, &h("res-tb-b", 1)).await;
    assert_eq!((o.admitted, o.tiers[0].retry_after_us), (false, Some(100_000)));
    // A slow bucket (1 a year, 3 of them) gives back years exactly.
    let year = 31_536_000 * SECOND;
    let slow = |cost| hit(vec![tier("res-tb-slow", Algorithm::TokenBucket, 1, year, 3)], cost);
    assert!(
        apply(&store, T0, &reserving(slow(3), "res-tb-slow", "a", HOUR))
            .await
            .admitted
    );
    let (_, _, _, o) = done(settle(&store, T0 + SECOND, &slow(0), "res-tb-slow", "a", 1).await);
    assert_eq!((o.tiers[0].used, o.tiers[0].reset_after_us), (1, year - SECOND));
    // The leaky bucket alike: 4 a second, burst 1.
    let l = |cost| one("res-lb", Algorithm::LeakyBucket, 4, SECOND, cost);
    assert!(apply(&store, T0, &reserving(l(1), "res-lb", "a", HOUR)).await.admitted);
    assert!(!apply(&store, T0 + 100_000, &l(1)).await.admitted);
    let (_, _, _, o) = done(settle(&store, T0 + 100_000, &l(0), "res-lb", "a", 0).await);
    assert_eq!(o.tiers[0].reset_after_us, 0);
    assert!(apply(&store, T0 + 100_000, &l(1)).await.admitted);
    assert!(
        !apply(&store, T0 + 100_001, &l(1)).await.admitted,
        "the hit's own token, from now"
    );
}

async fn huge_actual_costs_neither_panic_nor_wrap(store: impl Store) {
    let roomy = u64::from(u32::MAX);
    for algorithm in COUNTING {
        let name = format!("res-huge-{}", algorithm.name());
        let tiers = vec![
            budget(&name, algorithm, 3, MINUTE),
            tier(&name, Algorithm::FixedWindow, roomy, HOUR, roomy),
        ];
        let h = |cost| hit(tiers.clone(), cost);
        assert!(apply(&store, T0, &reserving(h(1), &name, "a", u64::MAX)).await.admitted);
        // Bounded as any cost, each tier at its own capacity + 1 (once the largest tier's capacity + 1 for both).
        let (settled, o) = done_tiers(settle(&store, T0, &h(0), &name, "a", u64::MAX).await);
        let charged = |estimate, actual| TierSettled {
            estimate,
            actual,
            charged: actual - estimate,
            refunded: 0,
        };
        assert_eq!(settled, [charged(1, 4), charged(1, roomy + 1)], "{algorithm:?}");
        assert!(!o.admitted && o.tiers[0].remaining == 0, "{algorithm:?}: {o:?}");
        assert_eq!((o.tiers[1].used, o.tiers[1].remaining), (roomy + 1, 0), "{algorithm:?}");
        // A forced reservation of any size holds the capacity + 1, and gives it all back.
        let f = |cost| hit(vec![tier(&format!("{name}-f"), algorithm, 3, MINUTE, 3)], cost);
        let o = apply(
            &store,
            T0,
            &reserving(forced(f(u64::MAX)), &format!("{name}-f"), "a", HOUR),
        )
        .await;
        assert!(!o.admitted, "{algorithm:?}: {o:?}");
        let (estimate, _, refunded, o) = done(settle(&store, T0, &f(0), &format!("{name}-f"), "a", 0).await);
        assert_eq!((estimate, refunded), (4, 4), "{algorithm:?}");
        assert!(o.admitted && o.tiers[0].used == 0, "{algorithm:?}: {o:?}");
    }
    // The largest bucket the configuration takes (u32::MAX a year, as many tokens), emptied and given back.
    let year = 31_536_000 * SECOND;
    let big = |cost| {
        hit(
            vec![tier("res-huge-big", Algorithm::TokenBucket, roomy, year, roomy)],
            cost,
        )
    };
    assert!(
        apply(&store, T0, &reserving(big(roomy), "res-huge-big", "a", HOUR))
            .await
            .admitted
    );
    assert!(!peek(&store, T0, &big(1)).await.admitted);
    let (_, _, refunded, o) = done(settle(&store, T0, &big(0), "res-huge-big", "a", 0).await);
    assert_eq!((refunded, o.tiers[0].used, o.tiers[0].reset_after_us), (roomy, 0, 0));
    // Debt past the bucket, then a reservation settled far above its estimate: counts stop where forced ones do.
    let slow = |cost| hit(vec![tier("res-huge-slow", Algorithm::TokenBucket, 1, year, 3)], cost);
    for i in 0..5 {
        let id = i.to_string();
        apply(&store, T0, &reserving(forced(slow(1)), "res-huge-slow", &id, HOUR)).await;
        done(settle(&store, T0, &slow(0), "res-huge-slow", &id, u64::MAX).await);
    }
    let p = peek(&store, T0, &slow(1)).await;
    assert_eq!(
        p.tiers[0].reset_after_us,
        3 * year + (1 << 48),
        "the debt stops at 2^48 us"
    );
}
