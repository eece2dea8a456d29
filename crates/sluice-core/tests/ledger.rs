//! The grant ledger of an RLQS bucket ([`Grants::grant`]) over every store: the tokens all holders hold never add up
//! to more than the quota has left, shares are max-min fair by want, a holder above its share gives back what the
//! others lack, and holders that leave or lapse count for nothing.

use sluice_core::rules::Algorithm;
use sluice_core::store::{CounterKey, Grant, Granted, Hit, Store, TierSpec, fair_shares, granted_amount};

use crate::harness::{T0, tier};
use sluice_core::store::Mode;

const MINUTE: u64 = 60_000_000;

fn quota(limit: u64) -> TierSpec {
    tier("q", Algorithm::FixedWindow, limit, MINUTE, limit)
}

fn ledger() -> CounterKey {
    CounterKey::builder("test:", "d").entry("k", "q").finish().grants()
}

async fn grant(store: &impl Store, now: u64, limit: u64, holder: &str, held: u64, want: u64) -> Granted {
    let g = Grant {
        tiers: vec![quota(limit)],
        ledger: ledger(),
        holder: holder.into(),
        held,
        want,
        ttl_us: 10_000_000,
    };
    store
        .grant(now, std::slice::from_ref(&g))
        .await
        .remove(0)
        .expect("the store grants")
}

/// Charges `used` requests to the quota, as an RLQS report does.
async fn charge(store: &impl Store, now: u64, limit: u64, used: u64) {
    let hit = Hit {
        tiers: vec![quota(limit)],
        cost: used,
        lease: "l".into(),
        fields: Vec::new(),
        record: None,
        mode: Mode::Report,
    };
    crate::harness::decided(store.hit(now, std::slice::from_ref(&hit)).await);
}

every_store!(
    grants_never_add_up_to_more_than_is_left,
    used_tokens_leave_the_quota_and_the_grants_alike,
    holders_that_leave_or_lapse_count_for_nothing,
    idle_holders_get_what_they_want_not_the_whole_quota,
    amounts_at_the_ledger_cap_do_not_wrap,
);

/// Three holders arrive one by one: each gets at most what no other holds; one above its share gives back what the
/// others lack; in the end each holds its max-min fair share, and never do they hold more than 100 together.
async fn grants_never_add_up_to_more_than_is_left(store: impl Store) {
    let t = T0;
    let a = grant(&store, t, 100, "a", 0, 60).await;
    assert_eq!((a.held, a.share, a.left, a.holders, a.total_held), (60, 60, 100, 1, 60));
    let b = grant(&store, t, 100, "b", 0, 60).await;
    assert_eq!(
        (b.held, b.share, b.total_held),
        (40, 50, 100),
        "only what a does not hold"
    );
    let c = grant(&store, t, 100, "c", 0, 10).await;
    assert_eq!(
        (c.held, c.share, c.total_held),
        (0, 10, 100),
        "nothing is free: nothing, not a rounded-up 1"
    );
    // a holds 60 against a share of 45: b lacks 5 and c 10, so a is to give back 15; but its 60 stay its entry
    // until it says it did not spend them.
    let a = grant(&store, t, 100, "a", 60, 60).await;
    assert_eq!((a.held, a.share, a.entry, a.total_held), (45, 45, 60, 100));
    assert_eq!(grant(&store, t, 100, "c", 0, 10).await.held, 0);
    let a = grant(&store, t, 100, "a", 45, 60).await;
    assert_eq!((a.held, a.share, a.total_held), (45, 45, 85));
    let c = grant(&store, t, 100, "c", 0, 10).await;
    assert_eq!((c.held, c.total_held), (10, 95));
    let b = grant(&store, t, 100, "b", 40, 60).await;
    assert_eq!((b.held, b.share, b.total_held), (45, 45, 100));
    // Asked again with nothing changed, every holder keeps what it has.
    for (h, held, want) in [("a", 45, 60), ("b", 45, 60), ("c", 10, 10)] {
        let g = grant(&store, t, 100, h, held, want).await;
        assert_eq!((g.held, g.total_held), (held, 100), "{h}");
    }
}

/// Tokens used are charged to the quota and leave the holder's amount: the ledger still fits what is left.
async fn used_tokens_leave_the_quota_and_the_grants_alike(store: impl Store) {
    let t = T0;
    grant(&store, t, 100, "a", 0, 50).await;
    grant(&store, t, 100, "b", 0, 50).await;
    charge(&store, t, 100, 30).await;
    // a used 30 of its 50: it reports 20 held; what is left is 70, and b holds 50 of it.
    let a = grant(&store, t, 100, "a", 20, 50).await;
    assert_eq!((a.left, a.held, a.share, a.total_held), (70, 20, 35, 70));
    let b = grant(&store, t, 100, "b", 50, 50).await;
    assert_eq!(
        (b.held, b.share, b.total_held),
        (35, 35, 70),
        "b is to give back what a lacks"
    );
    let b = grant(&store, t, 100, "b", 35, 50).await;
    assert_eq!((b.held, b.total_held), (35, 55), "b says it holds 35");
    let a = grant(&store, t, 100, "a", 20, 50).await;
    assert_eq!((a.held, a.total_held), (35, 70));
    // Usage past the limit (Envoys decide on their own): nothing is left, nobody gets anything.
    charge(&store, t, 100, 90).await;
    let a = grant(&store, t, 100, "a", 0, 50).await;
    assert_eq!((a.left, a.held), (0, 0));
    // The next window: the whole quota again.
    let next = t - t % MINUTE + MINUTE;
    let b = grant(&store, next, 100, "b", 0, 50).await;
    assert_eq!((b.left, b.held, b.share), (100, 50, 50));
}

/// A holder that wants nothing leaves the ledger; one not heard of within its TTL counts for nothing.
async fn holders_that_leave_or_lapse_count_for_nothing(store: impl Store) {
    let t = T0;
    grant(&store, t, 100, "a", 0, 100).await;
    let b = grant(&store, t, 100, "b", 0, 100).await;
    assert_eq!(b.held, 0);
    let gone = grant(&store, t, 100, "a", 100, 0).await;
    assert_eq!((gone.held, gone.holders, gone.total_held), (0, 1, 0), "a left");
    let b = grant(&store, t, 100, "b", 0, 100).await;
    assert_eq!((b.held, b.holders), (100, 1));
    // b is not heard of for its TTL (10 s): c gets everything.
    let c = grant(&store, t + 10_000_000, 100, "c", 0, 100).await;
    assert_eq!((c.held, c.holders, c.total_held), (100, 1, 100));
}

/// Envoys that report no requests want 1 token each: 1 000 left, two idle holders hold 2, and a third one with
/// demand gets the rest it wants.
async fn idle_holders_get_what_they_want_not_the_whole_quota(store: impl Store) {
    let t = T0;
    for h in ["a", "b"] {
        let g = grant(&store, t, 1_000, h, 0, 1).await;
        assert_eq!(g.held, 1, "{h}");
    }
    let c = grant(&store, t, 1_000, "c", 0, 2_000).await;
    assert_eq!((c.held, c.share, c.total_held), (998, 998, 1_000));
}

/// Amounts and limits at their largest neither wrap nor lose exactness.
async fn amounts_at_the_ledger_cap_do_not_wrap(store: impl Store) {
    let max = sluice_core::store::MAX_LEDGER_AMOUNT;
    let limit = u64::from(u32::MAX);
    let a = grant(&store, T0, limit, "a", 0, max).await;
    assert_eq!((a.held, a.share), (limit, limit));
    let b = grant(&store, T0, limit, "b", max, max).await;
    assert_eq!(
        (b.held, b.entry, b.total_held),
        (0, 0, limit),
        "b's own count says {max}, but it was granted nothing"
    );
    let a = grant(&store, T0, limit, "a", limit, max).await;
    assert_eq!(a.held, limit / 2, "a is to give back b's share, {}", limit / 2 + 1);
    let a = grant(&store, T0, limit, "a", limit / 2, max).await;
    assert_eq!((a.held, a.total_held), (limit / 2, limit / 2));
    let b = grant(&store, T0, limit, "b", 0, max).await;
    assert_eq!((b.held, b.total_held), (limit / 2 + 1, limit));
}

#[test]
fn fair_shares_serve_the_least_wanting_first_and_never_round_up() {
    assert_eq!(fair_shares(10, &[("a", 1), ("b", 100), ("c", 100)]), vec![1, 4, 5]);
    assert_eq!(fair_shares(100, &[("a", 60), ("b", 60)]), vec![50, 50]);
    assert_eq!(
        fair_shares(100, &[("a", 10), ("b", 20)]),
        vec![10, 20],
        "wants below capacity"
    );
    assert_eq!(fair_shares(0, &[("a", 5)]), vec![0]);
    // Ties by name: a is served first, and its equal part of 2 among three rounds down to nothing.
    assert_eq!(fair_shares(2, &[("b", 9), ("a", 9), ("c", 9)]), vec![1, 0, 1]);
    assert!(fair_shares(7, &[]).is_empty());
}

#[test]
fn granted_amounts_grow_from_what_is_free_and_shrink_by_what_others_lack() {
    // Below the share: up to it, from what is free.
    assert_eq!(granted_amount(100, 0, 50, &[(60, 50)]), 40);
    assert_eq!(granted_amount(100, 10, 50, &[(40, 50)]), 50);
    // Above the share: down by what the others lack beyond what is free, never below the share.
    assert_eq!(granted_amount(100, 60, 45, &[(40, 45), (0, 10)]), 45);
    assert_eq!(
        granted_amount(100, 60, 45, &[(40, 45)]),
        55,
        "the other lacks 5, and none are free"
    );
    // What it holds was counted when it was granted: less room now (usage reported by others, their entries not yet
    // lowered) does not take it away; growth needs what is free.
    assert_eq!(granted_amount(50, 60, 60, &[(20, 0)]), 60);
    assert_eq!(granted_amount(50, 20, 60, &[(40, 0)]), 20);
    // Nothing left: nothing.
    assert_eq!(granted_amount(0, 5, 5, &[]), 0);
}
