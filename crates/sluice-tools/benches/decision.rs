//! `Decisions::should_rate_limit` over the in-memory store: the whole decision core (validation, matching, counter
//! keys, store, metrics) without gRPC. One descriptor and three; one hot counter (every request on the same shard
//! lock) and many counters (a working set larger than the CPU caches).
//!
//! The clock is a `ManualClock` that never moves, so windows never roll over and no sweep runs mid-measurement; the
//! limits are high enough that every answer stays OK, the common case in production.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_core::clock::ManualClock;
use sluice_core::limiter::{Code, Descriptor, Limiter, LimiterSettings, Request};
use sluice_core::metrics::Metrics;
use sluice_core::rules::RuleSet;
use sluice_core::store::memory::MemoryStore;

/// 2024-01-01T00:00:10Z: far from any window edge.
const T0: u64 = 1_704_067_210_000_000;

/// Distinct counters of the many-keys cases.
const MANY_KEYS: usize = 100_000;

const CONFIG: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 4000000000, name: login}
  - key: path
    value: /api/*
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 4000000000}
";

fn new_limiter() -> Limiter<MemoryStore> {
    let metrics = Metrics::discarded(0.8);
    let file = sluice_core::config::parse(Path::new("edge.yaml"), CONFIG).expect("the bench configuration parses");
    let rules = RuleSet::compile(&[file], &metrics).expect("the bench configuration compiles");
    Limiter::new(
        rules,
        MemoryStore::new(),
        Arc::new(ManualClock::new(T0)),
        metrics,
        LimiterSettings::default(),
    )
}

fn descriptor(entries: &[(&str, &str)]) -> Descriptor {
    Descriptor {
        entries: entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    }
}

/// One descriptor: the client address.
fn one(key: usize) -> Request {
    Request {
        domain: "edge".into(),
        descriptors: vec![descriptor(&[(
            "remote_address",
            &format!("10.0.{}.{}", key / 256, key % 256),
        )])],
        hits_addend: 0,
    }
}

/// Three descriptors, as Envoy sends for one route with three actions: address, path, path and user.
fn three(key: usize) -> Request {
    let address = format!("10.0.{}.{}", key / 256, key % 256);
    let user = key.to_string();
    Request {
        domain: "edge".into(),
        descriptors: vec![
            descriptor(&[("remote_address", &address)]),
            descriptor(&[("path", "/login")]),
            descriptor(&[("path", "/api/orders"), ("user", &user)]),
        ],
        hits_addend: 0,
    }
}

fn bench_decision(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime starts");
    // A limiter that answers anything but a plain OK would make the figures below meaningless.
    let decision = runtime
        .block_on(new_limiter().decisions().should_rate_limit(&three(1)))
        .expect("the limiter decides");
    assert_eq!(decision.overall, Code::Ok);
    assert_eq!(decision.statuses.len(), 3);

    let mut group = c.benchmark_group("decide");
    for (descriptors, build) in [(1, one as fn(usize) -> Request), (3, three)] {
        let limiter = new_limiter();
        let hot = build(0);
        group.bench_function(format!("{descriptors}_desc_hot"), |b| {
            b.iter(|| {
                runtime
                    .block_on(limiter.decisions().should_rate_limit(black_box(&hot)))
                    .is_ok()
            })
        });

        let limiter = new_limiter();
        let requests: Vec<Request> = (0..MANY_KEYS).map(build).collect();
        let mut next = 0;
        group.bench_function(format!("{descriptors}_desc_{}k_keys", MANY_KEYS / 1000), |b| {
            b.iter(|| {
                next = (next + 1) % requests.len();
                runtime
                    .block_on(limiter.decisions().should_rate_limit(black_box(&requests[next])))
                    .is_ok()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_decision);
criterion_main!(benches);
