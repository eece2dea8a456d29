//! The store contract: every algorithm's behaviour, run against the in-memory store and against a real Redis, so the
//! two can never drift apart, and once more against Redis as the documented least-privilege ACL user, so that the
//! documented ACL allows every command the store sends. Time is passed explicitly.

use sluice_core::rules::Algorithm;
use std::sync::Arc;

use sluice_core::store::{
    CounterKey, Hit, Outcome, RecordSpec, ReservationSpec, Settled, Settlement, Store, TierSettled, TierSpec,
};

use crate::harness::{RedisServer, T0, memory, redis_store, tier};
use sluice_core::store::{Counters, Reservations};

const SECOND: u64 = 1_000_000;
const MINUTE: u64 = 60 * SECOND;

fn hit(tiers: Vec<TierSpec>, cost: u64) -> Hit {
    Hit {
        tiers,
        cost,
        lease: "lease-1".into(),
        fields: vec![("k".into(), "v".into())],
        record: None,
        force: false,
        reservation: None,
    }
}

/// One descriptor, one tier.
fn one(name: &str, algorithm: Algorithm, limit: u64, window_us: u64, cost: u64) -> Hit {
    let burst = if algorithm == Algorithm::LeakyBucket { 1 } else { limit };
    hit(vec![tier(name, algorithm, limit, window_us, burst)], cost)
}

async fn apply(store: &impl Store, now: u64, h: &Hit) -> Outcome {
    crate::harness::decided(store.hit(now, std::slice::from_ref(h)).await).remove(0)
}

async fn peek(store: &impl Store, now: u64, h: &Hit) -> Outcome {
    crate::harness::decided(store.peek(now, std::slice::from_ref(h)).await).remove(0)
}

every_store!(
    fixed_window_counts_denials_like_the_reference,
    fixed_window_cost_zero_reads_without_creating,
    sliding_window_weighs_the_previous_window,
    sliding_log_is_exact_and_retry_is_exact,
    token_bucket_bursts_then_refills,
    leaky_bucket_spaces_hits_evenly,
    concurrency_leases_release_and_expire,
    queue_admits_until_full_and_returns_ids,
    tiers_are_all_or_nothing,
    records_keep_the_last_values,
    peek_never_changes_anything,
    reset_deletes_exactly_the_given_keys,
    reset_keeps_streams_that_hold_entries,
    many_descriptors_in_one_call,
    extreme_windows_costs_and_clocks,
    a_cost_that_can_never_fit_is_denied_and_consumes_nothing,
    limits_up_to_u32_max_in_every_unit,
    a_forced_fixed_window_hit_past_the_limit_is_counted,
    a_forced_sliding_window_hit_past_the_limit_is_counted,
    a_forced_bucket_hit_runs_into_debt_that_drains_at_the_refill_rate,
    a_forced_hit_counts_in_every_tier_even_those_it_does_not_fit,
    a_forced_hit_with_a_tier_that_does_not_count_is_an_ordinary_hit,
    a_forced_hit_of_cost_zero_writes_nothing,
    a_forced_hit_of_any_size_is_counted_as_the_capacity_plus_one,
    concurrent_reservations_never_admit_more_than_the_budget,
    settle_refunds_and_the_freed_budget_admits_more,
    settle_charges_more_and_the_next_hit_is_denied,
    an_unsettled_reservation_expires_and_stays_charged_at_its_estimate,
    a_reservation_settles_once,
    a_refund_after_the_window_rolled,
    a_bucket_refund_never_moves_the_arrival_time_before_now,
    huge_actual_costs_neither_panic_nor_wrap,
    settlements_in_one_call_are_independent,
    only_a_counted_hit_on_counting_tiers_holds_a_reservation,
    tiers_with_their_own_costs_admit_only_when_every_tier_fits,
    a_tier_cost_of_zero_is_checked_not_written,
    reserve_per_tier_estimates_then_settle_per_tier_actuals,
    a_forced_hit_with_per_tier_costs_counts_each,
    hits_on_one_counter_in_one_call_are_answered_as_serial_hits,
    hits_on_one_bucket_in_one_call_are_answered_as_serial_hits,
);

/// `t`, counting its own cost instead of the hit's.
fn costing(mut t: TierSpec, cost: u64) -> TierSpec {
    t.cost = Some(cost);
    t
}

/// (used, remaining) of every tier.
fn counts(o: &Outcome) -> Vec<(u64, u64)> {
    o.tiers.iter().map(|t| (t.used, t.remaining)).collect()
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

async fn reserve_per_tier_estimates_then_settle_per_tier_actuals(store: impl Store) {
    for algorithm in COUNTING {
        // Input tokens (100 an hour), output tokens (a sliding window of 100 per 2 hours), and credits (1000 a day)
        // charged the hit's cost.
        let name = format!("res-tiers-{}", algorithm.name());
        let h = |input, output, credits| {
            hit(
                vec![
                    costing(budget(&name, algorithm, 100, HOUR), input),
                    costing(budget(&name, Algorithm::SlidingWindow, 100, 2 * HOUR), output),
                    budget(&name, Algorithm::FixedWindow, 1_000, 24 * HOUR),
                ],
                credits,
            )
        };
        let o = apply(&store, T0, &reserving(h(30, 10, 50), &name, "a", HOUR)).await;
        assert!(o.admitted, "{algorithm:?}: {o:?}");
        assert_eq!(
            o.tiers.iter().map(|t| t.used).collect::<Vec<_>>(),
            [30, 10, 50],
            "{algorithm:?}"
        );
        // Fewer input tokens than reserved, more output tokens, the credits as estimated.
        let (settled, o) = done_tiers(settle(&store, T0, &h(20, 25, 0), &name, "a", 50).await);
        let tier = |estimate, actual, charged, refunded| TierSettled {
            estimate,
            actual,
            charged,
            refunded,
        };
        assert_eq!(
            settled,
            [tier(30, 20, 0, 10), tier(10, 25, 15, 0), tier(50, 50, 0, 0)],
            "{algorithm:?}"
        );
        assert!(o.admitted, "{algorithm:?}: {o:?}");
        assert_eq!(counts(&o), [(20, 80), (25, 75), (50, 950)], "{algorithm:?}");
        assert_eq!(
            peek(&store, T0, &h(1, 1, 1)).await,
            o,
            "{algorithm:?}: the outcome is a peek of 1"
        );
        // What the refund freed is there; what the charge took is gone.
        assert!(!apply(&store, T0, &h(80, 76, 1)).await.admitted, "{algorithm:?}");
        assert!(apply(&store, T0, &h(80, 75, 1)).await.admitted, "{algorithm:?}");
        assert_eq!(
            settle(&store, T0, &h(0, 0, 0), &name, "a", 0).await,
            Settled::Unknown,
            "{algorithm:?}: settled once"
        );
        // A settlement naming other tiers than the reservation finds nothing and leaves the record.
        assert!(
            apply(&store, T0, &reserving(h(0, 0, 5), &name, "b", HOUR))
                .await
                .admitted
        );
        let mut fewer = h(0, 0, 0);
        fewer.tiers.pop();
        assert_eq!(
            settle(&store, T0, &fewer, &name, "b", 0).await,
            Settled::Unknown,
            "{algorithm:?}"
        );
        let (settled, _) = done_tiers(settle(&store, T0, &h(0, 0, 0), &name, "b", 0).await);
        assert_eq!(
            settled,
            [tier(0, 0, 0, 0), tier(0, 0, 0, 0), tier(5, 0, 0, 5)],
            "{algorithm:?}"
        );
    }
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

/// `h`, forced: a usage report, counted whatever the limits say.
fn forced(mut h: Hit) -> Hit {
    h.force = true;
    h
}

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

const HOUR: u64 = 3_600 * SECOND;

/// The four counting algorithms, the only ones a reservation holds.
const COUNTING: [Algorithm; 4] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
];

/// The record of the reservation `id` on the descriptor `k=<name>` of [`tier`].
fn reservation_key(name: &str, id: &str) -> CounterKey {
    CounterKey::builder("test:", "d")
        .entry("k", name)
        .finish()
        .reservation(id)
}

/// `h` (on the descriptor `k=<name>`), holding the reservation `id` for `ttl_us` if it is counted.
fn reserving(mut h: Hit, name: &str, id: &str, ttl_us: u64) -> Hit {
    h.reservation = Some(ReservationSpec {
        key: reservation_key(name, id),
        ttl_us,
    });
    h
}

/// Settles the reservation `id` of `h`'s descriptor (`k=<name>`) with the actual cost `actual`.
async fn settle(store: &impl Store, now: u64, h: &Hit, name: &str, id: &str, actual: u64) -> Settled {
    let settlement = Settlement {
        hit: Hit {
            cost: actual,
            reservation: None,
            ..h.clone()
        },
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

/// One budget tier of `algorithm` on `k=<name>`: `limit` per `window`, a bucket of `limit` for both buckets.
fn budget(name: &str, algorithm: Algorithm, limit: u64, window: u64) -> TierSpec {
    tier(name, algorithm, limit, window, limit)
}

async fn concurrent_reservations_never_admit_more_than_the_budget(store: impl Store) {
    // 100 an hour; beside it a roomy daily tier, so that a lone fixed window's counted denials do not blur the budget.
    let store = Arc::new(store);
    for algorithm in COUNTING {
        let name = format!("res-many-{}", algorithm.name());
        let tiers = vec![
            budget(&name, algorithm, 100, HOUR),
            tier(&name, Algorithm::FixedWindow, 1_000_000, 24 * HOUR, 1_000_000),
        ];
        let spawn_reservations = |round: &'static str, reserve: bool| {
            (0..64)
                .map(|i| {
                    let (store, name) = (store.clone(), name.clone());
                    let mut h = hit(tiers.clone(), 3);
                    if reserve {
                        h = reserving(h, &name, &format!("{round}{i}"), HOUR);
                    }
                    tokio::spawn(async move { crate::harness::decided(store.hit(T0, &[h]).await).remove(0) })
                })
                .collect::<Vec<_>>()
        };
        let mut admitted = Vec::new();
        for (i, task) in spawn_reservations("r", true).into_iter().enumerate() {
            if task.await.unwrap().admitted {
                admitted.push(i);
            }
        }
        assert_eq!(admitted.len(), 33, "{algorithm:?}: 33 reservations of 3 fit 100");
        // Every reservation settled twice at once, each at 1: exactly the admitted ones are found, once each.
        let settles: Vec<_> = (0..64)
            .flat_map(|i| [i, i])
            .map(|i| {
                let (store, name, tiers) = (store.clone(), name.clone(), tiers.clone());
                tokio::spawn(async move {
                    let h = hit(tiers, 1);
                    (i, settle(&*store, T0, &h, &name, &format!("r{i}"), 1).await)
                })
            })
            .collect();
        let mut found = Vec::new();
        for task in settles {
            match task.await.unwrap() {
                (i, settled @ Settled::Done { .. }) => {
                    let (estimate, charged, refunded, _) = done(settled);
                    assert_eq!((estimate, charged, refunded), (3, 0, 2), "{algorithm:?}");
                    found.push(i);
                }
                (_, Settled::Unknown) => {}
            }
        }
        found.sort_unstable();
        assert_eq!(found, admitted, "{algorithm:?}: each admitted reservation settles once");
        // 33 are now charged 1 each: 67 left, 22 more hits of 3.
        let mut more = 0;
        for task in spawn_reservations("s", false) {
            more += usize::from(task.await.unwrap().admitted);
        }
        assert_eq!(more, 22, "{algorithm:?}: the refunds freed the budget");
    }
}

async fn settle_refunds_and_the_freed_budget_admits_more(store: impl Store) {
    // 10 a minute (a bucket of 10 refilling 10 a minute).
    for algorithm in COUNTING {
        let name = format!("res-refund-{}", algorithm.name());
        let h = |cost| hit(vec![budget(&name, algorithm, 10, MINUTE)], cost);
        let o = apply(&store, T0, &reserving(h(8), &name, "a", MINUTE)).await;
        assert!(o.admitted && o.tiers[0].used == 8, "{algorithm:?}: {o:?}");
        assert!(!peek(&store, T0, &h(3)).await.admitted, "{algorithm:?}");
        let (estimate, charged, refunded, o) = done(settle(&store, T0 + SECOND, &h(0), &name, "a", 2).await);
        assert_eq!((estimate, charged, refunded), (8, 0, 6), "{algorithm:?}");
        assert!(o.admitted, "{algorithm:?}: {o:?}");
        assert_eq!((o.tiers[0].used, o.tiers[0].remaining), (2, 8), "{algorithm:?}");
        assert_eq!(
            peek(&store, T0 + SECOND, &h(1)).await,
            o,
            "{algorithm:?}: the outcome is a peek of 1"
        );
        assert!(apply(&store, T0 + SECOND, &h(8)).await.admitted, "{algorithm:?}");
        assert!(!apply(&store, T0 + SECOND, &h(1)).await.admitted, "{algorithm:?}");
    }
}

async fn settle_charges_more_and_the_next_hit_is_denied(store: impl Store) {
    for algorithm in COUNTING {
        let name = format!("res-charge-{}", algorithm.name());
        let h = |cost| hit(vec![budget(&name, algorithm, 10, MINUTE)], cost);
        assert!(apply(&store, T0, &reserving(h(2), &name, "a", MINUTE)).await.admitted);
        let (estimate, charged, refunded, o) = done(settle(&store, T0, &h(0), &name, "a", 9).await);
        assert_eq!((estimate, charged, refunded), (2, 7, 0), "{algorithm:?}");
        assert!(o.admitted, "{algorithm:?}: one place is left: {o:?}");
        assert_eq!((o.tiers[0].used, o.tiers[0].remaining), (9, 1), "{algorithm:?}");
        assert!(!peek(&store, T0, &h(2)).await.admitted, "{algorithm:?}");
        // Past the limit, as a forced hit is counted.
        assert!(apply(&store, T0, &reserving(h(1), &name, "b", MINUTE)).await.admitted);
        let (estimate, charged, _, o) = done(settle(&store, T0, &h(0), &name, "b", 5).await);
        assert_eq!((estimate, charged), (1, 4), "{algorithm:?}");
        let t = &o.tiers[0];
        assert!(
            !o.admitted && !t.ok && t.remaining == 0 && t.used >= 10,
            "{algorithm:?}: {o:?}"
        );
        assert!(t.retry_after_us.is_some_and(|r| r > 0), "{algorithm:?}: {o:?}");
        let o = apply(&store, T0, &h(1)).await;
        assert!(!o.admitted, "{algorithm:?}: {o:?}");
    }
}

async fn an_unsettled_reservation_expires_and_stays_charged_at_its_estimate(store: impl Store) {
    // 10 an hour (a bucket refills one every 6 minutes); the reservations live 30 s.
    let ttl = 30 * SECOND;
    for algorithm in COUNTING {
        let name = format!("res-expire-{}", algorithm.name());
        let h = |cost| hit(vec![budget(&name, algorithm, 10, HOUR)], cost);
        assert!(apply(&store, T0, &reserving(h(5), &name, "a", ttl)).await.admitted);
        assert!(apply(&store, T0, &reserving(h(5), &name, "b", ttl)).await.admitted);
        let (estimate, charged, refunded, o) = done(settle(&store, T0 + ttl - 1, &h(0), &name, "a", 5).await);
        assert_eq!(
            (estimate, charged, refunded),
            (5, 0, 0),
            "{algorithm:?}: alive until its TTL"
        );
        assert_eq!(o.tiers[0].used, 10, "{algorithm:?}");
        assert_eq!(
            settle(&store, T0 + ttl, &h(0), &name, "b", 0).await,
            Settled::Unknown,
            "{algorithm:?}: expired"
        );
        let p = peek(&store, T0 + ttl, &h(1)).await;
        assert_eq!(
            (p.admitted, p.tiers[0].used),
            (false, 10),
            "{algorithm:?}: still charged"
        );
    }
}

async fn a_reservation_settles_once(store: impl Store) {
    for algorithm in COUNTING {
        let name = format!("res-once-{}", algorithm.name());
        let h = |cost| hit(vec![budget(&name, algorithm, 10, MINUTE)], cost);
        assert_eq!(
            settle(&store, T0, &h(0), &name, "never", 0).await,
            Settled::Unknown,
            "{algorithm:?}"
        );
        assert!(apply(&store, T0, &reserving(h(4), &name, "a", MINUTE)).await.admitted);
        let (_, _, refunded, _) = done(settle(&store, T0, &h(0), &name, "a", 1).await);
        assert_eq!(refunded, 3);
        let before = peek(&store, T0, &h(1)).await;
        assert_eq!(before.tiers[0].used, 1, "{algorithm:?}");
        for actual in [0, 1, 9] {
            assert_eq!(
                settle(&store, T0, &h(0), &name, "a", actual).await,
                Settled::Unknown,
                "{algorithm:?}"
            );
        }
        assert_eq!(peek(&store, T0, &h(1)).await, before, "{algorithm:?}: nothing changed");
        // The same id reserved again is a new reservation.
        assert!(apply(&store, T0, &reserving(h(2), &name, "a", MINUTE)).await.admitted);
        let (estimate, _, _, o) = done(settle(&store, T0, &h(0), &name, "a", 2).await);
        assert_eq!((estimate, o.tiers[0].used), (2, 3), "{algorithm:?}");
    }
}

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

async fn settlements_in_one_call_are_independent(store: impl Store) {
    let name = "res-batch";
    let tiers = vec![
        budget(name, Algorithm::FixedWindow, 10, MINUTE),
        budget(name, Algorithm::SlidingWindow, 10, HOUR),
    ];
    let h = |cost| hit(tiers.clone(), cost);
    assert!(apply(&store, T0, &reserving(h(5), name, "a", HOUR)).await.admitted);
    assert!(apply(&store, T0, &reserving(h(2), name, "b", HOUR)).await.admitted);
    assert!(apply(&store, T0, &reserving(h(1), name, "c", HOUR)).await.admitted);
    let settlement = |id: &str, actual, tiers: Vec<TierSpec>| Settlement {
        hit: hit(tiers, actual),
        reservation: reservation_key(name, id),
        reap: false,
    };
    let mut with_a_lease = tiers.clone();
    with_a_lease.push(tier(name, Algorithm::Concurrency, 10, MINUTE, 10));
    let settled = store
        .settle(
            T0,
            &[
                settlement("never", 1, tiers.clone()),
                settlement("a", 1, tiers.clone()),
                settlement("b", 4, tiers.clone()),
                settlement("a", 1, tiers.clone()),
                settlement("c", 0, with_a_lease),
            ],
        )
        .await;
    let settled: Vec<Settled> = settled.into_iter().map(|s| s.expect("settled")).collect();
    assert_eq!(settled[0], Settled::Unknown);
    let (a, b) = (done(settled[1].clone()), done(settled[2].clone()));
    assert_eq!((a.0, a.1, a.2, a.3.tiers[0].used), (5, 0, 4, 4), "8 - 4");
    assert_eq!((b.0, b.1, b.2, b.3.tiers[1].used), (2, 2, 0, 6), "4 + 2");
    assert_eq!(settled[3], Settled::Unknown, "settled earlier in the same call");
    assert_eq!(
        settled[4],
        Settled::Unknown,
        "a tier that does not count: nothing touched"
    );
    let (estimate, _, _, o) = done(settle(&store, T0, &h(0), name, "c", 1).await);
    assert_eq!((estimate, o.tiers[0].used), (1, 6), "c was still there");
    assert!(store.settle(T0, &[]).await.is_empty());
}

async fn only_a_counted_hit_on_counting_tiers_holds_a_reservation(store: impl Store) {
    let name = "res-only";
    let h = |cost| one(name, Algorithm::FixedWindow, 3, MINUTE, cost);
    // Denied (not counted, though a lone fixed window counts an ordinary hit's denials), peeked, of cost 0: no record.
    apply(&store, T0, &reserving(h(4), name, "too-big", HOUR)).await;
    peek(&store, T0, &reserving(h(1), name, "peeked", HOUR)).await;
    apply(&store, T0, &reserving(h(0), name, "zero", HOUR)).await;
    assert!(apply(&store, T0, &h(3)).await.admitted);
    let o = apply(&store, T0, &reserving(h(1), name, "denied", HOUR)).await;
    assert!(
        !o.admitted && o.tiers[0].used == 4,
        "a refused reservation holds nothing: {o:?}"
    );
    for id in ["too-big", "peeked", "zero", "denied"] {
        assert_eq!(settle(&store, T0, &h(0), name, id, 0).await, Settled::Unknown, "{id}");
    }
    // Forced, it is counted though it does not fit, and holds what it was charged.
    let o = apply(&store, T0, &reserving(forced(h(2)), name, "forced", HOUR)).await;
    assert!(!o.admitted && o.tiers[0].used == 5, "{o:?}");
    let (estimate, _, refunded, o) = done(settle(&store, T0, &h(0), name, "forced", 0).await);
    assert_eq!((estimate, refunded, o.tiers[0].used), (2, 2, 3));
    // With a tier that does not count, a reservation is ignored.
    let mixed = hit(
        vec![
            tier("res-mixed", Algorithm::FixedWindow, 3, MINUTE, 3),
            tier("res-mixed", Algorithm::Concurrency, 3, MINUTE, 3),
        ],
        1,
    );
    assert!(
        apply(&store, T0, &reserving(mixed.clone(), "res-mixed", "m", HOUR))
            .await
            .admitted
    );
    let fixed_only = hit(mixed.tiers[..1].to_vec(), 0);
    assert_eq!(
        settle(&store, T0, &fixed_only, "res-mixed", "m", 0).await,
        Settled::Unknown
    );
    assert_eq!(peek(&store, T0, &fixed_only).await.tiers[0].used, 1);
}

/// Costs no tier of 3 can ever take, the largest the APIs accept included.
const NEVER: [u64; 5] = [4, 1 << 32, u64::MAX / 2 + 1, u64::MAX - 1, u64::MAX];

async fn a_cost_that_can_never_fit_is_denied_and_consumes_nothing(store: impl Store) {
    let hour = 3_600 * SECOND;
    for algorithm in Algorithm::ALL {
        let name = format!("never-{}", algorithm.name());
        // A burst of 3 for both buckets, so that every tier of 3 has room for 3.
        let alone = hit(vec![tier(&name, algorithm, 3, MINUTE, 3)], 1);
        let mut tiered = alone.clone();
        let roomy = u64::from(u32::MAX);
        tiered
            .tiers
            .push(tier(&name, Algorithm::FixedWindow, roomy, hour, roomy));
        let places = matches!(algorithm, Algorithm::Concurrency | Algorithm::Queue);
        for (shape, h) in [("alone", &alone), ("tiered", &tiered)] {
            for cost in NEVER {
                let mut big = h.clone();
                big.cost = cost;
                big.lease = format!("lease-{cost}");
                let p = peek(&store, T0, &big).await;
                let o = apply(&store, T0, &big).await;
                // Any positive cost takes one place of a concurrency or queue limit, which a roomy tier admits.
                if places && (shape == "alone" || cost <= roomy) {
                    assert!(o.admitted && p.admitted, "{name} {shape} cost {cost}");
                    assert_eq!((p.tiers[0].used, o.tiers[0].used), (0, 1), "{name} {shape} cost {cost}");
                    store.reset(&window_keys(&h.tiers[0])).await.unwrap();
                    continue;
                }
                let what = format!("{name} {shape} cost {cost}: {o:?}");
                assert!(!o.admitted && !p.admitted, "{what}");
                let denying: Vec<_> = o.tiers.iter().filter(|t| !t.ok).collect();
                assert!(!denying.is_empty() && (places || !o.tiers[0].ok), "{what}");
                for t in denying {
                    assert_eq!((t.remaining, t.retry_after_us), (0, None), "{what}");
                }
                assert!(p.tiers.iter().all(|t| t.ok || t.retry_after_us.is_none()), "{what}");
            }
            if places {
                continue;
            }
            // Nothing was consumed, not even by the lone fixed window, which counts the denials that could fit.
            let o = apply(&store, T0, h).await;
            assert!(o.admitted, "{name} {shape}: {o:?}");
            assert_eq!((o.tiers[0].used, o.tiers[0].remaining), (1, 2), "{name} {shape}");
            // Reset between shapes: the tiered case shares the first tier's key.
            store.reset(&window_keys(&h.tiers[0])).await.unwrap();
        }
    }
}

async fn limits_up_to_u32_max_in_every_unit(store: impl Store) {
    let max = u64::from(u32::MAX);
    for unit in [1, 60, 3_600, 86_400, 604_800, 2_592_000, 31_536_000] {
        let window = unit * SECOND;
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow, Algorithm::TokenBucket] {
            let name = format!("max-{}-{unit}", algorithm.name());
            let h = |cost| hit(vec![tier(&name, algorithm, max, window, max)], cost);
            let what = &name;
            let o = apply(&store, T0, &h(max - 1)).await;
            assert!(o.admitted, "{what}: {o:?}");
            assert_eq!((o.tiers[0].used, o.tiers[0].remaining), (max - 1, 1), "{what}");
            // A peek: a lone fixed window would count the denial.
            let o = peek(&store, T0, &h(2)).await;
            assert!(!o.admitted, "{what}: {o:?}");
            // At most the next window (a sliding window's previous hits weigh in until its end).
            let wait = o.tiers[0].retry_after_us;
            assert!(wait.is_some_and(|r| r > 0 && r <= 2 * window), "{what}: {o:?}");
            let o = apply(&store, T0, &h(1)).await;
            assert!(o.admitted, "{what}: {o:?}");
            assert_eq!(o.tiers[0].remaining, 0, "{what}");
            let o = apply(&store, T0, &h(max + 1)).await;
            assert_eq!((o.admitted, o.tiers[0].retry_after_us), (false, None), "{what}: {o:?}");
        }
        for algorithm in [Algorithm::Concurrency, Algorithm::Queue] {
            let name = format!("max-{}-{unit}", algorithm.name());
            let o = apply(
                &store,
                T0,
                &hit(vec![tier(&name, algorithm, max, window, max)], u64::MAX),
            )
            .await;
            assert!(o.admitted, "{name}: {o:?}");
            assert_eq!((o.tiers[0].used, o.tiers[0].remaining), (1, max - 1), "{name}");
        }
    }
}

async fn extreme_windows_costs_and_clocks(store: impl Store) {
    // A queue whose window reaches back before 1970, a clock that goes back behind the queue's last entry, and a
    // sliding-log hit of thousands (beyond what one Lua unpack takes): all decided, never a failure.
    let century = 60 * 365 * 86_400 * SECOND;
    let q = one("old-queue", Algorithm::Queue, 3, century, 1);
    let first = apply(&store, T0 + 5 * SECOND, &q).await;
    let back = apply(&store, T0, &q).await;
    assert!(first.admitted && back.admitted);
    let (a, b) = (first.tiers[0].id.clone().unwrap(), back.tiers[0].id.clone().unwrap());
    assert_ne!(a, b, "the entry appended with the clock behind still gets a fresh id");
    assert_eq!(peek(&store, T0, &q).await.tiers[0].remaining, 1);
    let log = one("big-log", Algorithm::SlidingLog, 10_000, MINUTE, 6_000);
    assert!(apply(&store, T0, &log).await.admitted);
    assert_eq!(
        peek(&store, T0, &one("big-log", Algorithm::SlidingLog, 10_000, MINUTE, 1))
            .await
            .tiers[0]
            .remaining,
        4_000
    );
}

async fn fixed_window_counts_denials_like_the_reference(store: impl Store) {
    let now = T0 + 5 * SECOND;
    let h = one("fw", Algorithm::FixedWindow, 3, MINUTE, 1);
    for expected in 1..=3 {
        let o = apply(&store, now, &h).await;
        assert!(o.admitted);
        assert_eq!((o.tiers[0].used, o.tiers[0].remaining), (expected, 3 - expected));
        assert_eq!(
            o.tiers[0].reset_after_us,
            MINUTE - 15 * SECOND,
            "T0 is 10 s into its minute"
        );
    }
    let o = apply(&store, now, &h).await;
    assert!(!o.admitted);
    assert_eq!((o.tiers[0].used, o.tiers[0].remaining), (4, 0));
    let p = peek(&store, now, &h).await;
    assert_eq!(p.tiers[0].used, 4, "a lone fixed window counts its denials");
    assert_eq!(p.tiers[0].retry_after_us, Some(45 * SECOND));
    let next = T0 + MINUTE;
    let o = apply(&store, next, &h).await;
    assert!(o.admitted, "the next epoch-aligned window starts empty");
    assert_eq!(o.tiers[0].used, 1);
}

async fn fixed_window_cost_zero_reads_without_creating(store: impl Store) {
    let check = one("z", Algorithm::FixedWindow, 2, MINUTE, 0);
    let o = apply(&store, T0, &check).await;
    assert_eq!((o.admitted, o.tiers[0].used, o.tiers[0].remaining), (true, 0, 2));
    apply(&store, T0, &one("z", Algorithm::FixedWindow, 2, MINUTE, 1)).await;
    let o = apply(&store, T0, &check).await;
    assert_eq!((o.tiers[0].used, o.tiers[0].remaining), (1, 1));
    let o = apply(&store, T0, &one("zero", Algorithm::FixedWindow, 0, MINUTE, 1)).await;
    assert!(!o.admitted, "a limit of 0 rejects every hit");
}

async fn sliding_window_weighs_the_previous_window(store: impl Store) {
    let w = 10 * SECOND;
    let start = T0 - T0 % w;
    let h = one("sw", Algorithm::SlidingWindow, 10, w, 1);
    for _ in 0..10 {
        assert!(apply(&store, start + SECOND, &h).await.admitted);
    }
    let o = apply(&store, start + SECOND, &h).await;
    assert!(!o.admitted);
    // Half way through the next window half the previous window still counts: 5 places.
    let mid = start + w + 5 * SECOND;
    let p = peek(&store, mid, &h).await;
    assert_eq!(p.tiers[0].remaining, 5, "the denied hit was not counted");
    for _ in 0..5 {
        assert!(apply(&store, mid, &h).await.admitted);
    }
    assert!(!apply(&store, mid, &h).await.admitted);
    // The retry time is exact: one microsecond earlier does not fit, at it the hit fits.
    let retry = peek(&store, mid, &h).await.tiers[0].retry_after_us.unwrap();
    assert!(retry > 0);
    assert!(!peek(&store, mid + retry - 1, &h).await.admitted);
    assert!(peek(&store, mid + retry, &h).await.admitted);
}

async fn sliding_log_is_exact_and_retry_is_exact(store: impl Store) {
    let w = 10 * SECOND;
    let h = one("sl", Algorithm::SlidingLog, 3, w, 1);
    for i in 0..3 {
        assert!(apply(&store, T0 + i * SECOND, &h).await.admitted);
    }
    let o = apply(&store, T0 + 3 * SECOND, &h).await;
    assert!(!o.admitted);
    let p = peek(&store, T0 + 3 * SECOND, &h).await;
    assert_eq!(
        p.tiers[0].retry_after_us,
        Some(7 * SECOND),
        "the oldest hit (T0) leaves at T0 + 10 s"
    );
    assert_eq!(
        p.tiers[0].reset_after_us,
        9 * SECOND,
        "empty when the newest (T0 + 2 s) leaves"
    );
    assert!(!apply(&store, T0 + w - 1, &h).await.admitted);
    assert!(apply(&store, T0 + w, &h).await.admitted);
    let big = one("sl", Algorithm::SlidingLog, 3, w, 4);
    assert_eq!(peek(&store, T0 + w, &big).await.tiers[0].retry_after_us, None);
}

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

async fn records_keep_the_last_values(store: impl Store) {
    let base = CounterKey::builder("test:", "d").entry("ip", "1.2.3.4").finish();
    let mut h = one("rec", Algorithm::FixedWindow, 100, MINUTE, 1);
    h.tiers[0].key = base.tier(Algorithm::FixedWindow, MINUTE);
    for user in ["u1", "u2", "u3", "u4"] {
        h.record = Some(RecordSpec {
            key: base.records(),
            size: 3,
            value: Some(user.into()),
        });
        apply(&store, T0, &h).await;
    }
    let p = peek(&store, T0, &h).await;
    assert_eq!(p.records, ["u4", "u3", "u2"]);
}

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

async fn reset_deletes_exactly_the_given_keys(store: impl Store) {
    let a = one("ra", Algorithm::TokenBucket, 1, MINUTE, 1);
    let b = one("rb", Algorithm::TokenBucket, 1, MINUTE, 1);
    apply(&store, T0, &a).await;
    apply(&store, T0, &b).await;
    let keys = [a.tiers[0].key.clone()];
    assert_eq!(store.reset(&keys).await.unwrap(), 1);
    assert!(apply(&store, T0, &a).await.admitted, "a starts over");
    assert!(!apply(&store, T0, &b).await.admitted, "b is untouched");
}

async fn reset_keeps_streams_that_hold_entries(store: impl Store) {
    let q = one("rq", Algorithm::Queue, 2, MINUTE, 1);
    let never = one("rq-never", Algorithm::Queue, 2, MINUTE, 1);
    assert!(apply(&store, T0, &q).await.admitted);
    let keys = [q.tiers[0].key.clone(), never.tiers[0].key.clone()];
    let reset = store.reset_idle_streams(T0, &keys).await.unwrap();
    assert_eq!(
        reset.deleted, 0,
        "nothing deleted: one stream waits, the other never existed"
    );
    assert_eq!(reset.kept, [q.tiers[0].key.clone()], "the stream with an entry is kept");
    assert_eq!(
        peek(&store, T0, &q).await.tiers[0].remaining,
        1,
        "its entry still waits"
    );
    assert_eq!(store.reset(&keys[..1]).await.unwrap(), 1, "a plain reset drops it");
    assert_eq!(peek(&store, T0, &q).await.tiers[0].remaining, 2);
}

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
async fn redis_state_carries_ttls_and_huge_costs_do_not_overflow() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    for algorithm in Algorithm::ALL {
        apply(&store, T0, &one("ttl", algorithm, 3, MINUTE, 1)).await;
    }
    let snapshot = redis.snapshot();
    assert_eq!(snapshot.len(), Algorithm::ALL.len());
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
        let seeded = (bound - 1).to_string();
        // Both keep a string per window.
        let window = h.tiers[0].key.window(T0 - T0 % MINUTE);
        redis.cli(&["SET", window.as_str(), &seeded, "PX", "60000"]);
        let (key, read) = (window.as_str(), vec!["--raw", "GET", window.as_str()]);
        let o = apply(&store, T0, &h).await;
        assert_eq!(o.tiers[0].used, bound - 1 + 4, "{algorithm:?}: the cost counts as 4");
        assert_eq!(redis.cli(&read).trim(), bound.to_string(), "{algorithm:?} {key}");
        apply(&store, T0, &h).await;
        assert_eq!(redis.cli(&read).trim(), bound.to_string(), "{algorithm:?}");
    }
}

/// A reservation's record in Redis: a hash that expires with its TTL, written only by a counted hit, deleted by its
/// settlement; a refund keeps a fixed window's expiry.
#[tokio::test]
async fn redis_reservation_records_expire_and_settle_away() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    let h = |cost| one("res-redis", Algorithm::FixedWindow, 10, MINUTE, cost);
    let record = reservation_key("res-redis", "a");
    assert!(
        apply(&store, T0, &reserving(h(4), "res-redis", "a", 30 * SECOND))
            .await
            .admitted
    );
    let snapshot = redis.snapshot();
    assert_eq!(snapshot.len(), 2, "{snapshot:?}");
    let (_, _, ttl) = snapshot
        .iter()
        .find(|(k, _, _)| k == record.as_str())
        .expect("the record");
    // The record outlives its expiry by the grace in which its instance reaps it.
    let grace_ms = sluice_core::store::RESERVATION_GRACE_US / 1000;
    assert!(*ttl > grace_ms as i64 && *ttl <= 30_000 + grace_ms as i64, "TTL {ttl}");
    assert!(record.as_str().starts_with("test:{") && record.as_str().ends_with("|reservation/a"));
    let fields = redis.cli(&["--raw", "HMGET", record.as_str(), "e", "t", "x"]);
    let fields: Vec<&str> = fields.lines().collect();
    let (t, x) = (T0.to_string(), (T0 + 30 * SECOND).to_string());
    assert_eq!(fields, ["4", t.as_str(), x.as_str()]);
    let counter = h(0).tiers[0].key.window(T0 - T0 % MINUTE);
    let before: i64 = redis.cli(&["--raw", "PTTL", counter.as_str()]).trim().parse().unwrap();
    let (_, _, refunded, _) = done(settle(&store, T0, &h(0), "res-redis", "a", 1).await);
    assert_eq!(refunded, 3);
    let after: i64 = redis.cli(&["--raw", "PTTL", counter.as_str()]).trim().parse().unwrap();
    assert!(
        after > 0 && after <= before,
        "the window's expiry is kept: {before} then {after}"
    );
    assert_eq!(redis.snapshot().len(), 1, "the record is gone");
    // A ttl beyond the bound is taken as the bound, about 9 years.
    assert!(
        apply(&store, T0, &reserving(h(1), "res-redis", "b", u64::MAX))
            .await
            .admitted
    );
    let ttl: i64 = redis
        .cli(&["--raw", "PTTL", reservation_key("res-redis", "b").as_str()])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 0 && ttl <= (1i64 << 48) / 1_000 + 1 + grace_ms as i64, "{ttl}");
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

/// Settlements go through the hits' path: after a SCRIPT FLUSH the script is loaded again and the settlement resent
/// (a NOSCRIPT call ran nothing); in a cluster each settlement goes to the primary of its own slot.
#[tokio::test]
async fn redis_settlements_reload_the_script_and_route_per_slot_in_a_cluster() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    let h = |cost| one("res-noscript", Algorithm::SlidingWindow, 10, MINUTE, cost);
    assert!(
        apply(&store, T0, &reserving(h(6), "res-noscript", "a", HOUR))
            .await
            .admitted
    );
    assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
    let (_, _, refunded, o) = done(settle(&store, T0, &h(0), "res-noscript", "a", 1).await);
    assert_eq!((refunded, o.tiers[0].used), (5, 1));

    let cluster = crate::harness::RedisCluster::start();
    let store = redis_store(&cluster.url()).await;
    let names: Vec<String> = (0..12).map(|i| format!("res-cluster-{i}")).collect();
    let hits: Vec<Hit> = names
        .iter()
        .map(|name| reserving(one(name, Algorithm::TokenBucket, 10, MINUTE, 4), name, "a", HOUR))
        .collect();
    let slots: std::collections::HashSet<u16> = hits
        .iter()
        .map(|h| fred::util::redis_keyslot(h.tiers[0].key.as_str().as_bytes()))
        .collect();
    assert!(slots.len() > 1, "the descriptors span slots");
    let out = crate::harness::decided(store.hit(T0, &hits).await);
    assert!(out.iter().all(|o| o.admitted));
    let settlements: Vec<Settlement> = names
        .iter()
        .zip(&hits)
        .enumerate()
        .map(|(i, (name, h))| Settlement {
            hit: Hit {
                cost: i as u64 % 8,
                reservation: None,
                ..h.clone()
            },
            reservation: reservation_key(name, "a"),
            reap: false,
        })
        .collect();
    let settled = store.settle(T0, &settlements).await;
    for (i, s) in settled.into_iter().enumerate() {
        let (estimate, charged, refunded, o) = done(s.expect("settled"));
        let actual = i as u64 % 8;
        assert_eq!(
            (estimate, charged, refunded, o.tiers[0].used),
            (4, actual.saturating_sub(4), 4u64.saturating_sub(actual), actual),
            "{i}"
        );
    }
    assert!(
        store
            .settle(T0, &settlements)
            .await
            .into_iter()
            .all(|s| s.unwrap() == Settled::Unknown)
    );
}

/// The keys that hold a fixed window's count at [`T0`] in either store: the counter's own (the memory store's) and
/// its window's (Redis's).
fn window_keys(tier: &sluice_core::store::TierSpec) -> Vec<sluice_core::store::CounterKey> {
    vec![tier.key.clone(), tier.key.window(T0 - T0 % tier.window_us.max(1))]
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

/// A counter of the previous form in Redis (a hash {w, n} at the counter's own key) is found and folded into the
/// window's key at its first write, so an upgrade admits no burst; one of another window counts nothing.
#[tokio::test]
async fn redis_counters_of_the_previous_form_are_folded_in() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    let start = T0 - T0 % MINUTE;
    for (name, lone) in [("legacy-lone", true), ("legacy-driver", false)] {
        let mut h = one(name, Algorithm::FixedWindow, 6, MINUTE, 1);
        if lone {
            h.fields.clear();
            h.lease.clear();
        }
        let base = h.tiers[0].key.as_str().to_string();
        redis.cli(&["HSET", &base, "w", &start.to_string(), "n", "5"]);
        redis.cli(&["PEXPIRE", &base, "60000"]);
        let mut read = h.clone();
        read.cost = 0;
        assert_eq!(
            peek(&store, T0, &read).await.tiers[0].used,
            5,
            "{name}: found before any write"
        );
        let o = apply(&store, T0, &h).await;
        assert_eq!(
            (o.admitted, o.tiers[0].used, o.tiers[0].remaining),
            (true, 6, 0),
            "{name}"
        );
        assert!(!apply(&store, T0, &h).await.admitted, "{name}: no burst");
        assert_eq!(
            redis.cli(&["--raw", "EXISTS", &base]).trim(),
            "0",
            "{name}: folded and deleted"
        );
        let window = h.tiers[0].key.window(start);
        assert_eq!(
            redis.cli(&["--raw", "GET", window.as_str()]).trim(),
            "7",
            "{name}: the denial counted too"
        );
        let ttl: i64 = redis.cli(&["--raw", "PTTL", window.as_str()]).trim().parse().unwrap();
        assert!(
            ttl > 50_000 && ttl <= 51_000,
            "{name}: expires a second after its window: {ttl}"
        );
    }
    // Several windows on one descriptor: each window's hash is folded in at its first write; a denial counts nothing.
    let h = hit(
        vec![
            tier("legacy-windows", Algorithm::FixedWindow, 6, MINUTE, 6),
            tier("legacy-windows", Algorithm::FixedWindow, 100, 60 * MINUTE, 100),
        ],
        1,
    );
    let base = h.tiers[0].key.as_str().to_string();
    redis.cli(&["HSET", &base, "w", &start.to_string(), "n", "5"]);
    let o = apply(&store, T0, &h).await;
    assert_eq!((o.admitted, o.tiers[0].used, o.tiers[1].used), (true, 6, 1));
    assert!(!apply(&store, T0, &h).await.admitted, "no burst");
    assert_eq!(redis.cli(&["--raw", "EXISTS", &base]).trim(), "0", "folded and deleted");
    let window = h.tiers[0].key.window(start);
    assert_eq!(redis.cli(&["--raw", "GET", window.as_str()]).trim(), "6");
    let hour = h.tiers[1].key.window(T0 - T0 % (60 * MINUTE));
    assert_eq!(
        redis.cli(&["--raw", "GET", hour.as_str()]).trim(),
        "1",
        "the denial counted nothing"
    );
    // A hash of a window that has passed counts nothing.
    let h = one("legacy-old", Algorithm::FixedWindow, 6, MINUTE, 1);
    let base = h.tiers[0].key.as_str().to_string();
    redis.cli(&["HSET", &base, "w", &(start - MINUTE).to_string(), "n", "6"]);
    assert_eq!(apply(&store, T0, &h).await.tiers[0].used, 1);
}

/// A sliding window of the previous form in Redis (a hash {w, c, p} at the counter's own key) counts as the same hits
/// would in the memory store until the counter's first write, which folds it into the two windows' keys: an upgrade
/// admits no burst. A hash of the window before counts as the previous window.
#[tokio::test]
async fn redis_sliding_windows_of_the_previous_form_are_folded_in() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    let start = T0 - T0 % MINUTE;
    // The hash's window, its counts, and the hits that leave the memory store with the same counts.
    let cases: [(&str, bool, u64, u64, u64); 4] = [
        ("sw-legacy-lone", true, start, 2, 6),
        ("sw-legacy-driver", false, start, 2, 6),
        ("sw-legacy-rolled-lone", true, start - MINUTE, 5, 0),
        ("sw-legacy-rolled-driver", false, start - MINUTE, 5, 0),
    ];
    for (name, lone, w, c, p) in cases {
        let mut h = one(name, Algorithm::SlidingWindow, 10, MINUTE, 1);
        if lone {
            h.fields.clear();
            h.lease.clear();
        }
        let base = h.tiers[0].key.as_str().to_string();
        redis.cli(&[
            "HSET",
            &base,
            "w",
            &w.to_string(),
            "c",
            &c.to_string(),
            "p",
            &p.to_string(),
        ]);
        redis.cli(&["PEXPIRE", &base, "120000"]);
        // The memory store, brought to the same counts by hits: `p` in the window before `w`, `c` in `w`.
        let serial = memory();
        let mut seed = h.clone();
        seed.cost = p;
        if p > 0 {
            apply(&serial, w - MINUTE, &seed).await;
        }
        seed.cost = c;
        apply(&serial, w, &seed).await;
        let mut read = h.clone();
        read.cost = 0;
        assert_eq!(
            peek(&store, T0, &read).await,
            peek(&serial, T0, &read).await,
            "{name}: found before any write"
        );
        for _ in 0..12 {
            assert_eq!(
                apply(&store, T0, &h).await,
                apply(&serial, T0, &h).await,
                "{name}: no burst"
            );
        }
        assert_eq!(
            redis.cli(&["--raw", "EXISTS", &base]).trim(),
            "0",
            "{name}: folded and deleted"
        );
        let current = h.tiers[0].key.window(start);
        let ttl: i64 = redis.cli(&["--raw", "PTTL", current.as_str()]).trim().parse().unwrap();
        // Read as the previous window all through the next one, and a second more.
        assert!(ttl > 110_000 && ttl <= 111_000, "{name}: {ttl}");
        let previous = h.tiers[0].key.window(start - MINUTE);
        let before = if w == start { p } else { c };
        let kept = redis.cli(&["--raw", "GET", previous.as_str()]);
        assert_eq!(kept.trim(), before.to_string(), "{name}: the previous window's count");
        let ttl: i64 = redis.cli(&["--raw", "PTTL", previous.as_str()]).trim().parse().unwrap();
        assert!(ttl > 50_000 && ttl <= 51_000, "{name}: {ttl}");
    }
}

/// Decided by the server's clock, a lone fixed window's key is built by sluice for its own time; when the server's
/// time is in another window (the clocks straddle an edge), the script counts in the server's window, not the one
/// sluice guessed.
#[tokio::test]
async fn redis_a_window_guessed_across_an_edge_is_counted_in_the_servers() {
    let redis = RedisServer::start();
    let h = one("guess", Algorithm::FixedWindow, 6, MINUTE, 1);
    let now: u64 = {
        let t = redis.cli(&["--raw", "TIME"]);
        let parts: Vec<u64> = t.lines().map(|l| l.trim().parse().unwrap()).collect();
        parts[0] * 1_000_000 + parts[1]
    };
    let guess = now - 5 * MINUTE;
    let guessed = h.tiers[0].key.window(guess - guess % MINUTE);
    let script = sluice_core::store::redis::SCRIPT;
    let minute = MINUTE.to_string();
    let guess_arg = guess.to_string();
    // One descriptor, declared: its key, n = 1, the timing (the guess), then the window and the cost counted.
    let answer = redis.cli(&[
        "--raw",
        "EVAL",
        script,
        "1",
        guessed.as_str(),
        "1",
        &guess_arg,
        &minute,
        "1",
    ]);
    let lines: Vec<&str> = answer.lines().collect();
    assert_eq!(lines[0].trim(), "0", "the count before the hit: {answer}");
    let server_now: u64 = lines[1].trim().parse().unwrap();
    assert!(server_now >= now, "the call's time is the server's: {answer}");
    let server = h.tiers[0].key.window(server_now - server_now % MINUTE);
    assert_eq!(redis.cli(&["--raw", "GET", server.as_str()]).trim(), "1");
    assert_eq!(redis.cli(&["--raw", "EXISTS", guessed.as_str()]).trim(), "0");
}
