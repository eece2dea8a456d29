//! Cost budgets through the decision core, over every store, on a manual clock: Check decides without counting,
//! Report counts past the limit and never refuses, Reserve holds estimates so that concurrent callers never overspend,
//! Settle refunds and charges, an unsettled reservation expires at its estimate, named costs and prices count per
//! limit, and `cost_reports` rules serve Envoy's check-before and report-after calls.

use std::sync::Arc;

use sluice_core::limiter::{Code, Costs, Descriptor, Limiter, LimiterSettings, Request};
use sluice_core::store::Store;

use crate::harness::limiter_with;

const RULES: &str = "domain: llm
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000, name: tokens}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: token_bucket, burst: 1000}
  - key: model
    descriptors:
      - key: user
        rate_limits:
          - {unit: minute, requests_per_unit: 500, name: input, cost: input_tokens}
          - {unit: minute, requests_per_unit: 100, name: output, cost: output_tokens}
          - {unit: day, requests_per_unit: 3000, name: credits, price: {input_tokens: 2, output_tokens: 10}}
  - key: reported
    cost_reports: true
    rate_limit: {unit: hour, requests_per_unit: 100}
";

fn limiter<S: Store>(store: S) -> (Arc<Limiter<S>>, Arc<sluice_core::clock::ManualClock>) {
    let settings = LimiterSettings {
        key_prefix: "test:".into(),
        local_cache_size: 0,
        ..LimiterSettings::default()
    };
    limiter_with(RULES, store, settings)
}

fn request(entries: &[(&str, &str)]) -> Request {
    Request {
        domain: "llm".into(),
        descriptors: vec![Descriptor {
            entries: entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Descriptor::default()
        }],
        hits_addend: 0,
    }
}

fn costs(cost: u64) -> Costs {
    Costs {
        cost,
        named: Vec::new(),
    }
}

fn named(pairs: &[(&str, u64)]) -> Costs {
    Costs {
        cost: 0,
        named: pairs.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
    }
}

async fn remaining<S: Store>(l: &Limiter<S>, r: &Request) -> u64 {
    match &l.decisions().get_remaining(r, 1).await.unwrap()[0] {
        sluice_core::limiter::Report::Limited { remaining, .. } => *remaining,
        other => panic!("{other:?}"),
    }
}

/// Check decides without counting; Report counts past the limit, is never refused, and the next Check denies;
/// huge costs neither wrap nor panic.
async fn check_and_report(store: impl Store) {
    let (l, _) = limiter(store);
    let alice = request(&[("user", "alice")]);
    assert_eq!(l.budgets().check(&alice, &costs(1000)).await.unwrap().overall, Code::Ok);
    assert_eq!(
        l.budgets().check(&alice, &costs(1001)).await.unwrap().overall,
        Code::OverLimit
    );
    assert_eq!(remaining(&l, &alice).await, 1000, "a check counts nothing");
    let reported = l.budgets().report(&alice, &costs(900)).await.unwrap();
    assert_eq!(reported.overall, Code::Ok);
    assert_eq!(reported.statuses[0].remaining, 100);
    let past = l.budgets().report(&alice, &costs(u64::MAX)).await.unwrap();
    assert_eq!(
        (past.overall, past.statuses[0].remaining),
        (Code::Ok, 0),
        "never refused"
    );
    assert_eq!(
        l.budgets().check(&alice, &costs(1)).await.unwrap().overall,
        Code::OverLimit
    );
    assert_eq!(
        l.decisions().should_rate_limit(&alice).await.unwrap().overall,
        Code::OverLimit
    );
}

/// Many callers reserving at once against one budget never hold more than it; settling gives back the unspent
/// part, which later reservations can use; settling twice finds nothing.
async fn concurrent_reservations_never_overspend(store: impl Store) {
    let (l, _) = limiter(store);
    let bob = Arc::new(request(&[("user", "bob")]));
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let (l, bob) = (l.clone(), bob.clone());
        tasks.push(tokio::spawn(async move {
            l.budgets().reserve(&bob, &costs(100), 60_000_000).await.unwrap()
        }));
    }
    let mut held = Vec::new();
    for t in tasks {
        let reserved = t.await.unwrap();
        match reserved.id {
            Some(id) => {
                assert_eq!(reserved.decision.overall, Code::Ok);
                held.push(id);
            }
            None => assert_eq!(reserved.decision.overall, Code::OverLimit),
        }
    }
    assert_eq!(held.len(), 10, "1000 / 100");
    assert_eq!(remaining(&l, &bob).await, 0);
    // Each call spent 30 of its 100: 70 back each.
    for id in &held {
        let settled = l.budgets().settle(&bob, id, &costs(30)).await.unwrap().expect("found");
        assert_eq!(
            (settled[0].estimate, settled[0].actual, settled[0].refunded),
            (100, 30, 70)
        );
        assert!(
            l.budgets().settle(&bob, id, &costs(0)).await.unwrap().is_none(),
            "settled already"
        );
    }
    assert_eq!(remaining(&l, &bob).await, 700);
    // Settling above the estimate charges the difference, past the limit if need be.
    let id = l
        .budgets()
        .reserve(&bob, &costs(600), 60_000_000)
        .await
        .unwrap()
        .id
        .unwrap();
    let settled = l.budgets().settle(&bob, &id, &costs(900)).await.unwrap().unwrap();
    assert_eq!((settled[0].charged, settled[0].refunded), (300, 0));
    assert_eq!(remaining(&l, &bob).await, 0);
    assert_eq!(
        l.budgets().check(&bob, &costs(1)).await.unwrap().overall,
        Code::OverLimit
    );
}

/// An unsettled reservation expires after its TTL and stays charged at its estimate.
async fn expiry_settles_at_the_estimate(store: impl Store) {
    let (l, clock) = limiter(store);
    let carol = request(&[("user", "carol")]);
    let id = l
        .budgets()
        .reserve(&carol, &costs(250), 5_000_000)
        .await
        .unwrap()
        .id
        .unwrap();
    clock.advance(5_000_000);
    assert!(
        l.budgets().settle(&carol, &id, &costs(0)).await.unwrap().is_none(),
        "expired"
    );
    assert_eq!(remaining(&l, &carol).await, 750, "charged at its estimate");
    // Bad TTLs and ids are refused, naming the field.
    let e = l.budgets().reserve(&carol, &costs(1), 0).await.unwrap_err().to_string();
    assert!(e.starts_with("ttl must be"), "{e}");
    let e = l.budgets().settle(&carol, "", &costs(1)).await.unwrap_err().to_string();
    assert!(e.starts_with("reservation_id"), "{e}");
}

/// The reserving limiter reaps what expired unsettled, and only that: a settled reservation, or one settled by
/// another instance, is never counted as expired.
async fn expired_reservations_are_reaped(store: impl Store) {
    let (l, clock) = limiter(store);
    let gil = request(&[("user", "gil")]);
    let kept = l
        .budgets()
        .reserve(&gil, &costs(40), 5_000_000)
        .await
        .unwrap()
        .id
        .unwrap();
    let settled = l
        .budgets()
        .reserve(&gil, &costs(60), 5_000_000)
        .await
        .unwrap()
        .id
        .unwrap();
    l.budgets().settle(&gil, &settled, &costs(10)).await.unwrap().unwrap();
    assert_eq!(l.budgets().reap_expired().await.unwrap(), 0, "nothing has expired yet");
    clock.advance(5_000_000);
    assert_eq!(
        l.budgets().reap_expired().await.unwrap(),
        0,
        "reaped a second after expiry"
    );
    clock.advance(1_000_000);
    assert_eq!(l.budgets().reap_expired().await.unwrap(), 40, "only the unsettled one");
    assert_eq!(l.budgets().reap_expired().await.unwrap(), 0, "once");
    assert!(
        l.budgets().settle(&gil, &kept, &costs(0)).await.unwrap().is_none(),
        "expired: stays charged"
    );
    assert_eq!(remaining(&l, &gil).await, 1000 - 40 - 10);
}

/// A reservation refused by one descriptor holds nothing on the others: their holds are given back at once.
async fn a_refused_reservation_holds_nothing(store: impl Store) {
    let (l, _) = limiter(store);
    let spent = request(&[("user", "spent")]);
    l.budgets().report(&spent, &costs(1000)).await.unwrap();
    let mut both = request(&[("user", "fay")]);
    both.descriptors.extend(spent.descriptors.clone());
    let reserved = l.budgets().reserve(&both, &costs(300), 60_000_000).await.unwrap();
    assert_eq!((reserved.decision.overall, reserved.id), (Code::OverLimit, None));
    assert_eq!(reserved.decision.statuses[0].code, Code::Ok, "fay's limit had room");
    assert_eq!(
        remaining(&l, &request(&[("user", "fay")])).await,
        1000,
        "and holds nothing"
    );
}

/// A token bucket budget: a settled refund comes back as tokens, never ahead of now.
async fn token_bucket_budget(store: impl Store) {
    let (l, _) = limiter(store);
    let b = request(&[("bucket", "b")]);
    let id = l
        .budgets()
        .reserve(&b, &costs(800), 60_000_000)
        .await
        .unwrap()
        .id
        .unwrap();
    assert_eq!(
        l.budgets().check(&b, &costs(201)).await.unwrap().overall,
        Code::OverLimit
    );
    l.budgets().settle(&b, &id, &costs(100)).await.unwrap().unwrap();
    assert_eq!(l.budgets().check(&b, &costs(900)).await.unwrap().overall, Code::Ok);
    assert_eq!(
        l.budgets().check(&b, &costs(901)).await.unwrap().overall,
        Code::OverLimit
    );
}

/// Named costs: input and output tokens count against limits of their own, and priced against a credit budget, all
/// decided together.
async fn named_costs_and_prices(store: impl Store) {
    let (l, _) = limiter(store);
    let call = request(&[("model", "large"), ("user", "dan")]);
    let first = l
        .budgets()
        .report(&call, &named(&[("input_tokens", 400), ("output_tokens", 50)]))
        .await
        .unwrap();
    let remaining: Vec<u32> = first.statuses.iter().map(|s| s.remaining).collect();
    // The most constrained limit is reported: output has 50 of 100 left.
    assert_eq!(remaining, vec![50]);
    // 101 input tokens would pass the credit budget (1300 + 202 of 3000) but not the input limit (400 + 101 > 500):
    // nothing is counted.
    let denied = l
        .budgets()
        .check(&call, &named(&[("input_tokens", 101)]))
        .await
        .unwrap();
    assert_eq!(denied.overall, Code::OverLimit);
    let id = l
        .budgets()
        .reserve(
            &call,
            &named(&[("input_tokens", 100), ("output_tokens", 50)]),
            60_000_000,
        )
        .await
        .unwrap()
        .id
        .expect("fits every limit");
    let settled = l
        .budgets()
        .settle(&call, &id, &named(&[("input_tokens", 100), ("output_tokens", 10)]))
        .await
        .unwrap()
        .unwrap();
    // Summed over the three limits: estimates 100 + 50 + (200 + 500), actuals 100 + 10 + (200 + 100).
    assert_eq!(
        (settled[0].estimate, settled[0].actual, settled[0].refunded),
        (850, 410, 440)
    );
    assert_eq!(
        l.budgets()
            .check(&call, &named(&[("output_tokens", 40)]))
            .await
            .unwrap()
            .overall,
        Code::Ok
    );
    assert_eq!(
        l.budgets()
            .check(&call, &named(&[("output_tokens", 41)]))
            .await
            .unwrap()
            .overall,
        Code::OverLimit
    );
}

/// A `cost_reports` rule through ShouldRateLimit, as Envoy calls it: cost 0 before (is one unit left?), the
/// response's cost after (counted whatever).
async fn cost_reports_serve_envoys_two_calls(store: impl Store) {
    let (l, _) = limiter(store);
    let mut before = request(&[("reported", "eve")]);
    before.descriptors[0].hits_addend = Some(0);
    let mut after = before.clone();
    after.descriptors[0].hits_addend = Some(70);
    for _ in 0..2 {
        assert_eq!(
            l.decisions().should_rate_limit(&before).await.unwrap().overall,
            Code::Ok
        );
        let reported = l.decisions().should_rate_limit(&after).await.unwrap();
        assert_eq!(reported.overall, Code::Ok, "a report is never refused");
    }
    // 140 of 100 spent: the check before the next call denies.
    let check = l.decisions().should_rate_limit(&before).await.unwrap();
    assert_eq!((check.overall, check.statuses[0].remaining), (Code::OverLimit, 0));
}

every_store!(
    check_and_report,
    concurrent_reservations_never_overspend,
    expiry_settles_at_the_estimate,
    a_refused_reservation_holds_nothing,
    expired_reservations_are_reaped,
    token_bucket_budget,
    named_costs_and_prices,
    cost_reports_serve_envoys_two_calls,
);
