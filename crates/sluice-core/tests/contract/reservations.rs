//! Reservations and their settlement: a counted hit holds its estimate until it is settled at its actual cost,
//! once, or until it expires, charged at its estimate; settlements in one call are independent. Concurrent
//! reservations never admit more than the budget; in Redis the record is a hash that expires with the reservation.

use std::sync::Arc;

use sluice_core::rules::Algorithm;
use sluice_core::store::{Hit, Settled, Settlement, Store, TierSettled, TierSpec};

use super::{
    COUNTING, HOUR, MINUTE, SECOND, apply, budget, costing, counts, done, done_tiers, forced, hit, one, peek,
    reservation_key, reserving, settle,
};
use crate::harness::{RedisServer, T0, redis_store, tier};
use sluice_core::store::{Counters, Reservations};

every_store!(
    concurrent_reservations_never_admit_more_than_the_budget,
    settle_refunds_and_the_freed_budget_admits_more,
    settle_charges_more_and_the_next_hit_is_denied,
    an_unsettled_reservation_expires_and_stays_charged_at_its_estimate,
    a_reservation_settles_once,
    settlements_in_one_call_are_independent,
    only_a_counted_hit_on_counting_tiers_holds_a_reservation,
    reserve_per_tier_estimates_then_settle_per_tier_actuals,
);

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
        tiers,
        cost: actual,
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

/// A reservation's record in Redis, as the script's general form writes it: the text `<t> <x> <e>`, expiring with its
/// TTL, written only by a counted hit, deleted by its settlement; a refund keeps a fixed window's expiry.
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
    let text = redis.cli(&["--raw", "GET", record.as_str()]);
    assert_eq!(text.trim(), format!("{T0} {} 4", T0 + 30 * SECOND));
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

/// A reservation on fixed windows with nothing else to write (the script's compact form) keeps its record as the text
/// the general form writes, `<t> <x> <e>`: settled by the compact form, and found by the reaping (the general form)
/// once expired.
#[tokio::test]
async fn redis_a_compact_record_settles_and_reaps() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    let h = |cost| {
        let mut h = one("res-forms", Algorithm::FixedWindow, 10, MINUTE, cost);
        h.fields.clear();
        h.lease.clear();
        h
    };
    let count = |h: &Hit| redis.cli(&["--raw", "GET", h.tiers[0].key.window(T0 - T0 % MINUTE).as_str()]);
    for id in ["a", "b", "c"] {
        assert!(
            apply(&store, T0, &reserving(h(3), "res-forms", id, 30 * SECOND))
                .await
                .admitted
        );
    }
    assert_eq!(count(&h(0)).trim(), "9");
    let text = redis.cli(&["--raw", "GET", reservation_key("res-forms", "b").as_str()]);
    assert_eq!(text.trim(), format!("{T0} {} 3", T0 + 30 * SECOND));
    let (estimate, _, refunded, o) = done(settle(&store, T0, &h(0), "res-forms", "a", 1).await);
    assert_eq!((estimate, refunded, o.tiers[0].used), (3, 2, 7));
    assert_eq!(
        redis
            .cli(&["--raw", "EXISTS", reservation_key("res-forms", "a").as_str()])
            .trim(),
        "0"
    );
    // Reaped past their expiry: settled at their estimates, which leaves the count as it is.
    let later = T0 + 31 * SECOND;
    for id in ["b", "c"] {
        let reaping = Settlement {
            tiers: h(0).tiers,
            cost: 0,
            reservation: reservation_key("res-forms", id),
            reap: true,
        };
        let settled = store.settle(later, std::slice::from_ref(&reaping)).await.remove(0);
        assert!(matches!(settled, Ok(Settled::Done { .. })), "{id}: {settled:?}");
        assert_eq!(
            redis
                .cli(&["--raw", "EXISTS", reservation_key("res-forms", id).as_str()])
                .trim(),
            "0"
        );
    }
    assert_eq!(count(&h(0)).trim(), "7");
}

/// Settlements go through the hits' path: after the scripts are flushed the script is loaded again and the settlement resent
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
    redis.flush_scripts();
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
            tiers: h.tiers.clone(),
            cost: i as u64 % 8,
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
