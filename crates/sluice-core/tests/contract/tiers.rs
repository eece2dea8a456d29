//! Several tiers on one descriptor: a hit is admitted only when every tier admits it and a denied hit charges none;
//! each tier may count a cost of its own, and a tier's cost of 0 is checked but never written.

use sluice_core::rules::Algorithm;
use sluice_core::store::Store;

use super::{HOUR, MINUTE, SECOND, apply, costing, counts, forced, hit, peek};
use crate::harness::{T0, tier};

every_store!(
    tiers_are_all_or_nothing,
    tiers_with_their_own_costs_admit_only_when_every_tier_fits,
    a_tier_cost_of_zero_is_checked_not_written,
);

async fn tiers_are_all_or_nothing(store: impl Store) {
    // 2 per second AND 3 per minute: the minute tier denies the 4th hit; a denied hit consumes from no tier.
    let tiers = vec![
        tier("mt", Algorithm::FixedWindow, 2, SECOND, 2),
        tier("mt", Algorithm::FixedWindow, 3, MINUTE, 3),
    ];
    let h = hit(tiers, 1);
    assert!(apply(&store, T0, &h).await.admitted);
    assert!(apply(&store, T0, &h).await.admitted);
    let o = apply(&store, T0, &h).await;
    assert!(!o.admitted);
    assert!(!o.tiers[0].ok && o.tiers[1].ok);
    let o = apply(&store, T0 + SECOND, &h).await;
    assert!(o.admitted, "the denied hit did not consume the minute tier");
    assert_eq!((o.tiers[0].remaining, o.tiers[1].remaining), (1, 0));
    let o = apply(&store, T0 + 2 * SECOND, &h).await;
    assert!(!o.admitted);
    assert!(o.tiers[0].ok && !o.tiers[1].ok);
    let p = peek(&store, T0 + 2 * SECOND, &h).await;
    assert_eq!(
        (p.tiers[0].used, p.tiers[1].used),
        (0, 3),
        "nothing charged to the second-window tier"
    );
}

async fn tiers_with_their_own_costs_admit_only_when_every_tier_fits(store: impl Store) {
    // Input tokens, 100 a minute; output tokens, 50 a minute; credits, a bucket of 1000 refilling 1000 an hour,
    // charged the hit's cost: the priced sum, input + 2 * output.
    let name = "tier-costs";
    let h = |input: u64, output: u64| {
        hit(
            vec![
                costing(tier(name, Algorithm::FixedWindow, 100, MINUTE, 100), input),
                costing(tier(name, Algorithm::SlidingWindow, 50, MINUTE, 50), output),
                tier(name, Algorithm::TokenBucket, 1_000, HOUR, 1_000),
            ],
            input + 2 * output,
        )
    };
    let o = apply(&store, T0, &h(60, 30)).await;
    assert!(o.admitted, "{o:?}");
    assert_eq!(counts(&o), [(60, 40), (30, 20), (120, 880)], "each tier its own cost");
    // 50 more input tokens do not fit; the output tokens and the credits would: nothing is charged.
    let o = apply(&store, T0, &h(50, 10)).await;
    assert!(!o.admitted && !o.tiers[0].ok && o.tiers[1].ok && o.tiers[2].ok, "{o:?}");
    assert_eq!(
        counts(&o),
        [(110, 0), (40, 20), (190, 880)],
        "each tier's outcome is its own cost's"
    );
    assert_eq!(o.tiers[0].retry_after_us, Some(50 * SECOND), "the input window's end");
    // 21 more output tokens do not fit, though the input tokens would.
    let o = apply(&store, T0, &h(10, 21)).await;
    assert!(!o.admitted && o.tiers[0].ok && !o.tiers[1].ok, "{o:?}");
    let p = peek(&store, T0, &h(1, 1)).await;
    assert_eq!(
        p.tiers.iter().map(|t| t.used).collect::<Vec<_>>(),
        [60, 30, 120],
        "no denied hit charged any tier"
    );
    // Both fit exactly: admitted, each tier charged its own.
    let o = apply(&store, T0, &h(40, 20)).await;
    assert!(o.admitted, "{o:?}");
    assert_eq!(counts(&o), [(100, 0), (50, 0), (200, 800)]);
    assert!(!apply(&store, T0, &h(0, 1)).await.admitted);
    let mut credits = h(0, 0);
    credits.cost = 10;
    let o = apply(&store, T0, &credits).await;
    assert!(o.admitted, "credits alone still fit: {o:?}");
    assert_eq!(counts(&o), [(100, 0), (50, 0), (210, 790)]);
}

async fn a_tier_cost_of_zero_is_checked_not_written(store: impl Store) {
    let name = "tier-cost-zero";
    let fixed = tier(name, Algorithm::FixedWindow, 3, MINUTE, 3);
    let leases = tier(name, Algorithm::Concurrency, 2, MINUTE, 2);
    let other = tier(name, Algorithm::SlidingWindow, 10, MINUTE, 10);
    let h = hit(
        vec![costing(fixed.clone(), 0), costing(leases.clone(), 0), other.clone()],
        2,
    );
    let o = apply(&store, T0, &h).await;
    assert!(o.admitted, "{o:?}");
    assert_eq!(counts(&o), [(0, 3), (0, 2), (2, 8)]);
    assert_eq!(o.tiers[1].id, None, "no lease taken");
    let p = peek(&store, T0, &hit(vec![fixed.clone(), leases.clone(), other.clone()], 1)).await;
    assert_eq!(
        p.tiers.iter().map(|t| t.used).collect::<Vec<_>>(),
        [0, 0, 2],
        "only the tier of a positive cost was written"
    );
    // Checked all the same: past its limit (a usage report), the tier denies the hit even at a cost of 0.
    let o = apply(&store, T0, &forced(hit(vec![fixed.clone()], 4))).await;
    assert_eq!(o.tiers[0].used, 4);
    let o = apply(&store, T0, &h).await;
    assert!(!o.admitted && !o.tiers[0].ok && o.tiers[1].ok && o.tiers[2].ok, "{o:?}");
    assert_eq!(peek(&store, T0, &hit(vec![other.clone()], 1)).await.tiers[0].used, 2);
    // A hit whose every tier's cost is 0 writes nothing, whatever the hit's cost; a lone fixed window included.
    let lone = tier("tier-cost-zero-lone", Algorithm::FixedWindow, 3, MINUTE, 3);
    let o = apply(&store, T0, &hit(vec![costing(lone.clone(), 0)], 5)).await;
    assert!(o.admitted && o.tiers[0].used == 0, "{o:?}");
    assert_eq!(peek(&store, T0, &hit(vec![lone], 1)).await.tiers[0].used, 0);
}
