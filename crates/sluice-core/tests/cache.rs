//! The local over-limit cache, on by default, never outlives what gives capacity back: a settlement's refund or a
//! reset clears the denials it makes stale at once on the instance that did it, and on every other instance sharing
//! the Redis once it hears the notice; an instance that cannot hear notices does not trust its cache. Reservations
//! are always paid for: a reservation that would hold nothing is refused, and an unknown domain or key gets no id.
//! A differential test runs random schedules of hits, reservations, settlements, resets and clock steps with the
//! cache on and off, on one and on two instances, and requires the same decisions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::clock::ManualClock;
use sluice_core::limiter::{Code, Costs, Descriptor, LimitError, Limiter, LimiterSettings, QueuedWork, Request};
use sluice_core::store::Store;

use crate::harness::{RedisServer, limiter_with, redis_cli, redis_store};
use sluice_core::store::Announcements;

const RULES: &str = "domain: llm
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: conc
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: concurrency}
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: sw
    rate_limit: {unit: minute, requests_per_unit: 20, algorithm: sliding_window}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
";

type Instance<S> = (Arc<Limiter<S>>, Arc<ManualClock>);

fn instance<S: Store>(store: S, cache: usize) -> Instance<S> {
    let settings = LimiterSettings {
        key_prefix: "test:".into(),
        local_cache_size: cache,
        ..LimiterSettings::default()
    };
    limiter_with(RULES, store, settings)
}

/// An instance with the default cache, once its store hears notices (a Redis subscription is up).
async fn cached<S: Store>(store: S) -> Instance<S> {
    let (l, clock) = instance(store, LimiterSettings::default().local_cache_size);
    let started = Instant::now();
    while !l.store().hearing() {
        assert!(started.elapsed() < Duration::from_secs(10), "notices never heard");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (l, clock)
}

fn request(domain: &str, key: &str, value: &str) -> Request {
    Request {
        domain: domain.into(),
        descriptors: vec![Descriptor {
            entries: vec![(key.to_string(), value.to_string())],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    }
}

fn cost(cost: u64) -> Costs {
    Costs {
        cost,
        named: Vec::new(),
    }
}

const HOUR_US: u64 = 3_600_000_000;

async fn reserve<S: Store>(l: &Limiter<S>, r: &Request, estimate: u64) -> (Code, Option<String>) {
    let reserved = l.budgets().reserve(r, &cost(estimate), HOUR_US).await.unwrap();
    (reserved.decision.overall, reserved.id)
}

/// Settles `id` at `actual`; the amount given back.
async fn settle<S: Store>(l: &Limiter<S>, r: &Request, id: &str, actual: u64) -> Option<u64> {
    let settled = l.budgets().settle(r, id, &cost(actual)).await.unwrap()?;
    Some(settled.iter().map(|d| d.refunded).sum())
}

/// Waits until `l` has applied a notice more than `before` (the one a change elsewhere sent); how long it took.
async fn heard<S: Store>(l: &Limiter<S>, before: u64) -> Duration {
    let started = Instant::now();
    while l.notices_heard() <= before {
        assert!(started.elapsed() < Duration::from_secs(5), "the notice never arrived");
        tokio::task::yield_now().await;
    }
    started.elapsed()
}

/// Reserve(1 000) of 1 000 a day, Reserve(1) refused (and remembered), Settle(0) refunds 1 000: Reserve(1) and
/// ShouldRateLimit pass again at once.
async fn a_refund_clears_the_denial_it_makes_stale(store: impl Store) {
    let (l, _) = cached(store).await;
    let alice = request("llm", "user", "alice");
    let (code, id) = reserve(&l, &alice, 1_000).await;
    assert_eq!(code, Code::Ok);
    assert_eq!(reserve(&l, &alice, 1).await, (Code::OverLimit, None));
    assert_eq!(reserve(&l, &alice, 1).await.0, Code::OverLimit);
    assert!(l.cached_denials() > 0, "the refused reservation is remembered");
    assert_eq!(settle(&l, &alice, &id.unwrap(), 0).await, Some(1_000));
    assert_eq!(
        reserve(&l, &alice, 1).await.0,
        Code::Ok,
        "the refund is in force at once"
    );
    assert_eq!(l.decisions().should_rate_limit(&alice).await.unwrap().overall, Code::Ok);
}

/// 50 Reserve(100) against 1 000: 10 granted, each settled at 40 (600 back); a second wave of 50 gets 6.
async fn a_second_wave_gets_what_the_first_gave_back(store: impl Store) {
    let (l, _) = cached(store).await;
    let bob = request("llm", "user", "bob");
    let mut ids = Vec::new();
    for _ in 0..50 {
        if let (Code::Ok, Some(id)) = reserve(&l, &bob, 100).await {
            ids.push(id);
        }
    }
    assert_eq!(ids.len(), 10);
    for id in &ids {
        assert_eq!(settle(&l, &bob, id, 40).await, Some(60));
    }
    let mut granted = 0;
    for _ in 0..50 {
        granted += usize::from(reserve(&l, &bob, 100).await.0 == Code::Ok);
    }
    assert_eq!(granted, 6);
}

/// A reservation is paid for: one that would hold nothing is refused naming the field, a limit that cannot hold a
/// reservation is refused naming the descriptor, and an unknown domain or key gets no id.
async fn a_reservation_is_always_paid_for(store: impl Store) {
    let (l, _) = cached(store).await;
    let carol = request("llm", "user", "carol");
    let zero = l.budgets().reserve(&carol, &cost(0), HOUR_US).await;
    assert!(
        matches!(&zero, Err(LimitError::InvalidArgument(m)) if m.starts_with("estimate: descriptors[0]")),
        "{zero:?}"
    );
    let mut zero_addend = carol.clone();
    zero_addend.descriptors[0].hits_addend = Some(0);
    assert!(matches!(
        l.budgets().reserve(&zero_addend, &cost(5), HOUR_US).await,
        Err(LimitError::InvalidArgument(_))
    ));
    let lease = l
        .budgets()
        .reserve(&request("llm", "conc", "x"), &cost(1), HOUR_US)
        .await;
    assert!(
        matches!(&lease, Err(LimitError::InvalidArgument(m)) if m.contains("concurrency")),
        "{lease:?}"
    );
    for unknown in [request("nowhere", "user", "carol"), request("llm", "nokey", "carol")] {
        let reserved = l.budgets().reserve(&unknown, &cost(5), HOUR_US).await.unwrap();
        assert_eq!((reserved.decision.overall, reserved.id), (Code::Ok, None));
    }
    // Nothing was held by any of them.
    let (code, id) = reserve(&l, &carol, 1_000).await;
    assert_eq!(code, Code::Ok);
    assert_eq!(settle(&l, &carol, &id.unwrap(), 1_000).await, Some(0));
}

/// `refunded` is what came back to a window still in force: nothing once a fixed window has rolled over.
async fn refunded_is_what_came_back(store: impl Store) {
    let (l, clock) = cached(store).await;
    let dave = request("llm", "minute", "dave");
    let (_, id) = reserve(&l, &dave, 8).await;
    clock.advance(60_000_000);
    assert_eq!(settle(&l, &dave, &id.unwrap(), 0).await, Some(0));
    let (_, id) = reserve(&l, &dave, 8).await;
    assert_eq!(settle(&l, &dave, &id.unwrap(), 3).await, Some(5));
}

/// A reset clears the denials of its counters.
async fn a_reset_clears_denials(store: impl Store) {
    let (l, _) = cached(store).await;
    let erin = request("llm", "user", "erin");
    assert_eq!(reserve(&l, &erin, 1_000).await.0, Code::Ok);
    assert_eq!(reserve(&l, &erin, 1).await.0, Code::OverLimit);
    l.decisions().reset(&erin, QueuedWork::Keep).await.unwrap();
    assert_eq!(reserve(&l, &erin, 1).await.0, Code::Ok);
}

both_stores!(
    a_refund_clears_the_denial_it_makes_stale,
    a_second_wave_gets_what_the_first_gave_back,
    a_reservation_is_always_paid_for,
    refunded_is_what_came_back,
    a_reset_clears_denials,
);

/// Two instances on one Redis, the default cache on both: a refund or a reset on one clears the other's denial once
/// it hears the notice. Prints the time from the settlement's answer to the other instance applying its notice.
#[tokio::test]
async fn a_refund_on_one_instance_clears_the_other() {
    let redis = RedisServer::start();
    let (a, _) = cached(redis_store(&redis.url()).await).await;
    let (b, _) = cached(redis_store(&redis.url()).await).await;
    let mut lags = Vec::new();
    for round in 0..50 {
        let user = request("llm", "user", &format!("u{round}"));
        let (code, id) = reserve(&b, &user, 1_000).await;
        assert_eq!(code, Code::Ok);
        assert_eq!(reserve(&b, &user, 1).await.0, Code::OverLimit);
        assert_eq!(reserve(&b, &user, 1).await.0, Code::OverLimit, "remembered on b");
        let before = b.notices_heard();
        assert_eq!(settle(&a, &user, &id.unwrap(), 0).await, Some(1_000));
        lags.push(heard(&b, before).await);
        assert_eq!(reserve(&b, &user, 1).await.0, Code::Ok, "round {round}");
    }
    lags.sort();
    eprintln!(
        "notice lag over {} refunds: median {:?}, max {:?}",
        lags.len(),
        lags[lags.len() / 2],
        lags[lags.len() - 1]
    );
    // A reset on one instance clears the other.
    let frank = request("llm", "user", "frank");
    assert_eq!(reserve(&b, &frank, 1_000).await.0, Code::Ok);
    assert_eq!(reserve(&b, &frank, 1).await.0, Code::OverLimit);
    let before = b.notices_heard();
    a.decisions().reset(&frank, QueuedWork::Keep).await.unwrap();
    heard(&b, before).await;
    assert_eq!(reserve(&b, &frank, 1).await.0, Code::Ok);
}

/// An instance whose subscription is cut stops trusting its cache until it is subscribed again, and then forgets
/// what it remembered: a refund made meanwhile on another instance is never shadowed for long.
#[tokio::test]
async fn a_lost_subscription_is_never_trusted() {
    let redis = RedisServer::start();
    let (a, _) = cached(redis_store(&redis.url()).await).await;
    let (b, _) = cached(redis_store(&redis.url()).await).await;
    let grace = request("llm", "user", "grace");
    let (_, id) = reserve(&b, &grace, 1_000).await;
    assert_eq!(reserve(&b, &grace, 1).await.0, Code::OverLimit);
    assert!(b.cached_denials() > 0);
    // Cut every subscriber, then refund on a while b may not hear it.
    redis_cli(redis.port, &["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(settle(&a, &grace, &id.unwrap(), 0).await, Some(1_000));
    let started = Instant::now();
    while reserve(&b, &grace, 1).await.0 != Code::Ok {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "a stale denial outlived the resubscription"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = Instant::now();
    while !b.store().hearing() {
        assert!(started.elapsed() < Duration::from_secs(5), "never subscribed again");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(b.cached_denials(), 0, "a missed notice clears everything");
}

/// A small deterministic generator (xorshift), so each schedule can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// ShouldRateLimit on a rule whose denials count nothing (`sw`, `tb`): the cache may answer its denials.
    Hit {
        rule: &'static str,
        user: u64,
        cost: u64,
    },
    Reserve {
        rule: &'static str,
        user: u64,
        estimate: u64,
    },
    /// Settles the `pick`-th reservation still open, at `actual`.
    Settle {
        pick: u64,
        actual: u64,
    },
    Reset {
        rule: &'static str,
        user: u64,
    },
    Advance {
        us: u64,
    },
}

/// A random schedule. A lone fixed window's ShouldRateLimit is left out: it counts denials as the reference does,
/// so a denial answered from the cache (and not counted) changes what a later refund leaves, by design.
fn schedule(seed: u64, len: usize) -> Vec<Op> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let rules = ["fw", "sw", "tb"];
    (0..len)
        .map(|_| match rng.below(10) {
            0..=2 => Op::Hit {
                rule: ["sw", "tb"][rng.below(2) as usize],
                user: rng.below(2),
                cost: 1 + rng.below(6),
            },
            3..=5 => Op::Reserve {
                rule: rules[rng.below(3) as usize],
                user: rng.below(2),
                estimate: 1 + rng.below(8),
            },
            6 | 7 => Op::Settle {
                pick: rng.below(8),
                actual: rng.below(10),
            },
            8 => Op::Reset {
                rule: rules[rng.below(3) as usize],
                user: rng.below(2),
            },
            _ => Op::Advance {
                us: rng.below(4_000_000),
            },
        })
        .collect()
}

/// Runs `ops`, each on the instance the generator picks, and returns every decision. After a change that frees
/// capacity on one instance, the others are given its notice before the next step (what the stated bound allows).
async fn run<S: Store>(instances: &[Instance<S>], ops: &[Op], seed: u64) -> Vec<String> {
    let mut pick = Rng(seed | 1);
    let mut open: Vec<(Request, String)> = Vec::new();
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        let (l, _) = &instances[pick.below(instances.len() as u64) as usize];
        let heard: Vec<u64> = instances.iter().map(|(i, _)| i.notices_heard()).collect();
        let mut freed = false;
        let decision = match op {
            Op::Hit { rule, user, cost } => {
                let mut r = request("llm", rule, &user.to_string());
                r.descriptors[0].hits_addend = Some(*cost);
                format!("{:?}", l.decisions().should_rate_limit(&r).await.unwrap().overall)
            }
            Op::Reserve { rule, user, estimate } => {
                let r = request("llm", rule, &user.to_string());
                let (code, id) = reserve(l, &r, *estimate).await;
                if let Some(id) = id {
                    open.push((r, id));
                }
                format!("{code:?}")
            }
            Op::Settle { pick, actual } if !open.is_empty() => {
                let (r, id) = open.remove(*pick as usize % open.len());
                let refunded = settle(l, &r, &id, *actual).await;
                freed = refunded.is_some_and(|n| n > 0);
                format!("{refunded:?}")
            }
            Op::Settle { .. } => "none open".into(),
            Op::Reset { rule, user } => {
                l.decisions()
                    .reset(&request("llm", rule, &user.to_string()), QueuedWork::Keep)
                    .await
                    .unwrap();
                freed = true;
                "reset".into()
            }
            Op::Advance { us } => {
                for (_, clock) in instances {
                    clock.advance(*us);
                }
                "advanced".into()
            }
        };
        if freed && instances.len() > 1 {
            for ((other, _), before) in instances.iter().zip(heard) {
                heard_if_listening(other, before).await;
            }
        }
        out.push(decision);
    }
    out
}

/// Waits for the notice on an instance whose cache listens (one that has decided something); others hold nothing.
async fn heard_if_listening<S: Store>(l: &Limiter<S>, before: u64) {
    if l.cached_denials() > 0 || before > 0 {
        heard(l, before).await;
    }
}

async fn differential(with_cache: Vec<Instance<impl Store>>, without: Vec<Instance<impl Store>>, seed: u64) {
    let ops = schedule(seed, 300);
    let expected = run(&without, &ops, seed).await;
    let got = run(&with_cache, &ops, seed).await;
    for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(
            e,
            g,
            "seed {seed}, step {i} ({:?}); the schedule: {:?}",
            ops[i],
            &ops[..=i]
        );
    }
}

#[tokio::test]
async fn the_cache_changes_no_decision_in_memory() {
    for seed in 1..=20 {
        let on = vec![cached(crate::harness::memory()).await];
        let off = vec![instance(crate::harness::memory(), 0)];
        differential(on, off, seed).await;
    }
}

#[tokio::test]
async fn the_cache_changes_no_decision_on_one_and_two_instances_over_redis() {
    for seed in 1..=6 {
        let redis = RedisServer::start();
        let off = vec![instance(redis_store(&redis.url()).await, 0)];
        let on_redis = RedisServer::start();
        let one = vec![cached(redis_store(&on_redis.url()).await).await];
        differential(one, off, seed).await;
        let redis = RedisServer::start();
        let off = vec![instance(redis_store(&redis.url()).await, 0)];
        let shared = RedisServer::start();
        let two = vec![
            cached(redis_store(&shared.url()).await).await,
            cached(redis_store(&shared.url()).await).await,
        ];
        differential(two, off, seed).await;
    }
}
