//! WaitForPermit in the core: a call held until its hit would pass (the exact wait the limits give, on the
//! limiter's clock), nothing consumed by a caller that gives up, waiters of one request served in arrival order, and
//! a bound on how many wait.

use std::sync::Arc;

use sluice_core::clock::ManualClock;
use sluice_core::limiter::{Code, Descriptor, LimitError, Limiter, LimiterSettings, Request};
use sluice_core::store::Store;

use crate::harness::{limiter, limiter_with};

const SECOND: u64 = 1_000_000;

/// One hit a minute (T0 is 10 s into its minute: the next window starts 50 s later).
const CONFIG: &str = "
domain: wait
descriptors:
  - key: job
    rate_limit: {unit: minute, requests_per_unit: 1}
";

fn req(job: &str) -> Request {
    Request {
        domain: "wait".into(),
        descriptors: vec![Descriptor {
            entries: vec![("job".into(), job.into())],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    }
}

/// Lets the waiters run until `n` of them wait on the clock (store calls take real time, so the test yields).
async fn until_sleeping(clock: &ManualClock, n: usize) {
    for _ in 0..10_000 {
        if clock.sleepers() >= n {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    panic!("{} waiters asleep, not {n}", clock.sleepers());
}

fn spawn_wait<S: Store>(
    l: &Arc<Limiter<S>>,
    job: &str,
    max_wait_us: u64,
) -> tokio::task::JoinHandle<Result<sluice_core::limiter::Waited, LimitError>> {
    let (l, r) = (l.clone(), req(job));
    tokio::spawn(async move { l.decisions().wait_for_permit(&r, max_wait_us).await })
}

both_stores!(
    a_waiter_gets_its_permit_when_the_window_turns,
    a_waiter_that_gives_up_consumes_nothing,
    waiters_of_one_request_are_served_in_arrival_order,
    a_wait_longer_than_allowed_is_answered_at_once,
);

async fn a_waiter_gets_its_permit_when_the_window_turns(store: impl Store) {
    let (l, clock) = limiter(CONFIG, store);
    let free = l.decisions().wait_for_permit(&req("a"), 0).await.unwrap();
    assert_eq!(
        (free.decision.overall, free.waited_us),
        (Code::Ok, 0),
        "room now: no wait"
    );
    let waiter = spawn_wait(&l, "a", 120 * SECOND);
    until_sleeping(&clock, 1).await;
    assert!(!waiter.is_finished());
    clock.advance(50 * SECOND);
    let waited = waiter.await.unwrap().unwrap();
    assert_eq!(waited.decision.overall, Code::Ok);
    assert_eq!(waited.waited_us, 50 * SECOND, "exactly until the next window");
    assert_eq!(waited.decision.statuses[0].remaining, 0, "and its hit was counted");
}

async fn a_waiter_that_gives_up_consumes_nothing(store: impl Store) {
    let (l, clock) = limiter(CONFIG, store);
    assert_eq!(
        l.decisions().should_rate_limit(&req("b")).await.unwrap().overall,
        Code::Ok
    );
    let waiter = spawn_wait(&l, "b", 120 * SECOND);
    until_sleeping(&clock, 1).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    clock.advance(50 * SECOND);
    let d = l.decisions().should_rate_limit(&req("b")).await.unwrap();
    assert_eq!(
        (d.overall, d.statuses[0].remaining),
        (Code::Ok, 0),
        "the new window's one hit was still there"
    );
}

async fn waiters_of_one_request_are_served_in_arrival_order(store: impl Store) {
    let (l, clock) = limiter(CONFIG, store);
    l.decisions().should_rate_limit(&req("c")).await.unwrap();
    let first = spawn_wait(&l, "c", 300 * SECOND);
    until_sleeping(&clock, 1).await;
    let second = spawn_wait(&l, "c", 300 * SECOND);
    until_sleeping(&clock, 2).await;
    clock.advance(50 * SECOND);
    let a = first.await.unwrap().unwrap();
    assert_eq!((a.decision.overall, a.waited_us), (Code::Ok, 50 * SECOND));
    // The second waits its turn, then for the window after.
    until_sleeping(&clock, 1).await;
    assert!(!second.is_finished());
    clock.advance(60 * SECOND);
    let b = second.await.unwrap().unwrap();
    assert_eq!((b.decision.overall, b.waited_us), (Code::Ok, 110 * SECOND));
}

async fn a_wait_longer_than_allowed_is_answered_at_once(store: impl Store) {
    let (l, clock) = limiter(CONFIG, store);
    l.decisions().should_rate_limit(&req("d")).await.unwrap();
    let w = l.decisions().wait_for_permit(&req("d"), 10 * SECOND).await.unwrap();
    assert_eq!((w.decision.overall, w.waited_us), (Code::OverLimit, 0));
    assert_eq!(
        w.decision.statuses[0].reset_after_us,
        Some(50 * SECOND),
        "the wait it would need"
    );
    // A cost no limit can fit never passes: answered at once, whatever the wait allowed.
    let mut big = req("e");
    big.hits_addend = 2;
    let w = l.decisions().wait_for_permit(&big, 3_600 * SECOND).await.unwrap();
    assert_eq!((w.decision.overall, w.waited_us), (Code::OverLimit, 0));
    // Nothing was consumed by either.
    clock.advance(50 * SECOND);
    assert_eq!(
        l.decisions().should_rate_limit(&req("e")).await.unwrap().statuses[0].remaining,
        0
    );
    assert_eq!(
        l.decisions().should_rate_limit(&req("d")).await.unwrap().overall,
        Code::Ok
    );
}

#[tokio::test]
async fn past_the_bound_a_waiter_is_refused() {
    let settings = LimiterSettings {
        max_waiters: 1,
        ..LimiterSettings::default()
    };
    let (l, clock) = limiter_with(CONFIG, crate::harness::memory(), settings);
    l.decisions().should_rate_limit(&req("f")).await.unwrap();
    let waiter = spawn_wait(&l, "f", 120 * SECOND);
    until_sleeping(&clock, 1).await;
    let refused = l
        .decisions()
        .wait_for_permit(&req("g"), 120 * SECOND)
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, LimitError::Busy(m) if m.contains("1 calls wait")),
        "{refused}"
    );
    clock.advance(50 * SECOND);
    assert_eq!(waiter.await.unwrap().unwrap().decision.overall, Code::Ok);
    // The slot is free again.
    assert_eq!(
        l.decisions()
            .wait_for_permit(&req("g"), 0)
            .await
            .unwrap()
            .decision
            .overall,
        Code::Ok
    );
}
