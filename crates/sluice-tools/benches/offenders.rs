//! What top offenders cost: `cargo bench -p sluice-tools --bench offenders`. `cargo test --benches` runs a quick
//! smoke pass.
//!
//! 1. On the decision path: `Decisions::should_rate_limit` over the in-memory store, three descriptors a request, with
//!    `top_offenders` at 0 (off) and at 100 (the default), on one hot set of values and on 100 000 distinct ones
//!    (every decision a new value: the sketch's worst case, a full table scanned for its least value each time).
//! 2. In Redis: the flush an instance makes once a second, in its worst case for one rule (100 values hit and 100
//!    denied, each bucket already full): Redis CPU per flush from `INFO commandstats`, and the flush's wall time.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use sluice_core::clock::ManualClock;
use sluice_core::limiter::{Code, Descriptor, Limiter, LimiterSettings, Request};
use sluice_core::metrics::Metrics;
use sluice_core::rules::RuleSet;
use sluice_core::store::Store;
use sluice_core::store::memory::MemoryStore;
use sluice_testkit::{RedisServer, redis_store};

const T0: u64 = 1_704_067_210_000_000;

const CONFIG: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
";

fn limiter<S: Store>(store: S, kept: usize) -> Limiter<S> {
    let metrics = Metrics::discarded(0.8);
    let file = sluice_core::config::parse(Path::new("edge.yaml"), CONFIG).expect("the bench configuration parses");
    let rules = RuleSet::compile(&[file], &metrics).expect("the bench configuration compiles");
    let settings = LimiterSettings {
        top_offenders: kept,
        ..LimiterSettings::default()
    };
    Limiter::new(rules, store, Arc::new(ManualClock::new(T0)), metrics, settings)
}

fn request(key: usize) -> Request {
    let d = |k: &str, v: String| Descriptor {
        entries: vec![(k.to_string(), v)],
        ..Default::default()
    };
    Request {
        domain: "edge".into(),
        descriptors: vec![
            d(
                "remote_address",
                format!("10.{}.{}.{}", key >> 16 & 255, key >> 8 & 255, key & 255),
            ),
            d("path", format!("/api/{}", key % 1_000)),
            d("user", format!("u{key}")),
        ],
        hits_addend: 0,
    }
}

/// Nanoseconds per decision over `requests`, the best of three passes.
fn per_decision(runtime: &tokio::runtime::Runtime, l: &Limiter<MemoryStore>, requests: &[Request], n: usize) -> f64 {
    (0..3)
        .map(|_| {
            let start = Instant::now();
            for i in 0..n {
                let d = runtime.block_on(l.decisions().should_rate_limit(&requests[i % requests.len()]));
                std::hint::black_box(d.is_ok());
            }
            start.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// Redis's CPU so far spent on commands, in microseconds (`INFO commandstats`).
fn command_usec(redis: &RedisServer) -> u64 {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|l| l.split("usec=").nth(1)?.split(',').next()?.parse::<u64>().ok())
        .sum()
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (keys, n, flushes) = if full {
        (100_000, 300_000, 50)
    } else {
        (1_000, 3_000, 3)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let requests: Vec<Request> = (0..keys).map(request).collect();
    let hot: Vec<Request> = (0..8).map(request).collect();
    println!("decision path, 3 descriptors a request, in-memory store:");
    for (name, set) in [("8 hot values", &hot), ("distinct values", &requests)] {
        let off = per_decision(&runtime, &limiter(MemoryStore::new(), 0), set, n);
        let on = per_decision(&runtime, &limiter(MemoryStore::new(), 100), set, n);
        println!(
            "  {name:>16}: off {off:>6.0} ns, on (100 kept) {on:>6.0} ns, +{:.0} ns a decision",
            on - off
        );
    }
    let (code, _) = (Code::Ok, ());
    let _ = code;

    let redis = RedisServer::start();
    runtime.block_on(async {
        let l = limiter(redis_store(&redis.url()).await, 100);
        let mut usec = 0;
        let mut wall = 0.0;
        for f in 0..flushes {
            // 100 values hit twice (each over its limit of 1: denied once), new values every flush so every bucket
            // stays full and trims.
            for i in 0..100 {
                let r = request(f * 100 + i);
                for _ in 0..2 {
                    l.decisions().should_rate_limit(&r).await.expect("redis answers");
                }
            }
            let before = command_usec(&redis);
            let start = Instant::now();
            l.tallies().flush_offenders().await;
            wall += start.elapsed().as_secs_f64();
            // INFO's own time is counted too, once per reading: small next to a flush.
            usec += command_usec(&redis) - before;
        }
        println!(
            "redis, one flush of 3 rules x (100 hit + 100 denied values) into full buckets: {:.0} us of Redis CPU, {:.2} ms wall",
            usec as f64 / flushes as f64,
            wall * 1e3 / flushes as f64
        );
    });
}
