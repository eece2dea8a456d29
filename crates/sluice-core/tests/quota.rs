//! The Rate Limit Quota Service core over both stores, on a manual clock: usage charged past the limit, budgets handed
//! out and given back when another Envoy lacks its share, rates shared as refilling token buckets, exhaustion pushed
//! to the other streams, TTL refresh, DENY_ALL until the window allows more, abandonment, and bad messages named by
//! field.

use std::sync::Arc;

use sluice_core::limiter::Limiter;
use sluice_core::quota::{
    Action, NO_REFILL_S, QuotaCaps, QuotaError, QuotaStream, Quotas, Report, ReportedUsage, Strategy,
};
use sluice_core::store::Store;

use sluice_core::limiter::LimiterSettings;

use crate::harness::limiter_with;

const RULES: &str = "domain: q
quota_buckets:
  - bucket: {name: per_user, user: }
    rate_limit: {unit: hour, requests_per_unit: 100}
    assignment_ttl_seconds: 9
    abandon_after_seconds: 30
  - bucket: {name: open}
    rate_limit: {unlimited: true}
  - bucket: {name: tb, user: }
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
  - bucket: {name: first, user: }
    rate_limit: {unit: hour, requests_per_unit: 5}
    initial_assignment: deny_all
  - bucket: {name: per_second, user: }
    rate_limit: {unit: second, requests_per_unit: 10}
";

/// A bucket's entries, its allowed and its denied requests.
type Reported<'a> = (&'a [(&'a str, &'a str)], u64, u64);

fn report(domain: &str, usages: &[Reported<'_>]) -> Report {
    Report {
        domain: domain.into(),
        usages: usages
            .iter()
            .map(|(bucket, allowed, denied)| ReportedUsage {
                bucket: bucket.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                allowed: *allowed,
                denied: *denied,
            })
            .collect(),
    }
}

fn user(name: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![("user", name), ("name", "per_user")]
}

fn strategy(actions: &[Action]) -> (Strategy, u32) {
    match actions {
        [Action::Assign { strategy, ttl_s, .. }] => (*strategy, *ttl_s),
        other => panic!("expected one assignment, got {other:?}"),
    }
}

/// The size of the one token bucket assigned, and whether it starts full; it never refills.
fn bucket(actions: &[Action]) -> (u32, bool) {
    match actions {
        [
            Action::Assign {
                strategy:
                    Strategy::TokenBucket {
                        max_tokens,
                        tokens_per_fill: 1,
                        fill_interval_s: NO_REFILL_S,
                    },
                fresh,
                ..
            },
        ] => (*max_tokens, *fresh),
        other => panic!("expected one token bucket that does not refill, got {other:?}"),
    }
}

/// The size of a token bucket that starts full.
fn tokens(actions: &[Action]) -> u32 {
    let (size, fresh) = bucket(actions);
    assert!(fresh, "the bucket starts full");
    size
}

/// Whether the stream is woken within 5 s.
async fn woken(stream: &QuotaStream) -> bool {
    tokio::time::timeout(std::time::Duration::from_secs(5), stream.wake())
        .await
        .is_ok()
}

/// A limiter with the key prefix the documented ACL user is given in tests.
fn limiter<S: Store>(yaml: &str, store: S) -> (Arc<Limiter<S>>, Arc<sluice_core::clock::ManualClock>) {
    let settings = LimiterSettings {
        key_prefix: "test:".into(),
        ..LimiterSettings::default()
    };
    limiter_with(yaml, store, settings)
}

async fn setup<S: Store>(store: S) -> (Arc<Quotas<S>>, Arc<sluice_core::clock::ManualClock>, Arc<Limiter<S>>) {
    let (limiter, clock) = limiter(RULES, store);
    (Quotas::new(limiter.clone(), QuotaCaps::default()), clock, limiter)
}

async fn open<S: Store>(quotas: &Arc<Quotas<S>>) -> QuotaStream {
    quotas.open().expect("room for a stream")
}

/// One Envoy alone, the only stream connected, gets all of what is left but the reserve at its first report; usage
/// past the limit is still counted, and the quota is then DENY_ALL until the window ends, when the next tick sends a new grant.
async fn usage_is_charged_and_exhaustion_denies_until_the_window_ends(store: impl Store) {
    let (quotas, clock, _) = setup(store).await;
    let mut a = open(&quotas).await;
    let alice = user("alice");
    let first = quotas.report(&mut a, report("q", &[(&alice, 1, 0)])).await.unwrap();
    assert_eq!(tokens(&first), 96, "all of the 99 left but the reserve of 3");
    assert_eq!(strategy(&first).1, 9, "the rule's TTL");
    // Both the keys order and duplicates in one message are irrelevant.
    let actions = quotas
        .report(
            &mut a,
            report(
                "q",
                &[(&[("name", "per_user"), ("user", "alice")], 60, 3), (&alice, 60, 0)],
            ),
        )
        .await
        .unwrap();
    let (deny, ttl) = strategy(&actions);
    assert_eq!(deny, Strategy::DenyAll, "121 of 100 used");
    let window_left = 3_600 - (crate::harness::T0 / 1_000_000) % 3_600;
    assert!(
        ttl >= 1 && u64::from(ttl) <= window_left.min(9),
        "DENY_ALL holds until the window ends: {ttl}"
    );
    assert!(quotas.tick(&mut a).await.unwrap().is_empty(), "nothing due yet");
    // The Envoy keeps reporting its denials; the quota stays spent until the window ends.
    clock.advance(window_left * 1_000_000 - 1_000_000);
    let denied = quotas.report(&mut a, report("q", &[(&alice, 0, 4)])).await.unwrap();
    assert_eq!(strategy(&denied).0, Strategy::DenyAll);
    assert_eq!(strategy(&denied).1, 1, "one second of the window is left");
    // The next window: the tick sends a new share at once.
    clock.advance(1_000_000);
    let fresh = quotas.tick(&mut a).await.unwrap();
    assert_eq!(tokens(&fresh), 96, "all of the new window but the reserve: {fresh:?}");
}

/// Two Envoys: the second gets nothing the first holds, so the first is told at once and its bucket shrinks to its
/// share; once its report says what it did not spend, the second is told and gets it. When one spends the quota, the
/// other is pushed DENY_ALL; a lone newcomer on another bucket gets half of it, as two streams are connected.
async fn grants_are_given_back_when_another_envoy_lacks_its_share(store: impl Store) {
    let (quotas, _clock, _) = setup(store).await;
    let (mut a, mut b) = (open(&quotas).await, open(&quotas).await);
    let bob = user("bob");
    assert_eq!(
        tokens(&quotas.report(&mut a, report("q", &[(&bob, 30, 0)])).await.unwrap()),
        35,
        "half of the 70 left: two streams are connected, and a's demand is not known yet"
    );
    // b admitted 50 before any grant (its no-assignment behaviour): 20 are left, and a holds 35 of them, 15 past
    // what is left. b gets nothing rather than a token that is not there.
    let b_first = quotas.report(&mut b, report("q", &[(&bob, 50, 0)])).await.unwrap();
    assert_eq!(strategy(&b_first).0, Strategy::DenyAll, "{b_first:?}");
    assert!(woken(&a).await, "a is woken");
    // The fair shares of the 20 left are 10 each: a's bucket of 37 is resized to 10 (Envoy carries its fill
    // fraction over). But a may have admitted all 35 already: they stay a's until its next report says otherwise.
    assert_eq!(bucket(&quotas.tick(&mut a).await.unwrap()), (10, false));
    assert!(quotas.tick(&mut b).await.unwrap().is_empty(), "nothing is free yet");
    let a_report = quotas.report(&mut a, report("q", &[(&bob, 0, 0)])).await.unwrap();
    assert_eq!(bucket(&a_report), (10, false), "it spent nothing: it keeps its 10");
    assert!(woken(&b).await, "b is woken");
    assert_eq!(bucket(&quotas.tick(&mut b).await.unwrap()), (10, true));
    // b spends everything left (and more): a is pushed DENY_ALL.
    assert_eq!(
        strategy(&quotas.report(&mut b, report("q", &[(&bob, 70, 5)])).await.unwrap()).0,
        Strategy::DenyAll
    );
    assert!(woken(&a).await, "a is woken");
    assert_eq!(strategy(&quotas.tick(&mut a).await.unwrap()).0, Strategy::DenyAll);
    // Another user is unaffected.
    let carol = quotas
        .report(&mut a, report("q", &[(&user("carol"), 1, 0)]))
        .await
        .unwrap();
    assert_eq!(tokens(&carol), 49, "half of the 99 left, rounded down");
}

/// Assignments are refreshed before their TTL lapses; a bucket reported with no requests for `abandon_after_seconds`
/// is abandoned; one that keeps reporting requests is not.
async fn ttl_refresh_and_abandonment(store: impl Store) {
    let (quotas, clock, _) = setup(store).await;
    let mut a = open(&quotas).await;
    let (idle, busy) = (user("idle"), user("busy"));
    quotas
        .report(&mut a, report("q", &[(&idle, 1, 0), (&busy, 1, 0)]))
        .await
        .unwrap();
    clock.advance(4_000_000);
    assert!(
        quotas.tick(&mut a).await.unwrap().is_empty(),
        "a 9 s TTL is not refreshed 5 s before it lapses"
    );
    // Due 4 s before the lapse (a third of it, one tick early), so that a tick every second still refreshes it at
    // least 2 s before: here the tick 4 s before.
    clock.advance(1_000_000);
    let refreshed = quotas.tick(&mut a).await.unwrap();
    assert_eq!(refreshed.len(), 2, "{refreshed:?}");
    clock.advance(1_000_000);
    for step in 0..6 {
        clock.advance(4_000_000);
        quotas
            .report(&mut a, report("q", &[(&idle, 0, 0), (&busy, 1, 0)]))
            .await
            .unwrap();
        let ticked = quotas.tick(&mut a).await.unwrap();
        let abandoned: Vec<_> = ticked.iter().filter(|a| matches!(a, Action::Abandon { .. })).collect();
        if step < 5 {
            assert!(abandoned.is_empty(), "step {step}: {ticked:?}");
        } else {
            // 30 s after its last request.
            assert_eq!(abandoned.len(), 1, "{ticked:?}");
            assert!(
                matches!(&abandoned[0], Action::Abandon { bucket } if bucket.contains(&("user".into(), "idle".into())))
            );
        }
    }
    assert_eq!(a.buckets(), 1);
}

/// Unknown buckets and unlimited rules are ALLOW_ALL; a token-bucket quota is granted like any other (from what its
/// bucket holds now);
/// `initial_assignment: deny_all` answers a bucket's first report.
async fn strategies_per_rule(store: impl Store) {
    let (quotas, _clock, _) = setup(store).await;
    let mut a = open(&quotas).await;
    let unknown = quotas
        .report(&mut a, report("q", &[(&[("who", "knows")], 1, 0)]))
        .await
        .unwrap();
    assert_eq!(strategy(&unknown).0, Strategy::AllowAll);
    let open_bucket = quotas
        .report(&mut a, report("q", &[(&[("name", "open")], 5, 0)]))
        .await
        .unwrap();
    assert_eq!(strategy(&open_bucket).0, Strategy::AllowAll);
    // A token bucket of 10 a second (a burst of 20) is a rate: shared as one.
    let tb = quotas
        .report(&mut a, report("q", &[(&[("name", "tb"), ("user", "u")], 4, 0)]))
        .await
        .unwrap();
    assert_eq!(strategy(&tb).0, rate(10, 1));
    let first = [("name", "first"), ("user", "u")];
    assert_eq!(
        strategy(&quotas.report(&mut a, report("q", &[(&first, 1, 0)])).await.unwrap()).0,
        Strategy::DenyAll
    );
    assert_eq!(
        tokens(&quotas.report(&mut a, report("q", &[(&first, 0, 1)])).await.unwrap()),
        4,
        "all of the 4 left: its demand is known, and the reserve of 4 left is none"
    );
}

/// A refilling token bucket of `per_fill` tokens every `every_s` seconds, holding a quarter of that at most.
fn rate(per_fill: u32, every_s: u32) -> Strategy {
    Strategy::TokenBucket {
        max_tokens: per_fill.div_ceil(4),
        tokens_per_fill: per_fill,
        fill_interval_s: every_s,
    }
}

/// A per-second limit is shared as rates that sum to it: a lone Envoy gets all of it, refilling every second; a
/// second one gets nothing the first holds, the first is told at once and its rate halves, and the second gets the
/// other half; their demands then share it by want.
async fn rates_are_shared_as_refilling_token_buckets(store: impl Store) {
    let (quotas, clock, _) = setup(store).await;
    let (mut a, mut b) = (open(&quotas).await, open(&quotas).await);
    let dan = [("name", "per_second"), ("user", "dan")];
    let first = quotas.report(&mut a, report("q", &[(&dan, 3, 0)])).await.unwrap();
    assert_eq!(strategy(&first).0, rate(10, 1), "all of it");
    let b_first = quotas.report(&mut b, report("q", &[(&dan, 0, 2)])).await.unwrap();
    assert_eq!(strategy(&b_first).0, Strategy::DenyAll, "a has all of it, for now");
    assert!(woken(&a).await, "a is woken");
    assert_eq!(strategy(&quotas.tick(&mut a).await.unwrap()).0, rate(5, 1));
    assert!(woken(&b).await, "b is woken");
    assert_eq!(strategy(&quotas.tick(&mut b).await.unwrap()).0, rate(5, 1));
    // Their demands said, at their pace since their first reports 5 s ago: a 33 requests (7 a second, rounded up), b
    // 12 (3); of 10 a second, max-min fair 7 and 3: together they have all 10.
    clock.advance(5_000_000);
    quotas.report(&mut a, report("q", &[(&dan, 20, 10)])).await.unwrap();
    quotas.report(&mut b, report("q", &[(&dan, 5, 5)])).await.unwrap();
    let mut shares = Vec::new();
    for s in [&mut a, &mut b] {
        quotas.tick(s).await.unwrap();
        let r = quotas.report(s, report("q", &[(&dan, 0, 0)])).await.unwrap();
        let Strategy::TokenBucket { tokens_per_fill, .. } = strategy(&r).0 else {
            panic!("{r:?}")
        };
        shares.push(tokens_per_fill);
    }
    assert_eq!(shares, vec![7, 3]);
}

/// Bad messages end the stream with an error naming the field; the stream and bucket caps hold.
async fn bad_messages_and_caps(store: impl Store) {
    let (limiter, _) = limiter(RULES, store);
    let caps = QuotaCaps {
        max_streams: 1,
        max_buckets_per_stream: 2,
        max_value_bytes: 16,
    };
    let quotas = Quotas::new(limiter, caps);
    let mut a = quotas.open().unwrap();
    assert!(matches!(quotas.open(), Err(QuotaError::OverCap(m)) if m.contains("--rlqs-max-streams")));
    let invalid = |e: Result<Vec<Action>, QuotaError>| match e {
        Err(QuotaError::Invalid(m)) => m,
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    };
    let e = invalid(quotas.report(&mut a, report("", &[(&user("x"), 1, 0)])).await);
    assert!(e.starts_with("domain: empty"), "{e}");
    let e = invalid(quotas.report(&mut a, report("q", &[])).await);
    assert_eq!(e, "bucket_quota_usages: empty");
    let e = invalid(
        quotas
            .report(&mut a, report("q", &[(&user("x"), 1, 0), (&[], 1, 0)]))
            .await,
    );
    assert_eq!(
        e,
        "bucket_quota_usages[1].bucket_id.bucket: the bucket id has no entries"
    );
    let e = invalid(quotas.report(&mut a, report("q", &[(&[("", "v")], 1, 0)])).await);
    assert_eq!(e, "bucket_quota_usages[0].bucket_id.bucket: a key is empty");
    let e = invalid(
        quotas
            .report(&mut a, report("q", &[(&[("user", "a-very-long-user-name")], 1, 0)]))
            .await,
    );
    assert!(
        e.contains("bucket_quota_usages[0].bucket_id.bucket['user'] is 21 bytes, over the cap of 16"),
        "{e}"
    );
    let e = invalid(quotas.report(&mut a, report("other", &[(&user("x"), 1, 0)])).await);
    assert_eq!(e, "domain: 'other' differs from the stream's domain 'q'");
    quotas
        .report(&mut a, report("", &[(&user("x"), 1, 0), (&user("y"), 1, 0)]))
        .await
        .unwrap();
    let e = quotas
        .report(&mut a, report("q", &[(&user("z"), 1, 0)]))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, QuotaError::OverCap(m) if m.contains("over the cap of 2")),
        "{e:?}"
    );
    drop(a);
    assert!(quotas.open().is_ok(), "a closed stream gives its place back");
}

/// Two Envoys share a quota; one ends its stream (it closed it, or went away): its grant goes back at once, and the
/// one left, told at once, holds all that is left but the reserve. A stream sluice drops without its Envoy leaving
/// (a shutdown) keeps its entry.
async fn a_stream_its_envoy_ends_gives_its_grant_back(store: impl Store) {
    let (quotas, _clock, _) = setup(store).await;
    let (mut a, mut b) = (open(&quotas).await, open(&quotas).await);
    let erin = user("erin");
    assert_eq!(
        tokens(&quotas.report(&mut a, report("q", &[(&erin, 1, 0)])).await.unwrap()),
        49
    );
    assert_eq!(
        tokens(&quotas.report(&mut b, report("q", &[(&erin, 1, 0)])).await.unwrap()),
        47
    );
    assert!(woken(&a).await, "a is woken");
    // a's 49 are within a tenth of its share of 47: its bucket is left as it is.
    assert!(quotas.tick(&mut a).await.unwrap().is_empty());
    quotas.leave(&mut b).await;
    drop(b);
    assert!(woken(&a).await, "a is told b left");
    let (alone, _) = bucket(&quotas.tick(&mut a).await.unwrap());
    assert!(alone >= 98 * 9 / 10, "all of the 98 left but the reserve: {alone}");
    // A stream dropped without leaving (sluice shuts down) keeps its grant until its TTL lapses.
    let mut c = open(&quotas).await;
    let frank = user("frank");
    assert_eq!(
        tokens(&quotas.report(&mut c, report("q", &[(&frank, 1, 0)])).await.unwrap()),
        49
    );
    drop(c);
    let d = quotas.report(&mut a, report("q", &[(&frank, 1, 0)])).await.unwrap();
    assert_eq!(
        tokens(&d),
        47,
        "c's entry stays: a gets its share, half of the 95 past the reserve: {d:?}"
    );
}

/// The streams connected to every instance on one Redis size a lone newcomer's first grant: three on one instance
/// and one on another, each instance hears of the other's within moments, and a first report gets a quarter of what
/// is left; as streams end, the others hear of it.
#[tokio::test]
async fn first_grants_are_sized_by_the_streams_of_every_instance() {
    let redis = crate::harness::RedisServer::start();
    let one = Quotas::new(
        limiter(RULES, crate::harness::redis_store(&redis.url()).await).0,
        QuotaCaps::default(),
    );
    let two = Quotas::new(
        limiter(RULES, crate::harness::redis_store(&redis.url()).await).0,
        QuotaCaps::default(),
    );
    let mut here: Vec<QuotaStream> = Vec::new();
    for _ in 0..3 {
        here.push(open(&one).await);
    }
    let mut there = open(&two).await;
    heard(&two, 4).await;
    heard(&one, 4).await;
    let first = quotas_report(&two, &mut there, "gina").await;
    assert_eq!(tokens(&first), 24, "a quarter of the 99 left, rounded down");
    here.truncate(1);
    heard(&two, 2).await;
}

async fn quotas_report<S: Store>(quotas: &Quotas<S>, stream: &mut QuotaStream, name: &'static str) -> Vec<Action> {
    quotas
        .report(stream, report("q", &[(&user(name), 1, 0)]))
        .await
        .unwrap()
}

/// Waits, up to 10 s, for an instance to count `streams` streams connected.
async fn heard<S: Store>(quotas: &Quotas<S>, streams: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while quotas.population() != streams {
        assert!(
            std::time::Instant::now() < deadline,
            "{} streams, not {streams}",
            quotas.population()
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

every_store!(
    usage_is_charged_and_exhaustion_denies_until_the_window_ends,
    grants_are_given_back_when_another_envoy_lacks_its_share,
    a_stream_its_envoy_ends_gives_its_grant_back,
    ttl_refresh_and_abandonment,
    strategies_per_rule,
    rates_are_shared_as_refilling_token_buckets,
    bad_messages_and_caps,
);
