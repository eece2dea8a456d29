//! The bucketed window as users configure it: limits of one descriptor sharing their per-second counts, decided
//! through the core over every store with an injected clock; GetRemaining, Reset, the count kept in Redis, the
//! error bound, and the configuration's refusals.

use sluice_core::limiter::{Code, Decision, Descriptor, QueuedWork, Report, Request};
use sluice_core::rules::Algorithm;
use sluice_core::store::Store;

use crate::harness::{T0, limiter};

const SECOND: u64 = 1_000_000;

/// 3 a second, 5 per 10 s, 7 per 15 s: one-second sub-windows each, shared.
const CONFIG: &str = "
domain: bw
descriptors:
  - key: api
    rate_limits:
      - {unit: second, requests_per_unit: 3, algorithm: bucketed_window, name: per-second}
      - {unit: second, unit_multiplier: 10, requests_per_unit: 5, algorithm: bucketed_window, buckets: 10, name: per-10s}
      - {unit: second, unit_multiplier: 15, requests_per_unit: 7, algorithm: bucketed_window, buckets: 15, name: per-15s}
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: bucketed_window}
";

fn req(key: &str, value: &str) -> Request {
    Request {
        domain: "bw".into(),
        descriptors: vec![Descriptor {
            entries: vec![(key.to_string(), value.to_string())],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    }
}

async fn decide<S: Store>(l: &sluice_core::limiter::Limiter<S>, r: &Request) -> Decision {
    l.decisions().should_rate_limit(r).await.expect("decides")
}

async fn remaining<S: Store>(l: &sluice_core::limiter::Limiter<S>, r: &Request) -> u64 {
    match &l.decisions().get_remaining(r, 1).await.expect("reports")[0] {
        Report::Limited { remaining, .. } => *remaining,
        other => panic!("{other:?}"),
    }
}

both_stores!(shared_sub_windows_decide_every_limit, reset_deletes_every_sub_window);

async fn shared_sub_windows_decide_every_limit(store: impl Store) {
    let (l, clock) = limiter(CONFIG, store);
    let r = req("api", "k");
    for _ in 0..3 {
        assert_eq!(decide(&l, &r).await.overall, Code::Ok);
    }
    let d = decide(&l, &r).await;
    assert_eq!(
        (d.overall, d.statuses[0].limit.as_ref().and_then(|l| l.name.as_deref())),
        (Code::OverLimit, Some("per-second"))
    );
    // A second on: the per-second limit is free again, the 10-second one has 2 left.
    clock.advance(SECOND);
    assert_eq!(remaining(&l, &r).await, 2, "5 per 10 s less the 3 of the first second");
    for _ in 0..2 {
        assert_eq!(decide(&l, &r).await.overall, Code::Ok);
    }
    let d = decide(&l, &r).await;
    assert_eq!(
        (d.overall, d.statuses[0].limit.as_ref().and_then(|l| l.name.as_deref())),
        (Code::OverLimit, Some("per-10s"))
    );
    // Ten seconds after the first: its 3 left the 10-second window, not the 15-second one (5 of 7 counted).
    clock.advance(9 * SECOND);
    assert_eq!(remaining(&l, &r).await, 2, "7 per 15 s less the 5 counted");
    for _ in 0..2 {
        assert_eq!(decide(&l, &r).await.overall, Code::Ok);
    }
    let d = decide(&l, &r).await;
    assert_eq!(
        (d.overall, d.statuses[0].limit.as_ref().and_then(|l| l.name.as_deref())),
        (Code::OverLimit, Some("per-15s"))
    );
    // Fifteen seconds after the first: its 3 left every window; the 15-second one counts 2 + 2.
    clock.advance(5 * SECOND);
    assert_eq!(remaining(&l, &r).await, 3);
    assert_eq!(decide(&l, &r).await.statuses[0].remaining, 2);
}

async fn reset_deletes_every_sub_window(store: impl Store) {
    let (l, clock) = limiter(CONFIG, store);
    let r = req("minute", "m");
    // Ten hits spread over a minute's one-second sub-windows (the default for a minute: 60 of them).
    for _ in 0..10 {
        assert_eq!(decide(&l, &r).await.overall, Code::Ok);
        clock.advance(5 * SECOND);
    }
    assert_eq!(decide(&l, &r).await.overall, Code::OverLimit);
    l.decisions().reset(&r, QueuedWork::Keep).await.expect("resets");
    assert_eq!(remaining(&l, &r).await, 10, "every sub-window forgotten");
    assert_eq!(decide(&l, &r).await.statuses[0].remaining, 9);
}

/// In Redis the limits that share their sub-windows keep one hash: a hit is one count in its second, beside the sum
/// of the seconds kept, the oldest and newest kept and the longest window (15 seconds); a second's first count
/// deletes the seconds no window spans any more; past every window the hash starts afresh.
#[tokio::test]
async fn redis_keeps_one_hash_of_the_shared_sub_windows() {
    let redis = crate::harness::RedisServer::start();
    let (l, clock) = limiter(CONFIG, crate::harness::redis_store(&redis.url()).await);
    let r = req("api", "k");
    let counter = crate::harness::counter_of("sluice:", "bw", &[("api", "k")], Algorithm::BucketedWindow, SECOND);
    let hash = || {
        let mut fields: Vec<(String, String)> = redis
            .cli(&["--raw", "HGETALL", &counter])
            .lines()
            .collect::<Vec<_>>()
            .chunks(2)
            .map(|p| (p[0].to_string(), p.get(1).unwrap_or(&"").to_string()))
            .collect();
        fields.sort();
        fields
    };
    let at = |seconds: u64| (T0 + seconds * SECOND).to_string();
    let fields = |pairs: &[(String, &str)]| {
        let mut v: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.clone(), v.to_string())).collect();
        v.sort();
        v
    };
    for _ in 0..3 {
        decide(&l, &r).await;
    }
    clock.advance(SECOND);
    decide(&l, &r).await;
    assert_eq!(
        hash(),
        fields(&[
            (at(0), "3"),
            (at(1), "1"),
            ("t".into(), "4"),
            ("o".into(), &at(0)),
            ("l".into(), &at(1)),
            ("s".into(), "15"),
        ]),
        "one count per second, shared"
    );
    let snapshot = redis.snapshot();
    let (_, _, ttl) = snapshot.iter().find(|(k, _, _)| *k == counter).expect("the counter");
    assert!(
        *ttl > 14_000 && *ttl <= 15_000,
        "lives as long as the longest window counts its newest second: {ttl}"
    );
    // At second 15 the first second is out of every window: its count goes with second 15's first.
    clock.advance(14 * SECOND);
    decide(&l, &r).await;
    assert_eq!(
        hash(),
        fields(&[
            (at(1), "1"),
            (at(15), "1"),
            ("t".into(), "2"),
            ("o".into(), &at(1)),
            ("l".into(), &at(15)),
            ("s".into(), "15"),
        ]),
        "the seconds no window spans deleted"
    );
    // Past every window nothing kept counts: the hash starts afresh.
    clock.advance(60 * SECOND);
    decide(&l, &r).await;
    assert_eq!(
        hash(),
        fields(&[
            (at(75), "1"),
            ("t".into(), "1"),
            ("o".into(), &at(75)),
            ("l".into(), &at(75)),
            ("s".into(), "15"),
        ])
    );
}

/// The error bound: any interval of the window's length admits at most the limit plus what the sub-window that has
/// just left the sum counted, and a caller that bursts at the end of a sub-window, then sends as soon as it may,
/// reaches it.
#[tokio::test]
async fn any_interval_holds_the_limit_plus_one_sub_window() {
    let config = "
domain: bw
descriptors:
  - key: k
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 20, algorithm: bucketed_window, buckets: 5}
";
    let (l, clock) = limiter(config, crate::harness::memory());
    let r = req("k", "v");
    let step = 10_000;
    clock.advance(150 * step);
    let mut admitted = Vec::new();
    // From 1.5 s on: the first burst lands in the last quarter of the first sub-window.
    for i in 150..1_300u64 {
        if decide(&l, &r).await.overall == Code::Ok {
            admitted.push(i * step);
        }
        clock.advance(step);
    }
    let (window, width) = (10 * SECOND, 2 * SECOND);
    let in_sub = |start: u64| admitted.iter().filter(|&&t| t >= start && t < start + width).count();
    let mut worst = 0;
    for &from in &admitted {
        let held = admitted.iter().filter(|&&t| t >= from && t < from + window).count();
        // The sub-window that had just left the sum when the interval ended.
        let end = from + window - 1;
        let left = (end - end % width).saturating_sub(window);
        assert!(
            held <= 20 + in_sub(left),
            "{held} in [{from}, {end}], {} in the sub-window that left",
            in_sub(left)
        );
        worst = worst.max(held);
    }
    assert_eq!(
        worst, 40,
        "the bound is reached: the limit, plus the 20 of the sub-window that left"
    );
}

#[test]
fn bucketed_window_config_errors_name_file_and_path() {
    let metrics = sluice_core::metrics::Metrics::discarded(0.8);
    let cases = [
        (
            "rate_limit: {unit: minute, requests_per_unit: 1, buckets: 6}",
            "descriptors[0].rate_limit.buckets: buckets applies to bucketed_window, not fixed_window",
        ),
        (
            "rate_limit: {unit: minute, requests_per_unit: 1, algorithm: bucketed_window, buckets: 7}",
            "descriptors[0].rate_limit.buckets: 7 sub-windows do not split a window of 60 s into whole seconds",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 1, algorithm: bucketed_window, buckets: 0}",
            "descriptors[0].rate_limit.buckets: must be between 1 and 3600",
        ),
        (
            "rate_limit: {unit: day, requests_per_unit: 1, algorithm: bucketed_window, buckets: 4800}",
            "descriptors[0].rate_limit.buckets: must be between 1 and 3600",
        ),
        (
            "rate_limit: {unit: hour, requests_per_unit: 1, algorithm: bucketed_window, burst: 6}",
            "descriptors[0].rate_limit.burst: burst applies to token_bucket and leaky_bucket, not bucketed_window",
        ),
        (
            "rate_limit: {unit: hour, requests_per_unit: 1, algorithm: bucketed_window, global: true}",
            "descriptors[0].rate_limit.global: bucketed_window cannot be counted across regions",
        ),
    ];
    for (limit, expected) in cases {
        let yaml = format!("domain: d\ndescriptors:\n  - key: k\n    {limit}\n");
        let file = sluice_core::config::parse(std::path::Path::new("b.yaml"), &yaml).expect("parses");
        let err = sluice_core::rules::RuleSet::compile(&[file], &metrics)
            .expect_err(limit)
            .to_string();
        assert!(err.contains("'b.yaml'") && err.contains(expected), "{limit}: {err}");
    }
}
