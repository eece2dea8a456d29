//! `Domain::find` on a realistic compiled configuration: what one request descriptor costs to match before any
//! counter is touched. The configuration mixes a key-only rule, a few hundred exact values, wildcard patterns
//! scanned in order, and rules nested two and three levels deep, so each case below exercises one path of the
//! matcher: hash lookup, pattern scan, key-only fallback, descent, and a miss.

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_core::metrics::Metrics;
use sluice_core::rules::RuleSet;

/// Exact `path` values in the configuration, as a service with many routes has.
const EXACT_PATHS: usize = 300;

/// The configuration: one domain, `edge`, shaped like a front proxy's.
fn config() -> String {
    let mut yaml = String::from(
        "domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 5, name: login}
  - key: path
    value: /static/*.css
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: path
    value: /static/*.js
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: path
    value: /img/*/thumb/*
    rate_limit: {unit: second, requests_per_unit: 500}
  - key: path
    value: /download/*.iso
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    value: /api/*
    descriptors:
      - key: user
        rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: tenant
    value: acme
    descriptors:
      - key: plan
        value: gold
        descriptors:
          - key: user
            rate_limit: {unit: minute, requests_per_unit: 600}
      - key: plan
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: tier
    value: internal
    rate_limit: {unlimited: true}
",
    );
    for i in 0..EXACT_PATHS {
        yaml.push_str(&format!(
            "  - key: path\n    value: /v1/resource{i}\n    rate_limit: {{unit: second, requests_per_unit: {}}}\n",
            100 + i
        ));
    }
    yaml
}

fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn bench_find(c: &mut Criterion) {
    let metrics = Metrics::discarded(0.8);
    let file = sluice_core::config::parse(Path::new("edge.yaml"), &config()).expect("the bench configuration parses");
    let rules = RuleSet::compile(&[file], &metrics).expect("the bench configuration compiles");
    let domain = rules.domain("edge").expect("the bench configuration defines edge");

    let cases = [
        ("exact", entries(&[("path", "/v1/resource137")])),
        ("key_only", entries(&[("remote_address", "10.1.2.3")])),
        ("wildcard_first", entries(&[("path", "/static/site.css")])),
        ("wildcard_last", entries(&[("path", "/download/ubuntu-24.04.iso")])),
        ("fallback", entries(&[("path", "/unknown/route")])),
        ("nested_2", entries(&[("path", "/api/v2/orders"), ("user", "42")])),
        (
            "nested_3",
            entries(&[("tenant", "acme"), ("plan", "gold"), ("user", "42")]),
        ),
        ("miss", entries(&[("country", "fr")])),
    ];
    let mut group = c.benchmark_group("find");
    for (name, entries) in &cases {
        assert!(
            domain.find(entries).is_some() == (*name != "miss"),
            "case {name} does not match as intended"
        );
        group.bench_function(*name, |b| b.iter(|| domain.find(black_box(entries)).is_some()));
    }
    group.finish();
}

criterion_group!(benches, bench_find);
criterion_main!(benches);
