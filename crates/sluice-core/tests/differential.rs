//! Differential property test: random sequences of (time step, cost, hit, forced hit or peek) driven through the Lua
//! scripts on a real Redis and through the in-memory store must give identical decisions, remaining counts, reset and
//! retry times, for every algorithm and for random combinations of tiers. Limits reach `u32::MAX` and costs the whole
//! `u64` range, every edge of the tiers included. Forced hits (usage reports, counted whatever the limits say) come
//! with the same costs, so counts pass their limits and buckets run into debt that later hits must both see alike;
//! on a mix with a tier of another algorithm, both must decide them as ordinary hits. Every case without a queue tier
//! runs twice, with and without queue fields, so that a lone fixed window goes both through
//! `fixed_window.lua`'s `hit` and through the driver. Each time step is at least the real time since the last one
//! plus room for the next call ([`REAL_TIME_SLACK_US`], more on a busy host), because Redis expires keys by the real
//! clock while the test steps its own.
//!
//! Reservations too: any hit (a peek, a forced one) may carry a reservation, under one of a few ids with TTLs from 0 to
//! `u64::MAX`, and settlements (one or two in a call, the same id twice included) with costs over the whole range come
//! between the hits, so that reservations are settled above, below and at their estimate, twice, after they expired,
//! after their window rolled, and never; both stores must answer each alike, and the hits after them too. A second
//! run over the counting algorithms only, with reservations on most hits and as many settlements as hits, finds and
//! settles many of them (the first mostly checks that other tiers ignore them).
//!
//! Per-tier costs too: a hit (in every mode: an ordinary one, a peek, a forced one, a reserving one) and a
//! settlement's actual costs may give some tiers a cost of their own (0, a tier's edges, above its capacity,
//! `u64::MAX`), the same on both stores, so that tiers decide, count, reserve and settle each its own cost.
//!
//! And once more on a Redis Cluster, where the script runs in its node form (keys among the arguments, a slot's
//! probe before each descriptor), which must answer as the declared form does.

use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sluice_core::rules::{Algorithm, MAX_BUCKETS, MAX_LOG_LIMIT};
use sluice_core::store::memory::MemoryStore;
use sluice_core::store::{CounterKey, Hit, ReservationSpec, Settlement, TierSpec};

use crate::harness::{RedisCluster, RedisServer, T0, redis_store};
use sluice_core::store::Mode;
use sluice_core::store::{Counters, Reservations};

const SECOND: u64 = 1_000_000;
/// What a step adds beyond the real time since the last one, at least: room for the real time the next call takes.
/// On a busy host calls take longer, and the room grows to twice the longest step's real time seen in the case.
const REAL_TIME_SLACK_US: u64 = 2_000;

#[derive(Debug, Clone)]
struct TierShape {
    algorithm: Algorithm,
    limit: u64,
    window_us: u64,
    burst: u64,
}

impl TierShape {
    fn is_bucket(&self) -> bool {
        matches!(self.algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket)
    }

    fn capacity(&self) -> u64 {
        if self.is_bucket() { self.burst } else { self.limit }
    }

    /// What the configuration accepts: a sliding log of at most `MAX_LOG_LIMIT`, a bucket that fills within 100
    /// years.
    fn is_valid(&self) -> bool {
        match self.algorithm {
            Algorithm::SlidingLog => self.limit <= u64::from(MAX_LOG_LIMIT),
            // Whole seconds per sub-window, at most MAX_BUCKETS of them.
            Algorithm::BucketedWindow => {
                let width = self.window_us / self.burst.max(1);
                width % SECOND == 0 && self.burst * width == self.window_us && self.burst <= u64::from(MAX_BUCKETS)
            }
            _ if self.is_bucket() => {
                let fill = self.burst.checked_mul(self.window_us.div_ceil(self.limit));
                fill.is_some_and(|us| us <= 100 * 365 * 86_400 * SECOND)
            }
            _ => true,
        }
    }
}

/// The cost of one hit: small ones most of the time, then every edge of the tier it is aimed at, and the extremes
/// of both hits_addend fields (Envoy's uint32 and the per-descriptor UInt64Value).
#[derive(Debug, Clone, Copy)]
enum Cost {
    Small(u64),
    LimitMinusOne(usize),
    Limit(usize),
    LimitPlusOne(usize),
    CapacityPlusOne(usize),
    U32Max,
    U64Max,
    Any(u64),
}

impl Cost {
    fn resolve(self, shapes: &[TierShape]) -> u64 {
        self.resolve_at(shapes, 0)
    }

    /// The cost, the edges counted from the tier `at` (index 0 is that tier: a tier's own cost at its own edges).
    fn resolve_at(self, shapes: &[TierShape], at: usize) -> u64 {
        let tier = |i: usize| &shapes[(at + i) % shapes.len()];
        match self {
            Cost::Small(n) | Cost::Any(n) => n,
            Cost::LimitMinusOne(i) => tier(i).limit.saturating_sub(1),
            Cost::Limit(i) => tier(i).limit,
            Cost::LimitPlusOne(i) => tier(i).limit + 1,
            Cost::CapacityPlusOne(i) => tier(i).capacity() + 1,
            Cost::U32Max => u64::from(u32::MAX),
            Cost::U64Max => u64::MAX,
        }
    }
}

#[derive(Debug, Clone)]
enum Kind {
    Hit,
    Peek,
    /// Settles these reservation ids, in one call, each with its actual cost and its tiers' own.
    Settle(Vec<(u8, Cost, TierCosts)>),
}

/// The tiers' own costs, by position (`None`, or past the end: the hit's cost).
type TierCosts = Vec<Option<Cost>>;

/// `tiers`, each with its own cost from `costs`, resolved at its own edges. A bucketed window keeps the hit's: the
/// tiers here share their counts by sub-window, as only tiers without a cost of their own do (the limiter names a
/// tier with its own cost apart, see `Identity::tier_costing`).
fn with_costs(tiers: &[TierSpec], costs: &TierCosts, shapes: &[TierShape]) -> Vec<TierSpec> {
    tiers
        .iter()
        .enumerate()
        .map(|(i, t)| TierSpec {
            cost: costs
                .get(i)
                .copied()
                .flatten()
                .filter(|_| t.algorithm != Algorithm::BucketedWindow)
                .map(|c| c.resolve_at(shapes, i)),
            ..t.clone()
        })
        .collect()
}

#[derive(Debug, Clone)]
struct Op {
    step_us: u64,
    cost: Cost,
    kind: Kind,
    /// Sent as a report (`Mode::Report`, or `Mode::ReserveReport` with a reservation), which a peek ignores.
    force: bool,
    /// A reservation (id, TTL) the hit holds if it is counted (a peek writes none).
    reserve: Option<(u8, u64)>,
    /// The tiers' own costs.
    tier_costs: TierCosts,
}

/// Limits from 0 up to `u32::MAX` (what `requests_per_unit` holds), small ones most often so that windows fill.
fn limit() -> impl Strategy<Value = u64> {
    let max = u64::from(u32::MAX);
    prop_oneof![
        6 => 0u64..8,
        1 => prop::sample::select(vec![u64::from(MAX_LOG_LIMIT), max - 1, max]),
        1 => 8u64..=max,
    ]
}

fn tier_shape(algorithms: &[Algorithm]) -> impl Strategy<Value = TierShape> {
    (
        prop::sample::select(algorithms.to_vec()),
        limit(),
        prop::sample::select(vec![
            SECOND,
            2 * SECOND,
            3 * SECOND,
            60 * SECOND,
            3_600 * SECOND,
            31_536_000 * SECOND,
        ]),
        prop_oneof![4 => 1u64..6, 1 => limit()],
        prop::sample::select(vec![SECOND, 2 * SECOND, 3 * SECOND, 60 * SECOND, 86_400 * SECOND]),
    )
        .prop_map(|(algorithm, limit, window_us, burst, width)| {
            let bucket = matches!(algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket);
            TierShape {
                algorithm,
                // Buckets refill at `limit` per window, so they need at least 1, and hold at least 1.
                limit: if bucket { limit.max(1) } else { limit },
                window_us,
                // A bucketed window's number of sub-windows of `width`.
                burst: match algorithm {
                    _ if bucket => burst.max(1),
                    Algorithm::BucketedWindow => (window_us / width).max(1),
                    _ => limit,
                },
            }
        })
        .prop_filter("the configuration refuses it", TierShape::is_valid)
}

/// One to three tiers of `algorithms`, or (a fifth of the cases each) a lone fixed window or two or three fixed
/// windows, the calls the script's compact forms take.
fn tier_shapes(algorithms: &[Algorithm]) -> impl Strategy<Value = Vec<TierShape>> {
    let fixed = || {
        tier_shape(algorithms).prop_map(|s| TierShape {
            algorithm: Algorithm::FixedWindow,
            burst: s.limit,
            ..s
        })
    };
    prop_oneof![
        3 => prop::collection::vec(tier_shape(algorithms), 1..=3),
        1 => prop::collection::vec(fixed(), 1),
        1 => prop::collection::vec(fixed(), 2..=3),
    ]
}

/// The algorithms a reservation holds.
const COUNTING: [Algorithm; 4] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
];

fn cost() -> impl Strategy<Value = Cost> {
    prop_oneof![
        18 => Just(Cost::Small(1)),
        6 => (0u64..10).prop_map(Cost::Small),
        1 => (0usize..3).prop_map(Cost::LimitMinusOne),
        1 => (0usize..3).prop_map(Cost::Limit),
        1 => (0usize..3).prop_map(Cost::LimitPlusOne),
        1 => (0usize..3).prop_map(Cost::CapacityPlusOne),
        1 => Just(Cost::U32Max),
        1 => Just(Cost::U64Max),
        1 => any::<u64>().prop_map(Cost::Any),
    ]
}

/// One tier's own cost: 0 often, its capacity + 1 and `u64::MAX` (bounded at its capacity + 1), or any a hit may have.
fn tier_cost() -> impl Strategy<Value = Cost> {
    prop_oneof![
        3 => Just(Cost::Small(0)),
        4 => cost(),
        1 => Just(Cost::CapacityPlusOne(0)),
        1 => Just(Cost::LimitPlusOne(0)),
        1 => Just(Cost::U64Max),
    ]
}

/// Most hits take the hit's cost in every tier; the others give some tiers a cost of their own.
fn tier_costs() -> impl Strategy<Value = TierCosts> {
    prop_oneof![
        3 => Just(Vec::new()),
        2 => prop::collection::vec(prop::option::weighted(0.6, tier_cost()), 3),
    ]
}

/// A few reservation ids, so that ids are settled twice and reserved again.
fn reservation_id() -> impl Strategy<Value = u8> {
    0u8..3
}

/// A settlement's actual cost: below a small estimate as often as not, then any cost a hit may have.
fn actual_cost() -> impl Strategy<Value = Cost> {
    prop_oneof![
        2 => Just(Cost::Small(0)),
        3 => (0u64..10).prop_map(Cost::Small),
        3 => cost(),
    ]
}

/// Hits, peeks and settlements in these proportions.
fn kind(hits: u32, peeks: u32, settles: u32) -> impl Strategy<Value = Kind> {
    prop_oneof![
        hits => Just(Kind::Hit),
        peeks => Just(Kind::Peek),
        settles => prop::collection::vec((reservation_id(), actual_cost(), tier_costs()), 1..=2).prop_map(Kind::Settle),
    ]
}

/// One operation: a settlement one time in `settle_in` (hits and peeks 5 to 2 otherwise), a forced hit with the
/// probability `force`, a reservation with the probability `reserve`.
fn op(settle_in: u32, force: f64, reserve: f64) -> impl Strategy<Value = Op> {
    let (hits, peeks) = (5 * (settle_in - 1), 2 * (settle_in - 1));
    (
        prop_oneof![
            3 => 0u64..5_000,
            2 => 0u64..SECOND,
            1 => 0u64..3 * SECOND,
        ],
        cost(),
        kind(hits, peeks, 7),
        prop::bool::weighted(force),
        prop::option::weighted(
            reserve,
            (
                reservation_id(),
                prop_oneof![
                    1 => prop::sample::select(vec![0, 1_000, 400_000, 2 * SECOND, u64::MAX]),
                    2 => Just(3_600 * SECOND),
                ],
            ),
        ),
        tier_costs(),
    )
        .prop_map(|(step_us, cost, kind, force, reserve, tier_costs)| Op {
            step_us,
            cost,
            kind,
            force,
            reserve,
            tier_costs,
        })
}

/// Where the Redis side of a run lives.
#[derive(Clone, Copy)]
enum On {
    Server,
    /// One server, whose user is refused functions: the decision script runs by EVALSHA.
    Eval,
    Cluster,
}

#[test]
fn lua_scripts_and_memory_store_agree() {
    agree(
        On::Server,
        "diff:",
        (
            tier_shapes(&Algorithm::ALL),
            prop::collection::vec(op(4, 0.25, 0.4), 1..40),
        ),
        256,
    );
}

/// The same over the counting algorithms only, with reservations on most hits and settlements as often as hits, so
/// that many reservations are found and settled (every algorithm's charge and refund, windows rolled or not).
#[test]
fn reservations_agree() {
    agree(
        On::Server,
        "diff-res:",
        (tier_shapes(&COUNTING), prop::collection::vec(op(2, 0.1, 0.8), 1..40)),
        256,
    );
}

/// Bucketed windows of one descriptor sharing their one-second counts (a second, a few seconds, a minute), with a
/// fixed window beside them now and then: each hit is one increment of the shared count, whatever the tiers.
#[test]
fn shared_bucketed_windows_agree() {
    let bucketed = (
        prop::sample::select(vec![1u64, 2, 3, 5, 10, 15, 60]),
        prop_oneof![4 => 0u64..12, 1 => 12u64..200],
    )
        .prop_map(|(seconds, limit)| TierShape {
            algorithm: Algorithm::BucketedWindow,
            limit,
            window_us: seconds * SECOND,
            burst: seconds,
        });
    agree(
        On::Server,
        "diff-buckets:",
        (
            prop::collection::vec(bucketed, 1..=3),
            prop::collection::vec(op(3, 0.2, 0.3), 1..40),
        ),
        128,
    );
}

/// Every algorithm and reservations, fewer cases, with the script run by EVALSHA (a server that refuses functions),
/// where it makes its definitions afresh at every call rather than once: both forms must answer alike.
#[test]
fn lua_scripts_by_evalsha_and_memory_store_agree() {
    agree(
        On::Eval,
        "diff-eval:",
        (
            tier_shapes(&Algorithm::ALL),
            prop::collection::vec(op(3, 0.25, 0.5), 1..40),
        ),
        64,
    );
}

/// Every algorithm and reservations, fewer cases, through a cluster's node batches.
#[test]
fn cluster_node_batches_and_memory_store_agree() {
    agree(
        On::Cluster,
        "diff-cluster:",
        (
            tier_shapes(&Algorithm::ALL),
            prop::collection::vec(op(3, 0.25, 0.5), 1..40),
        ),
        64,
    );
}

/// A URL of `redis` for the documented ACL user (keys under `prefix`) without `+fcall` and `+function|load`.
fn without_functions(redis: &RedisServer, prefix: &str) -> String {
    crate::harness::user_without_functions(redis, "sluice", prefix)
}

/// Runs `cases` cases of `strategy` through both stores (keys under `prefix`), asking identical answers.
fn agree(on: On, prefix: &str, strategy: impl Strategy<Value = (Vec<TierShape>, Vec<Op>)>, cases: u32) {
    let (url, _server): (String, Box<dyn std::any::Any>) = match on {
        On::Server => {
            let redis = RedisServer::start();
            (redis.url(), Box::new(redis))
        }
        On::Eval => {
            let redis = RedisServer::start();
            (without_functions(&redis, prefix), Box::new(redis))
        }
        On::Cluster => {
            let cluster = RedisCluster::start();
            (cluster.url(), Box::new(cluster))
        }
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let redis = runtime.block_on(redis_store(&url));
    let case = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |(mut shapes, ops)| {
        // Tiers of one rule differ in algorithm or window, as the configuration requires.
        let mut seen = std::collections::HashSet::new();
        shapes.retain(|s| seen.insert((s.algorithm, s.window_us)));
        let case = case.fetch_add(1, Ordering::SeqCst).to_string();
        runtime.block_on(async {
            // Queue fields as the limiter sends them (only to queue tiers), then always.
            let queue = shapes.iter().any(|s| s.algorithm == Algorithm::Queue);
            let entry = vec![("case".to_string(), "x".to_string())];
            let variants = if queue { vec![entry] } else { vec![vec![], entry] };
            for fields in variants {
                let id = CounterKey::builder(prefix, "d")
                    .entry("case", &case)
                    .entry("fields", &fields.len().to_string())
                    .finish();
                let mut tiers: Vec<TierSpec> = shapes
                    .iter()
                    .map(|s| TierSpec {
                        // A bucketed window's counts are named by its sub-window, which tiers of one descriptor share.
                        key: id.tier(
                            s.algorithm,
                            s.window_us
                                / if s.algorithm == Algorithm::BucketedWindow {
                                    s.burst
                                } else {
                                    1
                                },
                        ),
                        algorithm: s.algorithm,
                        limit: s.limit,
                        window_us: s.window_us,
                        burst: s.burst,
                        cost: None,
                        global: false,
                    })
                    .collect();
                // A descriptor's one fixed window is a plain counter, as the limiter names it.
                if let [t] = &mut tiers[..]
                    && t.algorithm == Algorithm::FixedWindow
                {
                    t.key = t.key.clone().plain();
                }
                let memory = MemoryStore::new();
                let mut now = T0 + 123_457;
                let (mut last, mut slack) = (std::time::Instant::now(), REAL_TIME_SLACK_US);
                for (i, op) in ops.iter().enumerate() {
                    // Redis expires keys by the real clock. The test's clock never runs slower than the real one
                    // (with room for the calls still to come, measured from the steps before), so a key Redis has
                    // expired is one the memory store also treats as expired, however slow a loaded machine makes
                    // the calls.
                    let real = u64::try_from(last.elapsed().as_micros()).unwrap_or(u64::MAX);
                    last = std::time::Instant::now();
                    slack = slack.max(real.saturating_mul(2));
                    now += op.step_us.max(real.saturating_add(slack));
                    let hit = Hit {
                        tiers: with_costs(&tiers, &op.tier_costs, &shapes),
                        cost: op.cost.resolve(&shapes),
                        lease: format!("lease-{i}"),
                        fields: fields.clone(),
                        record: None,
                        mode: Mode::of(
                            op.force,
                            op.reserve.map(|(r, ttl_us)| ReservationSpec {
                                key: id.reservation(&r.to_string()),
                                ttl_us,
                            }),
                        ),
                    };
                    let hits = std::slice::from_ref(&hit);
                    if let Kind::Settle(settle) = &op.kind {
                        let settlements: Vec<Settlement> = settle
                            .iter()
                            .map(|(r, actual, costs)| Settlement {
                                tiers: with_costs(&tiers, costs, &shapes),
                                cost: actual.resolve(&shapes),
                                reservation: id.reservation(&r.to_string()),
                                reap: false,
                            })
                            .collect();
                        let m = memory.settle(now, &settlements).await;
                        let r = redis.settle(now, &settlements).await;
                        let (m, r) = (
                            m.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
                            r.into_iter().map(|a| a.expect("redis settles")).collect::<Vec<_>>(),
                        );
                        prop_assert_eq!(
                            &m,
                            &r,
                            "op {} of {:?} ({} fields) at +{}us: {:?}",
                            i,
                            shapes,
                            fields.len(),
                            now - T0,
                            op
                        );
                        continue;
                    }
                    let (m, r) = if matches!(op.kind, Kind::Peek) {
                        let peek = [Hit {
                            mode: Mode::Peek,
                            ..hit.clone()
                        }];
                        (memory.hit(now, &peek).await, redis.hit(now, &peek).await)
                    } else {
                        (memory.hit(now, hits).await, redis.hit(now, hits).await)
                    };
                    let (m, r) = (
                        crate::harness::decided(m).remove(0),
                        crate::harness::decided(r).remove(0),
                    );
                    prop_assert_eq!(
                        &m,
                        &r,
                        "op {} of {:?} ({} fields) at +{}us: {:?}",
                        i,
                        shapes,
                        fields.len(),
                        now - T0,
                        op
                    );
                }
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    if let (On::Eval, Some(redis)) = (on, _server.downcast_ref::<RedisServer>()) {
        let stats = redis.cli(&["INFO", "commandstats"]);
        assert!(
            stats.contains("cmdstat_evalsha:") && !stats.contains("cmdstat_fcall:calls=")
                || stats.contains("cmdstat_fcall:calls=0,"),
            "decided by EVALSHA: {stats}"
        );
    }
}
