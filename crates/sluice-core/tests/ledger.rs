//! The grant ledger of an RLQS bucket ([`Grants::grant`]) over every store: the tokens all holders hold never add up
//! to more than the quota has left, what is left is handed out (max-min fair by want, the surplus by want) but for a
//! reserve only newcomers take, a holder above its share is shrunk to it at once, a lone newcomer gets its part among the streams connected, rates are shared whole, and
//! holders that leave or lapse count for nothing.

use sluice_core::rules::Algorithm;
use sluice_core::store::Claimant;
use sluice_core::store::{CounterKey, Grant, Granted, Hit, Store, TierSpec, allot, fair_shares, targets};

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
    claim(store, now, limit, (holder, held, want), None, None).await
}

/// A newcomer's grant: before its second report, with `streams` connected.
async fn newcomer_of(
    store: &impl Store,
    now: u64,
    limit: u64,
    (holder, held, want): (&str, u64, u64),
    streams: u64,
) -> Granted {
    claim(store, now, limit, (holder, held, want), Some(streams), None).await
}

/// A newcomer's grant, with more streams connected than hold anything.
async fn newcomer(store: &impl Store, now: u64, limit: u64, holder: &str, held: u64, want: u64) -> Granted {
    newcomer_of(store, now, limit, (holder, held, want), 100).await
}

async fn claim(
    store: &impl Store,
    now: u64,
    limit: u64,
    (holder, held, want): (&str, u64, u64),
    newcomer: Option<u64>,
    rate: Option<u64>,
) -> Granted {
    let g = Grant {
        tiers: vec![quota(limit)],
        ledger: ledger(),
        holder: holder.into(),
        held,
        want,
        ttl_us: 10_000_000,
        newcomer,
        rate,
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
    an_idle_holder_gives_way_to_a_newcomer_served_from_the_reserve,
    a_rate_is_shared_whole_and_follows_each_grant_both_ways,
    a_lone_newcomer_gets_its_part_of_what_is_left_among_the_streams_connected,
    a_newcomer_wants_as_much_as_any_other_until_it_says_its_demand,
    amounts_at_the_ledger_cap_do_not_wrap,
);

/// 100 left, a reserve of 4: a lone holder gets the other 96; a second one gets only what is free past the reserve
/// (nothing), or as a newcomer the reserve; the first gives back what the second lacks and the reserve, and in the end
/// each holds half of the 96, and never do they hold more than 100 together.
async fn grants_never_add_up_to_more_than_is_left(store: impl Store) {
    let t = T0;
    let a = grant(&store, t, 100, "a", 0, 60).await;
    assert_eq!(
        (a.held, a.share, a.left, a.holders, a.total_held),
        (96, 96, 100, 1, 96),
        "all but the reserve"
    );
    let b = grant(&store, t, 100, "b", 0, 60).await;
    assert_eq!(
        (b.held, b.share, b.total_held),
        (0, 48, 96),
        "the reserve is a newcomer's"
    );
    let b = newcomer(&store, t, 100, "b", 0, 60).await;
    assert_eq!(
        (b.held, b.share, b.total_held),
        (4, 48, 100),
        "a newcomer takes the reserve"
    );
    // a holds 96 against a share of 48: b lacks 44 and the reserve 4, so a is to give back 48; but its 96 stay its
    // entry until it says it did not spend them.
    let a = grant(&store, t, 100, "a", 96, 60).await;
    assert_eq!((a.held, a.share, a.entry, a.total_held), (48, 48, 96, 100));
    let a = grant(&store, t, 100, "a", 48, 60).await;
    assert_eq!((a.held, a.total_held), (48, 52));
    let b = grant(&store, t, 100, "b", 4, 60).await;
    assert_eq!((b.held, b.share, b.total_held), (48, 48, 96));
    // Asked again with nothing changed, every holder keeps what it has.
    for h in ["a", "b"] {
        let g = grant(&store, t, 100, h, 48, 60).await;
        assert_eq!((g.held, g.total_held), (48, 96), "{h}");
    }
}

/// Tokens used are charged to the quota and leave the holder's amount: the ledger still fits what is left.
async fn used_tokens_leave_the_quota_and_the_grants_alike(store: impl Store) {
    let t = T0;
    grant(&store, t, 100, "a", 0, 50).await;
    newcomer(&store, t, 100, "b", 0, 50).await;
    grant(&store, t, 100, "a", 96, 50).await;
    grant(&store, t, 100, "a", 48, 50).await;
    let b = grant(&store, t, 100, "b", 4, 50).await;
    assert_eq!((b.held, b.total_held), (48, 96));
    charge(&store, t, 100, 30).await;
    // a used 30 of its 48: it reports 18 held; what is left is 70 (a reserve of 2), and b holds 48 of it: a takes the 2
    // free past the reserve.
    let a = grant(&store, t, 100, "a", 18, 50).await;
    assert_eq!((a.left, a.held, a.share, a.total_held), (70, 20, 34, 68));
    let b = grant(&store, t, 100, "b", 48, 50).await;
    assert_eq!(
        (b.held, b.share, b.total_held),
        (34, 34, 68),
        "b is to give back what a lacks"
    );
    let b = grant(&store, t, 100, "b", 34, 50).await;
    assert_eq!((b.held, b.total_held), (34, 54), "b says it holds 34");
    let a = grant(&store, t, 100, "a", 20, 50).await;
    assert_eq!((a.held, a.total_held), (34, 68));
    // Usage past the limit (Envoys decide on their own): nothing is left, nobody gets anything.
    charge(&store, t, 100, 90).await;
    let a = grant(&store, t, 100, "a", 0, 50).await;
    assert_eq!((a.left, a.held), (0, 0));
    // The next window: the whole quota again, but the reserve.
    let next = t - t % MINUTE + MINUTE;
    let b = grant(&store, next, 100, "b", 0, 50).await;
    assert_eq!((b.left, b.held, b.share), (100, 96, 96));
}

/// A holder that wants nothing leaves the ledger; one not heard of within its TTL counts for nothing.
async fn holders_that_leave_or_lapse_count_for_nothing(store: impl Store) {
    let t = T0;
    grant(&store, t, 100, "a", 0, 100).await;
    let b = grant(&store, t, 100, "b", 0, 100).await;
    assert_eq!(b.held, 0);
    let gone = grant(&store, t, 100, "a", 96, 0).await;
    assert_eq!((gone.held, gone.holders, gone.total_held), (0, 1, 0), "a left");
    let b = grant(&store, t, 100, "b", 0, 100).await;
    assert_eq!((b.held, b.holders), (96, 1));
    // b is not heard of for its TTL (10 s): c gets everything but the reserve.
    let c = grant(&store, t + 10_000_000, 100, "c", 0, 100).await;
    assert_eq!((c.held, c.holders, c.total_held), (96, 1, 96));
}

/// An idle holder (wanting 1) alone holds all but the reserve; a newcomer with demand is served the reserve at once,
/// the holder gives back all but its part of the surplus, and the newcomer then gets all of its share.
async fn an_idle_holder_gives_way_to_a_newcomer_served_from_the_reserve(store: impl Store) {
    let t = T0;
    let a = grant(&store, t, 1_000, "a", 0, 1).await;
    assert_eq!(a.held, 960);
    let c = newcomer(&store, t, 1_000, "c", 0, 50).await;
    assert_eq!(
        (c.held, c.share, c.total_held),
        (40, 941, 1_000),
        "the reserve, at once"
    );
    let a = grant(&store, t, 1_000, "a", 960, 1).await;
    assert_eq!(
        (a.held, a.share, a.entry),
        (18, 18, 960),
        "a is shrunk to its share at once, and keeps its entry until it reports"
    );
    let a = grant(&store, t, 1_000, "a", 18, 1).await;
    assert_eq!((a.held, a.total_held), (18, 58));
    let c = newcomer(&store, t, 1_000, "c", 40, 50).await;
    assert_eq!((c.held, c.total_held), (941, 959), "then its share, at once");
    let c = grant(&store, t, 1_000, "c", 941, 50).await;
    assert_eq!((c.held, c.total_held), (941, 959), "and after its second report");
    // Another newcomer takes the reserve and what rounding left, at once.
    let e = newcomer(&store, t, 1_000, "e", 0, 50).await;
    assert_eq!((e.held, e.total_held), (41, 1_000));
    // A huge want gets nothing while nothing is free.
    let d = grant(&store, t, 1_000, "d", 0, sluice_core::store::MAX_LEDGER_AMOUNT).await;
    assert_eq!((d.held, d.total_held), (0, 1_000), "nothing is free");
}

/// A rate of 100 a window: a lone newcomer gets all of it (no reserve, whatever the streams connected); a second
/// newcomer gets what the first gives back, which the first does at once, its entry following its grant down.
async fn a_rate_is_shared_whole_and_follows_each_grant_both_ways(store: impl Store) {
    let t = T0;
    let rate = |h, held, want, new: bool| claim(&store, t, 1_000_000, (h, held, want), new.then_some(2), Some(100));
    let a = rate("a", 0, 10, true).await;
    assert_eq!((a.held, a.share, a.left, a.entry), (100, 100, 100, 100));
    let b = rate("b", 0, 5, true).await;
    assert_eq!((b.held, b.share), (0, 50), "a newcomer wants what a wants: half");
    let a = rate("a", 100, 10, false).await;
    assert_eq!(
        (a.held, a.entry, a.total_held),
        (50, 50, 50),
        "a rate given back is gone at once"
    );
    let b = rate("b", 0, 5, true).await;
    assert_eq!((b.held, b.total_held), (50, 100));
    // Once b says its demand (5 a window), the surplus follows the wants: b 5 + 28, a 10 + 56, rounded down.
    let b = rate("b", 50, 5, false).await;
    assert_eq!((b.held, b.share), (33, 33), "b gives back down to its share");
    let a = rate("a", 50, 10, false).await;
    assert_eq!((a.held, a.share, a.total_held), (66, 66, 99));
}

/// A newcomer with no other holder gets what is left divided by the streams connected to the fleet (as each may come
/// for the bucket at once): all but the reserve when it is the only one, a quarter of 1 000 with four, the same again
/// on its next grant; then, once it says its demand, all but the reserve.
async fn a_lone_newcomer_gets_its_part_of_what_is_left_among_the_streams_connected(store: impl Store) {
    let t = T0;
    let alone = newcomer_of(&store, t, 1_000, ("a", 0, 1), 1).await;
    assert_eq!(
        (alone.held, alone.share, alone.total_held),
        (960, 960, 960),
        "all but the reserve"
    );
    let b = claim(&store, t, 1_000, ("a", 960, 0), None, None).await;
    assert_eq!(b.total_held, 0, "a left");
    let b = newcomer_of(&store, t, 1_000, ("b", 0, 5), 4).await;
    assert_eq!((b.held, b.share), (250, 960), "a quarter, with four streams connected");
    let b = newcomer_of(&store, t, 1_000, ("b", 250, 5), 4).await;
    assert_eq!(b.held, 250, "no more before its demand is known");
    let b = grant(&store, t, 1_000, "b", 250, 5).await;
    assert_eq!(b.held, 960, "then all but the reserve");
}

/// A newcomer's entry says it has not said its demand yet: a holder that then says a larger demand shares with it as
/// with an equal, not by the want the newcomer had when it came.
async fn a_newcomer_wants_as_much_as_any_other_until_it_says_its_demand(store: impl Store) {
    let t = T0;
    assert_eq!(newcomer_of(&store, t, 1_000, ("a", 0, 1), 2).await.held, 500);
    assert_eq!(newcomer_of(&store, t, 1_000, ("b", 0, 1), 2).await.held, 480);
    let a = grant(&store, t, 1_000, "a", 500, 256).await;
    assert_eq!((a.held, a.share), (480, 480), "b wants as much as a");
    let b = grant(&store, t, 1_000, "b", 480, 16).await;
    assert_eq!(b.share, 56, "once b says its demand, the shares follow the wants");
}

/// Amounts and limits at their largest neither wrap nor lose exactness.
async fn amounts_at_the_ledger_cap_do_not_wrap(store: impl Store) {
    let max = sluice_core::store::MAX_LEDGER_AMOUNT;
    let limit = u64::from(u32::MAX);
    let pool = limit - limit / 25;
    let a = grant(&store, T0, limit, "a", 0, max).await;
    assert_eq!((a.held, a.share), (pool, pool));
    let b = grant(&store, T0, limit, "b", max, max).await;
    assert_eq!(
        (b.held, b.entry, b.total_held),
        (0, 0, pool),
        "b's own count says {max}, but it was granted nothing"
    );
    let a = grant(&store, T0, limit, "a", pool, max).await;
    assert_eq!(a.held, pool / 2, "a is to give back b's share");
    let a = grant(&store, T0, limit, "a", pool / 2, max).await;
    assert_eq!((a.held, a.total_held), (pool / 2, pool / 2));
    let b = grant(&store, T0, limit, "b", 0, max).await;
    assert_eq!((b.held, b.total_held), (pool / 2, pool));
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
fn targets_hand_out_the_surplus_by_want_and_never_more_than_the_pool() {
    assert_eq!(
        targets(100, &[("a", 10), ("b", 30)]),
        vec![25, 75],
        "all of it, by want"
    );
    assert_eq!(
        targets(96, &[("a", 60), ("b", 60)]),
        vec![48, 48],
        "no surplus: the fair shares"
    );
    assert_eq!(targets(960, &[("a", 1), ("c", 50)]), vec![18, 941], "rounded down");
    let max = sluice_core::store::MAX_LEDGER_AMOUNT;
    for wants in [
        vec![("a", max), ("b", 1), ("c", 3)],
        vec![("a", 7), ("b", 7), ("c", 7)],
        vec![("a", max), ("b", max)],
    ] {
        for pool in [0, 1, 2, 1_000, u64::from(u32::MAX)] {
            let t = targets(pool, &wants);
            assert!(t.iter().sum::<u64>() <= pool, "{wants:?} of {pool}: {t:?}");
        }
    }
}

#[test]
fn what_is_open_is_shared_by_all_that_lack() {
    let holder = |name, held, want| Claimant {
        name,
        held,
        want,
        newcomer: false,
    };
    // 100 left, a reserve of 4: a holds 80, b and c hold nothing, each is to hold 32. 16 are open past the reserve:
    // b takes its part, 8, and leaves c's 8 for c, rather than all 16.
    let others = [holder("a", 80, 50), holder("c", 0, 50)];
    let b = allot(100, holder("b", 0, 50), &others, None, false);
    assert_eq!((b.amount, b.share, b.entry), (8, 32, 8));
    // Then c: 8 are open, and it lacks 32 of the 56 lacking.
    let others = [holder("a", 80, 50), holder("b", 8, 50)];
    assert_eq!(allot(100, holder("c", 0, 50), &others, None, false).amount, 4);
    // One token open among many that lack: the first to ask gets it, rather than nobody.
    let others = [holder("a", 95, 50), holder("c", 0, 50)];
    assert_eq!(allot(100, holder("b", 0, 50), &others, None, false).amount, 1);
}
