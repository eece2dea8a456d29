//! Global limits in the store, alike in memory, in Redis and in Redis as the documented least-privilege ACL user: a
//! global window is decided against its own count plus what the other regions shipped, a shipment taken twice, late
//! or out of order counts once, and this region's own counts are what it ships; the replicator's backlog keeps its
//! bound, counts what it drops and lets passed windows go. Time is passed explicitly.

use std::time::Duration;

use sluice_core::config;
use sluice_core::limiter::{Code, Descriptor, LimiterSettings, Request};
use sluice_core::metrics::Metrics;
use sluice_core::regions::{RegionSettings, Replicator};
use sluice_core::rules::{Algorithm, RuleSet};
use sluice_core::store::{Hit, Outcome, OwnCount, RegionCount, Store, TierSpec, WindowRef};

use crate::harness::{ACL_PASSWORD, RedisServer, T0, limiter_over, memory, readme_acl_user, redis_store, tier};
use sluice_core::store::{Counters, RegionCounts};

const MINUTE: u64 = 60_000_000;

fn global(name: &str, algorithm: Algorithm, limit: u64) -> TierSpec {
    TierSpec {
        global: true,
        ..tier(name, algorithm, limit, MINUTE, limit)
    }
}

fn hit(t: &TierSpec, cost: u64) -> Hit {
    Hit {
        tiers: vec![t.clone()],
        cost,
        ..Hit::default()
    }
}

async fn apply(store: &impl Store, now: u64, t: &TierSpec, cost: u64) -> Outcome {
    crate::harness::decided(store.hit(now, &[hit(t, cost)]).await).remove(0)
}

async fn ship(store: &impl Store, now: u64, region: &str, t: &TierSpec, start: u64, count: u64) {
    let window = WindowRef {
        start_us: start,
        ..WindowRef::of(t, start)
    };
    store
        .merge_counts(now, region, &[RegionCount { window, count }])
        .await
        .expect("merged");
}

async fn fixed_windows_add_the_other_regions(store: impl Store) {
    let now = T0 - T0 % MINUTE + 10_000_000;
    let start = now - now % MINUTE;
    let t = global("fixed", Algorithm::FixedWindow, 10);
    ship(&store, now, "us", &t, start, 7).await;
    let first = apply(&store, now, &t, 3).await;
    assert!(first.admitted);
    assert_eq!(
        (first.tiers[0].used, first.tiers[0].remaining),
        (10, 0),
        "used and remaining are the sum's"
    );
    assert_eq!(
        first.tiers[0].own,
        Some(OwnCount {
            start_us: start,
            count: 3
        }),
        "this region's own count after the hit, which is shipped"
    );
    let denied = apply(&store, now, &t, 1).await;
    assert!(!denied.admitted, "7 elsewhere + 3 here: the limit");
    assert_eq!(denied.tiers[0].own, None, "a denial counted nothing");
    assert_eq!(
        denied.tiers[0].retry_after_us,
        Some(start + MINUTE - now),
        "fits again when the window ends"
    );
    let own = store.window_counts(now, &[WindowRef::of(&t, now)]).await.unwrap();
    assert_eq!(own, vec![3], "a global window counts no denial");

    // Taken twice, late or out of order: counts once.
    ship(&store, now, "us", &t, start, 7).await;
    ship(&store, now, "us", &t, start, 5).await;
    ship(&store, now, "ap", &t, start, 0).await;
    assert!(!apply(&store, now, &t, 1).await.admitted);

    // The same counter decided as an ordinary window ignores the others; another window starts empty everywhere.
    let regional = TierSpec {
        global: false,
        ..t.clone()
    };
    assert!(apply(&store, now, &regional, 7).await.admitted);
    let next = start + MINUTE + 1;
    let fresh = apply(&store, next, &t, 10).await;
    assert!(fresh.admitted, "the others' counts were of the window before");
}

async fn sliding_windows_weigh_the_other_regions_previous_window(store: impl Store) {
    let start = T0 - T0 % MINUTE;
    let now = start + MINUTE / 2;
    let t = global("sliding", Algorithm::SlidingWindow, 10);
    // 8 in the previous window elsewhere, half of it still weighs: 4.
    ship(&store, now, "eu", &t, start - MINUTE, 8).await;
    ship(&store, now, "eu", &t, start, 1).await;
    let admitted = apply(&store, now, &t, 5).await;
    assert!(admitted.admitted);
    assert_eq!(admitted.tiers[0].used, 10);
    assert_eq!(
        admitted.tiers[0].own,
        Some(OwnCount {
            start_us: start,
            count: 5
        }),
        "the current window's own count"
    );
    assert!(!apply(&store, now, &t, 1).await.admitted);
    let own = store.window_counts(now, &[WindowRef::of(&t, now)]).await.unwrap();
    assert_eq!(own, vec![5]);
}

#[tokio::test]
async fn global_windows_in_memory() {
    fixed_windows_add_the_other_regions(memory()).await;
    sliding_windows_weigh_the_other_regions_previous_window(memory()).await;
}

#[tokio::test]
async fn global_windows_in_redis() {
    let redis = RedisServer::start();
    fixed_windows_add_the_other_regions(redis_store(&redis.url()).await).await;
    sliding_windows_weigh_the_other_regions_previous_window(redis_store(&redis.url()).await).await;
    // What merge.lua wrote expires with the window it counts (the clocks here are far in the past: a minute).
    let key = tier("fixed", Algorithm::FixedWindow, 10, MINUTE, 10)
        .key
        .regions(T0 - T0 % MINUTE);
    let ttl: i64 = redis.cli(&["--raw", "PTTL", key.as_str()]).trim().parse().unwrap();
    assert!((1..=MINUTE as i64 / 1_000 + 1_000).contains(&ttl), "{ttl}");
}

#[tokio::test]
async fn global_windows_in_redis_as_the_documented_acl_user() {
    let redis = RedisServer::start();
    let mut rules = vec!["ACL".to_string(), "SETUSER".into()];
    rules.extend(readme_acl_user("test:"));
    let args: Vec<&str> = rules.iter().map(String::as_str).collect();
    assert_eq!(redis.cli(&args).trim(), "OK");
    let url = redis
        .url()
        .replace("redis://", &format!("redis://sluice:{ACL_PASSWORD}@"));
    fixed_windows_add_the_other_regions(redis_store(&url).await).await;
    sliding_windows_weigh_the_other_regions_previous_window(redis_store(&url).await).await;
}

/// Only fixed and sliding windows can be global; any other algorithm is refused, naming the file and the path.
#[test]
fn a_global_limit_of_another_algorithm_is_refused() {
    for (algorithm, what) in [
        ("token_bucket", "bucket's arrival time"),
        ("leaky_bucket", "bucket's arrival time"),
        ("sliding_log", "set of hits or leases"),
        ("concurrency", "set of hits or leases"),
        ("queue", "set of hits or leases"),
    ] {
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 5, algorithm: {algorithm}, global: true}}\n"
        );
        let file = config::parse("limits.yaml".as_ref(), &yaml).expect("parses");
        let err = RuleSet::compile(&[file], &Metrics::discarded(0.8))
            .expect_err("refused")
            .to_string();
        assert!(err.contains("limits.yaml"), "{err}");
        assert!(err.contains("descriptors[0].rate_limit.global"), "{err}");
        assert!(
            err.contains(&format!("{algorithm} cannot be counted across regions")),
            "{err}"
        );
        assert!(err.contains(what), "{err}");
    }
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, global: true}\n";
    let file = config::parse("limits.yaml".as_ref(), yaml).expect("parses");
    let err = RuleSet::compile(&[file], &Metrics::discarded(0.8))
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("descriptors[0].rate_limit.global: does not apply to an unlimited rule"),
        "{err}"
    );
    for algorithm in ["fixed_window", "sliding_window"] {
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 5, algorithm: {algorithm}, global: true}}\n"
        );
        let file = config::parse("limits.yaml".as_ref(), &yaml).expect("parses");
        RuleSet::compile(&[file], &Metrics::discarded(0.8)).expect("a global window compiles");
    }
}

/// In a Redis Cluster, windows on many slots are read and merged, each on its own primary, and decided as anywhere.
#[tokio::test]
async fn global_windows_in_a_cluster() {
    let cluster = crate::harness::RedisCluster::start();
    let store = redis_store(&cluster.url()).await;
    let now = T0 - T0 % MINUTE + 10_000_000;
    let tiers: Vec<TierSpec> = (0..200)
        .map(|i| global(&format!("key-{i}"), Algorithm::FixedWindow, 10))
        .collect();
    let counts: Vec<RegionCount> = tiers
        .iter()
        .enumerate()
        .map(|(i, t)| RegionCount {
            window: WindowRef::of(t, now),
            count: (i % 10) as u64,
        })
        .collect();
    store
        .merge_counts(now, "us", &counts)
        .await
        .expect("merged on every primary");
    for (i, t) in tiers.iter().enumerate() {
        let fits = 10 - (i % 10) as u64;
        assert!(apply(&store, now, t, fits).await.admitted, "{i}");
        assert!(!apply(&store, now, t, 1).await.admitted, "{i}");
    }
    let windows: Vec<WindowRef> = tiers.iter().map(|t| WindowRef::of(t, now)).collect();
    let own = store.window_counts(now, &windows).await.expect("read on every primary");
    assert_eq!(own, (0..200).map(|i| 10 - (i % 10) as u64).collect::<Vec<_>>());
}

/// A link's backlog holds at most `--region-backlog` windows: one that finds it full is dropped and counted, the
/// rest ship once the region answers, and a window whose time has passed leaves the backlog unshipped. Only admitted
/// hits of global limits are noted.
#[tokio::test]
async fn a_full_backlog_drops_and_counts_and_a_passed_window_leaves_it() {
    let yaml = "domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1, global: true}
  - key: regional
    rate_limit: {unit: minute, requests_per_unit: 10}
";
    let (limiter, _clock) = limiter_over(yaml, memory(), LimiterSettings::default(), Metrics::discarded(0.8));
    let settings = RegionSettings {
        name: "eu".into(),
        interval: Duration::from_millis(100),
        backlog: 2,
        timeout: Duration::from_secs(1),
    };
    let replicator = Replicator::new(settings, vec![("us".to_string(), memory())]);
    limiter.join_regions(replicator.shared());
    let request = |key: &str, value: &str| Request {
        domain: "d".into(),
        descriptors: vec![Descriptor {
            entries: vec![(key.into(), value.into())],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    };
    for (key, value) in [("k", "a"), ("k", "a"), ("regional", "x"), ("k", "b"), ("k", "c")] {
        limiter
            .decisions()
            .should_rate_limit(&request(key, value))
            .await
            .expect("decided");
    }
    let now = limiter.now_us();
    // a, b and c: the denial of the second a and the regional limit are not noted.
    assert_eq!(replicator.collect(limiter.store(), now).await.expect("read"), 3);
    let link = replicator.shared().links()[0].clone();
    assert_eq!((link.backlog(), link.dropped()), (2, 1));
    assert!(link.line().starts_with("region us: not linked"), "{}", link.line());
    assert_eq!(replicator.ship(now).await, 1);
    assert_eq!((link.backlog(), link.shipped()), (0, 2));
    assert_eq!(link.line(), "region us: linked, 0 windows waiting");

    limiter
        .decisions()
        .should_rate_limit(&request("k", "d"))
        .await
        .expect("decided");
    assert_eq!(replicator.collect(limiter.store(), now).await.expect("read"), 1);
    assert_eq!(link.backlog(), 1);
    // Past the window and its second of grace: nothing of it is shipped.
    assert_eq!(replicator.ship(now + 2 * MINUTE).await, 1);
    assert_eq!((link.backlog(), link.shipped()), (0, 2));
}

/// Several instances of one region on one Redis each ship the largest count of a window their hits were answered
/// with, reading nothing back: once all have shipped, in any order, the other region holds the region's exact count.
/// For a lone global window (the compact form answers the count a hit left) and for one beside a regional limit (the
/// driver's form does not: its count is read back), fixed and sliding, hits spread unevenly over three instances.
#[tokio::test]
async fn instances_of_a_region_ship_its_exact_count_from_what_their_hits_saw() {
    let yaml = "domain: d
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 50, global: true}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 50, algorithm: sliding_window, global: true}
  - key: beside
    rate_limits:
      - {unit: minute, requests_per_unit: 50, global: true}
      - {unit: second, requests_per_unit: 1000}
";
    let (eu, us) = (RedisServer::start(), RedisServer::start());
    let settings = RegionSettings {
        name: "eu".into(),
        interval: Duration::from_millis(100),
        backlog: 1_000,
        timeout: Duration::from_secs(1),
    };
    let mut instances = Vec::new();
    for _ in 0..3 {
        let (limiter, clock) = limiter_over(
            yaml,
            redis_store(&eu.url()).await,
            LimiterSettings::default(),
            Metrics::discarded(0.8),
        );
        let replicator = Replicator::new(settings.clone(), vec![("us".to_string(), redis_store(&us.url()).await)]);
        limiter.join_regions(replicator.shared());
        instances.push((limiter, clock, replicator));
    }
    let (us_limiter, us_clock) = limiter_over(
        yaml,
        redis_store(&us.url()).await,
        LimiterSettings::default(),
        Metrics::discarded(0.8),
    );
    // us is a region too (a limiter outside any region decides a global limit as a regional one).
    let us_region = Replicator::new(
        RegionSettings {
            name: "us".into(),
            ..settings.clone()
        },
        vec![("eu".to_string(), redis_store(&eu.url()).await)],
    );
    us_limiter.join_regions(us_region.shared());
    let request = |key: &str| Request {
        domain: "d".into(),
        descriptors: vec![Descriptor {
            entries: vec![(key.into(), "v".into())],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    };
    // The minute after T0's, 10 s in: every instance's clock alike.
    let now = T0 - T0 % MINUTE + MINUTE + 10_000_000;
    for key in ["fixed", "sliding", "beside"] {
        // 21 hits: 1, 2, 3, 1, 2, 3, ... instances taking 1, 2 and 3 hits in turn (the last hit is instance 2's).
        let mut admitted = 0;
        for i in 0..21 {
            let (limiter, clock, _) = &instances[[0, 1, 1, 2, 2, 2][i % 6]];
            clock.set(now + i as u64);
            let decision = limiter
                .decisions()
                .should_rate_limit(&request(key))
                .await
                .expect("decided");
            admitted += usize::from(decision.overall == Code::Ok);
        }
        assert_eq!(admitted, 21, "{key}");
        // The instance that took the last hit ships first; the other two after it, each its own smaller count.
        for i in [2, 0, 1] {
            let (limiter, _, replicator) = &instances[i];
            assert_eq!(
                replicator
                    .collect(limiter.store(), limiter.now_us())
                    .await
                    .expect("read"),
                1,
                "{key}"
            );
            assert_eq!(replicator.ship(limiter.now_us()).await, 1, "{key}");
        }
        // us: 50 less eu's 21 fit, not one more.
        us_clock.set(now + 100);
        let mut fits = 0;
        for _ in 0..40 {
            fits += usize::from(
                us_limiter
                    .decisions()
                    .should_rate_limit(&request(key))
                    .await
                    .expect("decided")
                    .overall
                    == Code::Ok,
            );
        }
        assert_eq!(fits, 29, "{key}: us admits what eu's exact count leaves");
    }
}

/// One step of a global window's schedule: a hit (forced, or a peek, takes the driver; an ordinary one alone the
/// compact form, the global form's `hit`; with a regional tier beside it, the driver again), `times` times in one
/// store call (in Redis one script call, where a counter several compact calls hit is read and written once), or a
/// region's count of the current or the previous window shipped in.
#[derive(Debug, Clone)]
enum GlobalOp {
    Hit {
        cost: u64,
        mode: u8,
        beside: bool,
        times: usize,
    },
    Ship {
        region: u8,
        previous: bool,
        count: u64,
    },
}

fn global_op() -> impl proptest::strategy::Strategy<Value = (u64, GlobalOp)> {
    use proptest::prelude::*;
    let step = prop_oneof![3 => 0u64..2_000_000, 1 => 0u64..(3 * MINUTE)];
    let op = prop_oneof![
        4 => (
            prop_oneof![5 => 0u64..4, 1 => 0u64..40, 1 => Just(u64::MAX)],
            0u8..6,
            prop::bool::weighted(0.2),
            prop_oneof![3 => Just(1usize), 1 => 2usize..6],
        )
            .prop_map(|(cost, mode, beside, times)| GlobalOp::Hit { cost, mode, beside, times }),
        1 => (0u8..2, prop::bool::ANY, 0u64..30)
            .prop_map(|(region, previous, count)| GlobalOp::Ship { region, previous, count }),
    ];
    (step, op)
}

/// Random schedules of hits on a global fixed or sliding window and of other regions' shipments, driven through
/// the memory store and through Redis (the compact form and the driver): identical outcomes required.
fn global_windows_agree(url: String, prefix: &str) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    use sluice_core::store::{CounterKey, Mode};
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let redis = runtime.block_on(redis_store(&url));
    let case = std::sync::atomic::AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        prop::bool::ANY,
        prop_oneof![3 => 0u64..12, 1 => 12u64..100],
        prop::collection::vec(global_op(), 1..60),
    );
    let result = runner.run(&strategy, |(sliding, limit, ops)| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::SeqCst).to_string();
        let algorithm = if sliding {
            Algorithm::SlidingWindow
        } else {
            Algorithm::FixedWindow
        };
        let id = CounterKey::builder(prefix, "d").entry("case", &case).finish();
        let t = TierSpec {
            key: id.tier(algorithm, MINUTE),
            algorithm,
            limit,
            window_us: MINUTE,
            burst: limit,
            cost: None,
            global: true,
        };
        let regional = TierSpec {
            key: id.tier(Algorithm::FixedWindow, 1_000_000),
            algorithm: Algorithm::FixedWindow,
            limit: 5,
            window_us: 1_000_000,
            burst: 5,
            cost: None,
            global: false,
        };
        let memory = memory();
        let mut now = T0 + 123_457;
        let mut last = std::time::Instant::now();
        runtime.block_on(async {
            for (i, (step, op)) in ops.iter().enumerate() {
                // Redis expires keys by the real clock: the test's never runs slower.
                let real = last.elapsed().as_micros() as u64;
                last = std::time::Instant::now();
                now += step.max(&(real + 2_000));
                match op {
                    GlobalOp::Hit {
                        cost,
                        mode,
                        beside,
                        times,
                    } => {
                        let mode = match mode {
                            0 => Mode::Peek,
                            1 => Mode::Report,
                            _ => Mode::Hit,
                        };
                        let mut tiers = vec![t.clone()];
                        if *beside {
                            tiers.push(regional.clone());
                        }
                        let hit = Hit {
                            tiers,
                            cost: *cost,
                            mode,
                            ..Hit::default()
                        };
                        let hits = vec![hit; *times];
                        let (m, r) = (memory.hit(now, &hits).await, redis.hit(now, &hits).await);
                        let (mut m, r) = (crate::harness::decided(m), crate::harness::decided(r));
                        // The count a hit left is told by the compact form (and the memory store), not by the
                        // driver's: where Redis tells it, it is the memory store's.
                        for (m, r) in m.iter_mut().zip(&r) {
                            for (m, r) in m.tiers.iter_mut().zip(&r.tiers) {
                                if r.own.is_none() {
                                    m.own = None;
                                }
                            }
                        }
                        prop_assert_eq!(m, r, "step {} ({:?}) at {}", i, op, now);
                    }
                    GlobalOp::Ship {
                        region,
                        previous,
                        count,
                    } => {
                        let mut window = WindowRef::of(&t, now);
                        if *previous {
                            window.start_us = window.start_us.saturating_sub(MINUTE);
                        }
                        let counts = [RegionCount { window, count: *count }];
                        let name = ["us", "ap"][*region as usize];
                        memory.merge_counts(now, name, &counts).await.expect("merged");
                        redis.merge_counts(now, name, &counts).await.expect("merged");
                    }
                }
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn global_windows_agree_in_memory_and_redis() {
    let redis = RedisServer::start();
    global_windows_agree(redis.url(), "diff:");
}

#[test]
fn global_windows_agree_in_memory_and_a_cluster() {
    let cluster = crate::harness::RedisCluster::start();
    global_windows_agree(cluster.url(), "diffc:");
}

/// What clocks that disagree do to a global limit: two regions (each its own Redis), each offered 20 hits a second
/// against 600 a minute worldwide, shipping to each other every 100 ms with no delay; us's clock reads `skew_us`
/// ahead of eu's (behind when negative), time stepped by the test. Returns the hits both regions admitted in one
/// minute of eu's clock (the window whose start is eu's), and each region's part.
async fn admitted_under_skew(algorithm: &str, skew_us: i64) -> (usize, usize, usize) {
    let yaml = format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: 600, algorithm: {algorithm}, global: true}}\n"
    );
    let (eu, us) = (RedisServer::start(), RedisServer::start());
    let (eu_store, us_store) = (redis_store(&eu.url()).await, redis_store(&us.url()).await);
    let regions = [
        ("eu", eu_store.clone(), us_store.clone(), "us"),
        ("us", us_store, eu_store, "eu"),
    ];
    let mut sides = Vec::new();
    for (name, own, other, other_name) in regions {
        let (limiter, clock) = limiter_over(&yaml, own, LimiterSettings::default(), Metrics::discarded(0.8));
        let replicator = Replicator::new(
            RegionSettings {
                name: name.to_string(),
                interval: Duration::from_millis(100),
                backlog: 100_000,
                timeout: Duration::from_secs(1),
            },
            vec![(other_name.to_string(), other)],
        );
        limiter.join_regions(replicator.shared());
        sides.push((limiter, clock, replicator));
    }
    let request = Request {
        domain: "d".into(),
        descriptors: vec![Descriptor {
            entries: vec![("k".into(), format!("skew-{algorithm}-{skew_us}"))],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    };
    // From 2 s before eu's window to 2 s after it, in steps of 10 ms: each region takes a hit every 50 ms (us 25 ms
    // later), and both ship every 100 ms.
    let start = T0 - T0 % MINUTE + MINUTE;
    let (from, to) = (start - 2_000_000, start + MINUTE + 2_000_000);
    let mut admitted = [0usize; 2];
    let mut t = from;
    while t < to {
        for (r, (limiter, clock, _)) in sides.iter().enumerate() {
            let offset = if r == 0 { 0 } else { skew_us };
            clock.set(t.saturating_add_signed(offset));
            let phase = if r == 0 { 0 } else { 20_000 };
            if (t - from) % 50_000 == phase {
                let decision = limiter.decisions().should_rate_limit(&request).await.expect("decided");
                if decision.overall == Code::Ok && (start..start + MINUTE).contains(&t) {
                    admitted[r] += 1;
                }
            }
        }
        if (t - from) % 100_000 == 0 {
            for (limiter, _, replicator) in &sides {
                replicator
                    .collect(limiter.store(), limiter.now_us())
                    .await
                    .expect("read");
                replicator.ship(limiter.now_us()).await;
            }
        }
        t += 10_000;
    }
    (admitted[0] + admitted[1], admitted[0], admitted[1])
}

/// A skew of ±500 ms between two regions' clocks: measured, the total admitted in one minute of the reference clock
/// stays within the limit plus what the skewed region admits in the skew and one interval (20/s x 0.6 s = 12), for a
/// fixed and a sliding window (docs/src/regions.md, "Clocks").
#[tokio::test]
async fn a_skew_of_half_a_second_moves_the_total_by_at_most_what_the_skew_admits() {
    for algorithm in ["fixed_window", "sliding_window"] {
        for skew_ms in [0i64, 500, -500] {
            let (total, eu, us) = admitted_under_skew(algorithm, skew_ms * 1_000).await;
            eprintln!("{algorithm}, us {skew_ms:+} ms: {total} admitted in eu's minute (eu {eu}, us {us}) against 600");
            assert!(total >= 590, "{algorithm}, skew {skew_ms} ms: {total}");
            assert!(total <= 600 + 12, "{algorithm}, skew {skew_ms} ms: {total}");
        }
    }
}
