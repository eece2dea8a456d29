//! The algorithms as users configure them: `algorithm`, `burst`, `rate_limits` tiers, `record`, leases and queues,
//! Release and Reset, through the decision core over both stores with an injected clock.

use sluice_core::clock::Clock;
use sluice_core::limiter::{Code, Decision, Descriptor, LimitError, QueuedWork, Report, Request};
use sluice_core::rules::{Algorithm, Unit};
use sluice_core::store::Store;

use crate::harness::{T0, limiter};

const SECOND: u64 = 1_000_000;

const CONFIG: &str = "
domain: alg
descriptors:
  - key: api
    rate_limits:
      - {unit: second, requests_per_unit: 2, name: burst}
      - {unit: minute, requests_per_unit: 3, algorithm: sliding_log, name: sustained}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 3, name: tb}
  - key: gate
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: leaky_bucket}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: sliding_window}
  - key: jobs
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency, name: inflight}
  - key: work
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: queue}
  - key: ip
    rate_limit:
      unit: minute
      requests_per_unit: 100
      record: {key: user_id, size: 2}
";

fn req(descriptors: &[&[(&str, &str)]]) -> Request {
    Request {
        domain: "alg".into(),
        descriptors: descriptors
            .iter()
            .map(|entries| Descriptor {
                entries: entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                ..Descriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

async fn decide<S: Store>(l: &sluice_core::limiter::Limiter<S>, r: &Request) -> Decision {
    l.decisions().should_rate_limit(r).await.expect("decides")
}

both_stores!(
    tiers_report_the_most_constrained_and_denials_consume_nothing,
    token_bucket_status_and_refill,
    leaky_bucket_is_a_uniform_gate,
    sliding_window_through_the_core,
    concurrency_leases_are_returned_and_released,
    queue_entries_are_returned,
    records_are_reported_by_get_remaining,
    reset_deletes_exactly_the_descriptors_state,
    reset_forgets_both_windows_of_a_sliding_window,
    over_limit_duration_is_the_wait_until_the_hit_passes,
);

async fn tiers_report_the_most_constrained_and_denials_consume_nothing(store: impl Store) {
    let (l, clock) = limiter(CONFIG, store);
    let r = req(&[&[("api", "k")]]);
    let d = decide(&l, &r).await;
    let s = &d.statuses[0];
    // After one hit: 1 left of 2/s, 2 left of 3/min: the per-second tier is the most constrained.
    assert_eq!(
        (s.remaining, s.limit.as_ref().unwrap().name.as_deref()),
        (1, Some("burst"))
    );
    decide(&l, &r).await;
    let d = decide(&l, &r).await;
    assert_eq!(d.overall, Code::OverLimit);
    assert_eq!(d.statuses[0].limit.as_ref().unwrap().name.as_deref(), Some("burst"));
    clock.advance(SECOND);
    // The denied third hit consumed neither tier: one more passes, then the minute tier is exhausted.
    let d = decide(&l, &r).await;
    assert_eq!(d.overall, Code::Ok);
    let s = &d.statuses[0];
    assert_eq!(
        (s.remaining, s.limit.as_ref().unwrap().name.as_deref()),
        (0, Some("sustained"))
    );
    clock.advance(SECOND);
    let d = decide(&l, &r).await;
    assert_eq!(d.overall, Code::OverLimit);
    assert_eq!(d.statuses[0].limit.as_ref().unwrap().name.as_deref(), Some("sustained"));
    let Report::Limited { retry_after_us, .. } = &l.decisions().get_remaining(&r, 1).await.unwrap()[0] else {
        panic!()
    };
    assert_eq!(
        *retry_after_us,
        Some(58 * SECOND),
        "until the first hit leaves the minute log"
    );
}

async fn token_bucket_status_and_refill(store: impl Store) {
    let (l, clock) = limiter(CONFIG, store);
    let r = req(&[&[("bucket", "b")]]);
    for left in [2, 1, 0] {
        let d = decide(&l, &r).await;
        assert_eq!(d.overall, Code::Ok);
        assert_eq!(d.statuses[0].remaining, left);
    }
    let d = decide(&l, &r).await;
    assert_eq!(d.overall, Code::OverLimit);
    assert_eq!(
        d.statuses[0].reset_after_us,
        Some(100_000),
        "over the limit: the wait for one token (100 ms), not until full (300 ms)"
    );
    let Report::Limited {
        limit,
        remaining,
        retry_after_us,
        ..
    } = &l.decisions().get_remaining(&r, 2).await.unwrap()[0]
    else {
        panic!()
    };
    assert_eq!(
        (limit.limit.algorithm, limit.limit.burst, *remaining),
        (Algorithm::TokenBucket, 3, 0)
    );
    assert_eq!(*retry_after_us, Some(200_000));
    clock.advance(200_000);
    assert_eq!(decide(&l, &r).await.statuses[0].remaining, 1);
    let Report::Limited { retry_after_us, .. } = &l.decisions().get_remaining(&r, 4).await.unwrap()[0] else {
        panic!()
    };
    assert_eq!(*retry_after_us, None, "a cost above the bucket never fits");
}

async fn leaky_bucket_is_a_uniform_gate(store: impl Store) {
    let (l, clock) = limiter(CONFIG, store);
    let r = req(&[&[("gate", "g")]]);
    assert_eq!(decide(&l, &r).await.overall, Code::Ok);
    assert_eq!(decide(&l, &r).await.overall, Code::OverLimit);
    clock.advance(499_999);
    assert_eq!(decide(&l, &r).await.overall, Code::OverLimit);
    clock.advance(1);
    assert_eq!(decide(&l, &r).await.overall, Code::Ok, "one every 500 ms");
}

async fn sliding_window_through_the_core(store: impl Store) {
    let (l, clock) = limiter(CONFIG, store);
    let r = req(&[&[("sliding", "s")]]);
    for _ in 0..4 {
        assert_eq!(decide(&l, &r).await.overall, Code::Ok);
    }
    assert_eq!(decide(&l, &r).await.overall, Code::OverLimit);
    // 40 s into the next minute (T0 is 10 s into its own): a third of the previous minute still counts.
    clock.advance(90 * SECOND);
    let Report::Limited { remaining, .. } = &l.decisions().get_remaining(&r, 1).await.unwrap()[0] else {
        panic!()
    };
    assert_eq!(*remaining, 3, "4 - floor(4 * 20 / 60)");
}

async fn concurrency_leases_are_returned_and_released(store: impl Store) {
    let (l, clock) = limiter(CONFIG, store);
    let r = req(&[&[("jobs", "j")]]);
    let first = decide(&l, &r).await;
    let lease = first.lease.clone().expect("a lease for an admitted concurrency hit");
    assert_eq!(lease.len(), 32);
    let second = decide(&l, &r).await;
    assert_ne!(second.lease, first.lease, "every request has its own lease");
    let third = decide(&l, &r).await;
    assert_eq!(third.overall, Code::OverLimit);
    assert_eq!(third.lease, None, "no lease when denied");
    assert_eq!(l.decisions().release(&r, &lease).await.unwrap(), 1);
    assert_eq!(l.decisions().release(&r, &lease).await.unwrap(), 0);
    assert_eq!(decide(&l, &r).await.overall, Code::Ok, "the released place is free");
    assert!(matches!(
        l.decisions().release(&r, "").await,
        Err(LimitError::InvalidArgument(_))
    ));
    // Unreleased leases expire after the window (a minute): a crashed caller never leaks capacity.
    clock.advance(60 * SECOND);
    assert_eq!(decide(&l, &r).await.overall, Code::Ok);
    assert_eq!(decide(&l, &r).await.overall, Code::Ok);
}

async fn queue_entries_are_returned(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    let r = req(&[&[("other", "x")], &[("work", "w1")]]);
    let d = decide(&l, &r).await;
    assert_eq!(d.queued.len(), 1);
    let q = &d.queued[0];
    assert_eq!(q.descriptor, 1);
    assert!(q.stream.ends_with("|queue/3600"), "{}", q.stream);
    assert!(q.entry_id.contains('-'), "{}", q.entry_id);
    assert_eq!(decide(&l, &r).await.overall, Code::Ok);
    let d = decide(&l, &r).await;
    assert_eq!(d.overall, Code::OverLimit, "the queue holds 2");
    assert!(d.queued.is_empty());
}

async fn records_are_reported_by_get_remaining(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    for user in ["alice", "bob", "carol"] {
        decide(&l, &req(&[&[("ip", "10.0.0.1")], &[("user_id", user)]])).await;
    }
    decide(&l, &req(&[&[("ip", "10.0.0.2")], &[("user_id", "dave")]])).await;
    let Report::Limited { records, remaining, .. } = &l
        .decisions()
        .get_remaining(&req(&[&[("ip", "10.0.0.1")]]), 1)
        .await
        .unwrap()[0]
    else {
        panic!()
    };
    assert_eq!(records, &["carol", "bob"], "the last two, newest first, per counter");
    assert_eq!(*remaining, 97);
}

/// A sliding window reads the previous window too: a reset forgets both, whatever keys the store keeps them in.
async fn reset_forgets_both_windows_of_a_sliding_window(store: impl Store) {
    let (l, clock) = limiter(CONFIG, store);
    let r = req(&[&[("sliding", "r")]]);
    for _ in 0..4 {
        decide(&l, &r).await;
    }
    // The next minute's first microsecond (T0 is 10 s into its own), where the previous one's four hits all weigh.
    clock.advance(50 * SECOND);
    assert_eq!(decide(&l, &r).await.overall, Code::OverLimit);
    l.decisions().reset(&r, QueuedWork::Keep).await.unwrap();
    let d = decide(&l, &r).await;
    assert_eq!((d.overall, d.statuses[0].remaining), (Code::Ok, 3), "starts over");
}

async fn reset_deletes_exactly_the_descriptors_state(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    let a = req(&[&[("api", "a")]]);
    let b = req(&[&[("api", "b")]]);
    decide(&l, &a).await;
    decide(&l, &a).await;
    decide(&l, &b).await;
    assert_eq!(
        l.decisions().reset(&a, QueuedWork::Keep).await.unwrap().deleted,
        2,
        "both tiers of api=a"
    );
    assert_eq!(decide(&l, &a).await.statuses[0].remaining, 1, "a starts over");
    assert_eq!(decide(&l, &b).await.statuses[0].remaining, 0, "b is untouched");
    let none = l
        .decisions()
        .reset(&req(&[&[("nothing", "here")]]), QueuedWork::Keep)
        .await
        .unwrap();
    assert_eq!(none.deleted, 0);
}

#[test]
fn algorithm_config_errors_name_file_and_path() {
    let metrics = sluice_core::metrics::Metrics::discarded(0.8);
    let cases = [
        (
            "rate_limit: {unit: second, requests_per_unit: 1, algorithm: magic}",
            "rate_limit.algorithm: unknown algorithm 'magic' (expected fixed_window, sliding_window",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 1, burst: 5}",
            "rate_limit.burst: burst applies to token_bucket and leaky_bucket, not fixed_window",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 0, algorithm: token_bucket}",
            "rate_limit.requests_per_unit: must be at least 1 for token_bucket",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 0}",
            "rate_limit.burst: must be at least 1",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: -1}",
            "rate_limit.burst: invalid",
        ),
        (
            "rate_limit: {unit: year, requests_per_unit: 1, algorithm: token_bucket, burst: 200}",
            "rate_limit.burst: the bucket takes longer than 100 years to fill",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 20000, algorithm: sliding_log}",
            "rate_limit.requests_per_unit: 20000 is too many for sliding_log (at most 10000",
        ),
        ("rate_limits: []", "rate_limits: the list of limits is empty"),
        (
            "rate_limits: [{unit: second, requests_per_unit: 1}, {unit: second, requests_per_unit: 2}]",
            "rate_limits[1]: same algorithm and window as descriptors[0].rate_limits[0]",
        ),
        (
            "rate_limits: [{unit: second, requests_per_unit: 1}, {unlimited: true}]",
            "rate_limits[1].unlimited: an unlimited limit cannot be combined",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits: [{unit: minute, requests_per_unit: 2}]",
            "rate_limits: use either rate_limit or rate_limits",
        ),
        (
            "rate_limit: {unlimited: true, burst: 3}",
            "rate_limit.burst: does not apply to an unlimited rule",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 1, record: {key: '', size: 2}}",
            "rate_limit.record.key: the entry key to record is empty",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 1, record: {key: u, size: 0}}",
            "rate_limit.record.size: must be between 1 and 1000",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 1, record: {key: u, size: 5, extra: 1}}",
            "rate_limit.record: unknown field `extra`",
        ),
        (
            "rate_limits: [{unit: second, requests_per_unit: 1, record: {key: u, size: 1}}, {unit: minute, requests_per_unit: 1, record: {key: u, size: 1}}]",
            "rate_limits[1].record: only one limit of a rule may keep records",
        ),
    ];
    for (limit, want) in cases {
        let text = format!("domain: d\ndescriptors:\n  - key: k\n    {limit}\n");
        let err = sluice_core::config::parse(std::path::Path::new("alg.yaml"), &text)
            .and_then(|f| sluice_core::rules::RuleSet::compile(&[f], &metrics).map(|_| ()))
            .expect_err(limit)
            .to_string();
        assert!(err.starts_with("config 'alg.yaml': descriptors[0]"), "{err}");
        assert!(err.contains(want), "want {want:?} in {err}");
    }
    // Good combinations compile, and the defaults are as documented.
    let rules = sluice_core::rules::RuleSet::compile(
        &[sluice_core::config::parse(std::path::Path::new("alg.yaml"), CONFIG).unwrap()],
        &metrics,
    )
    .unwrap();
    let domain = rules.domain("alg").unwrap();
    let gate = domain.find(&[("gate", "x")]).unwrap().rule;
    assert_eq!(
        (gate.tiers[0].limit.burst, gate.tiers[0].limit.unit),
        (1, Unit::Second),
        "leaky bucket: burst 1"
    );
    let bucket = domain.find(&[("bucket", "x")]).unwrap().rule;
    assert_eq!(bucket.tiers[0].limit.burst, 3);
    assert_eq!(T0 % SECOND, 0);
}

const RETRY: &str = "
domain: alg
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 4, algorithm: sliding_window}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_log}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 3}
  - key: leaky
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: leaky_bucket}
  - key: jobs
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency}
  - key: work
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: queue}
  - key: tiers
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 3, algorithm: sliding_log}
";

/// Per algorithm: hits spaced by `gaps` (advanced before each), then one more of `cost` is denied, and its
/// `duration_until_reset` must be exactly the wait until that hit passes: `expected`, what GetRemaining says, one
/// microsecond short still denied (now 1 µs to wait), and at it admitted. The local cache is off, so every answer
/// is the store's.
async fn over_limit_duration_is_the_wait_until_the_hit_passes(store: impl Store) {
    let settings = sluice_core::limiter::LimiterSettings {
        local_cache_size: 0,
        ..Default::default()
    };
    let (l, clock) = crate::harness::limiter_with(RETRY, store, settings);
    let minute = 60 * SECOND;
    let hour = 60 * minute;
    // (key, hits at these steps, then this step, then a hit of this cost is denied with this wait)
    let cases: [(&str, &[u64], u64, u64, u64); 9] = [
        // T0 is 10 s into its minute and hour: the window ends 50 s later.
        ("fixed", &[0, 0], 0, 1, 50 * SECOND),
        // Four hits 10 s into an hour weigh all of their 4 until that hour ends: half an hour later the next hit
        // waits until the hour's end, plus 1 µs for the weight to drop below 4; not two hours after the hits.
        ("sliding", &[0, 0, 0, 0], 30 * minute, 1, 1_790 * SECOND + 1),
        // The oldest of two hits (T0, T0 + 10 s) leaves the minute at T0 + 60 s.
        ("log", &[0, 10 * SECOND], 0, 1, 50 * SECOND),
        // Three tokens spent at 100 ms each; two more take 200 ms (full again only after 300 ms).
        ("bucket", &[0, 0, 0], 0, 2, 200_000),
        ("leaky", &[0], 0, 1, 500_000),
        // The first lease (of two, 10 s apart) expires a minute after it was taken.
        ("jobs", &[0, 10 * SECOND], 0, 1, 50 * SECOND),
        // The oldest entry goes stale an hour after it was appended.
        ("work", &[0, 10 * SECOND], 0, 1, hour - 10 * SECOND),
        // 2/s passes at T0 (twice) and T0 + 1 s, which fills the minute log of 3; at T0 + 2 s the 2/s tier has room
        // and the log denies until T0 + 60 s.
        ("tiers", &[0, 0, SECOND], SECOND, 1, 58 * SECOND),
        // A cost of 2 against a log of 2: both hits (T0, T0 + 10 s) must leave.
        ("log", &[0, 10 * SECOND], 0, 2, 60 * SECOND),
    ];
    for (i, (key, gaps, then, cost, expected)) in cases.into_iter().enumerate() {
        let value = i.to_string();
        let mut r = req(&[&[(key, value.as_str())]]);
        for gap in gaps {
            clock.advance(*gap);
            assert_eq!(decide(&l, &r).await.overall, Code::Ok, "{key} #{i}: filling");
        }
        clock.advance(then);
        r.descriptors[0].hits_addend = Some(cost);
        let d = decide(&l, &r).await;
        assert_eq!(d.overall, Code::OverLimit, "{key} #{i}");
        let wait = d.statuses[0].reset_after_us.expect("set when over");
        assert_eq!(wait, expected, "{key} #{i}: the wait until the denied hit passes");
        let Report::Limited { retry_after_us, .. } = &l.decisions().get_remaining(&r, cost).await.unwrap()[0] else {
            panic!("{key} is limited")
        };
        assert_eq!(*retry_after_us, Some(wait), "{key} #{i}: the store's retry time");
        clock.advance(wait - 1);
        let d = decide(&l, &r).await;
        assert_eq!(
            (d.overall, d.statuses[0].reset_after_us),
            (Code::OverLimit, Some(1)),
            "{key} #{i}: 1 µs early"
        );
        clock.advance(1);
        assert_eq!(decide(&l, &r).await.overall, Code::Ok, "{key} #{i}: on time");
        // Leave the next case a fresh minute and hour boundary as T0 had: 10 s into both.
        let day = 24 * hour;
        clock.set(T0 + (clock.now_us() - T0).div_ceil(day) * day);
    }
}
