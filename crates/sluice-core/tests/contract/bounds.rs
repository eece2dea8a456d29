//! The edges of the inputs: costs no limit can ever take, limits up to `u32::MAX` in every unit, windows reaching
//! back before 1970 and clocks that go back. Each is decided, never a failure, and nothing denied is consumed.

use sluice_core::rules::Algorithm;
use sluice_core::store::Store;

use super::{MINUTE, SECOND, apply, hit, one, peek};
use crate::harness::{T0, tier};

every_store!(
    extreme_windows_costs_and_clocks,
    a_cost_that_can_never_fit_is_denied_and_consumes_nothing,
    limits_up_to_u32_max_in_every_unit,
);

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

/// The keys that hold a fixed window's count at [`T0`] in either store: the counter's own (the memory store's) and
/// its window's (Redis's).
fn window_keys(tier: &sluice_core::store::TierSpec) -> Vec<sluice_core::store::CounterKey> {
    vec![tier.key.clone(), tier.key.window(T0 - T0 % tier.window_us.max(1))]
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
