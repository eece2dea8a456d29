//! Bounded fuzzing with proptest, run in CI: arbitrary requests through the wire conversion and the decision core,
//! and arbitrary text through configuration parsing and compiling, never panic; every failure is a named error.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sluice::limiter::LimitError;
use sluice::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{Entry, RateLimitOverride};

use crate::harness::{limiter, memory};

const CONFIG: &str = "
domain: edge
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: w
    value: '*x*'
    share_threshold: true
    rate_limits:
      - {unit: minute, requests_per_unit: 5, algorithm: sliding_log}
      - {unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 4}
  - key: c
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: concurrency}
  - key: q
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: queue, record: {key: k, size: 2}}
";

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        prop::sample::select(vec!["k", "w", "c", "q", "edge", "x", "{", "}", "*", "|", "=", "1:"])
            .prop_map(String::from),
        "\\PC{0,40}",
    ]
}

fn descriptor() -> impl Strategy<Value = RateLimitDescriptor> {
    (
        prop::collection::vec((text(), text()), 0..4),
        prop::option::of((any::<u32>(), -2i32..9)),
        prop::option::of(any::<u64>()),
    )
        .prop_map(|(entries, limit, hits_addend)| RateLimitDescriptor {
            entries: entries.into_iter().map(|(key, value)| Entry { key, value }).collect(),
            limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
                requests_per_unit,
                unit,
            }),
            hits_addend,
        })
}

#[test]
fn arbitrary_requests_never_panic() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (l, _) = limiter(CONFIG, memory());
    let strategy = (
        prop_oneof![Just("edge".to_string()), text()],
        prop::collection::vec(descriptor(), 0..5),
        any::<u32>(),
        any::<u64>(),
    );
    let mut runner = TestRunner::new(Config {
        cases: 2_000,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |(domain, descriptors, hits_addend, cost)| {
            let request = sluice::faces::wire::to_core(domain, descriptors, hits_addend);
            runtime.block_on(async {
                for result in [
                    l.decisions().should_rate_limit(&request).await.map(|_| ()),
                    l.decisions().get_remaining(&request, cost).await.map(|_| ()),
                ] {
                    if let Err(e) = result {
                        prop_assert!(matches!(e, LimitError::InvalidArgument(ref m) if !m.is_empty()), "{e}");
                    }
                }
                Ok(())
            })
        })
        .unwrap();
}

#[test]
fn arbitrary_configurations_never_panic() {
    let metrics = sluice::metrics::Metrics::discarded(0.8);
    let words = prop::sample::select(vec![
        "domain",
        "descriptors",
        "key",
        "value",
        "rate_limit",
        "rate_limits",
        "unit",
        "requests_per_unit",
        "unlimited",
        "name",
        "replaces",
        "shadow_mode",
        "algorithm",
        "burst",
        "unit_multiplier",
        "record",
        "size",
        "second",
        "token_bucket",
        "- ",
        ": ",
        "{",
        "}",
        "[",
        "]",
        "\n",
        "  ",
        "-1",
        "0",
        "99999999999",
        "true",
        "*",
        "'",
        "\"",
        "~",
        "&a",
        "*a",
        "!!str",
    ]);
    let strategy = prop::collection::vec(words, 0..60).prop_map(|w| w.concat());
    let mut runner = TestRunner::new(Config {
        cases: 3_000,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |yaml| {
            let result = sluice::config::parse(std::path::Path::new("fuzz.yaml"), &yaml)
                .and_then(|f| sluice::rules::RuleSet::compile(&[f], &metrics).map(|_| ()));
            if let Err(e) = result {
                prop_assert!(e.to_string().starts_with("config 'fuzz.yaml': "), "{e}");
            }
            Ok(())
        })
        .unwrap();
}
