//! Top offenders: per rule, the values hit most and denied most over the last minute and hour, summed across the
//! instances on one Redis, each bucket bounded, the spans read on the limiters' clocks; and the dashboard's outcomes
//! per rule and second.

use std::sync::Arc;

use sluice_core::clock::ManualClock;
use sluice_core::limiter::{Code, Costs, Descriptor, LimitError, Limiter, LimiterSettings, Request, RuleOffenders};
use sluice_core::store::{Span, Store};

use crate::harness::{RedisServer, limiter_with, redis_store};

const CONFIG: &str = "
domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 1000}
";

fn limiter<S: Store>(store: S, kept: usize) -> (Arc<Limiter<S>>, Arc<ManualClock>) {
    let settings = LimiterSettings {
        key_prefix: "test:".into(),
        top_offenders: kept,
        ..LimiterSettings::default()
    };
    limiter_with(CONFIG, store, settings)
}

fn req(key: &str, value: &str) -> Request {
    Request {
        domain: "api".into(),
        descriptors: vec![Descriptor {
            entries: vec![(key.into(), value.into())],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    }
}

async fn send<S: Store>(l: &Limiter<S>, key: &str, value: &str, times: usize) -> usize {
    let mut denied = 0;
    for _ in 0..times {
        denied +=
            usize::from(l.decisions().should_rate_limit(&req(key, value)).await.unwrap().overall == Code::OverLimit);
    }
    denied
}

fn counts(list: &[(String, u64)]) -> Vec<(&str, u64)> {
    list.iter().map(|(v, n)| (v.as_str(), *n)).collect()
}

fn rule<'a>(top: &'a [RuleOffenders], path: &str) -> &'a RuleOffenders {
    top.iter()
        .find(|r| r.rule == path)
        .unwrap_or_else(|| panic!("{path} in {top:?}"))
}

/// Drives `instances` (one, or several sharing a Redis): the same traffic spread over them, the same answers.
async fn offenders_are_summed_and_age_out<S: Store>(instances: &[(Arc<Limiter<S>>, Arc<ManualClock>)]) {
    let n = instances.len();
    for (i, (l, _)) in instances.iter().enumerate() {
        send(l, "user", "alice", 20 / n + usize::from(i < 20 % n)).await;
        if i == 0 {
            send(l, "user", "bob", 2).await;
            send(l, "user", "carol", 1).await;
            send(l, "path", "/a", 5).await;
        }
    }
    for (l, _) in instances {
        l.tallies().flush_offenders().await;
    }
    let l = &instances[0].0;
    let top = l.tallies().top_offenders("api", Span::Minute, 10).await.unwrap();
    assert_eq!(
        top.iter().map(|r| r.rule.as_str()).collect::<Vec<_>>(),
        ["api.user", "api.path"],
        "the busiest rule first"
    );
    let user = rule(&top, "api.user");
    assert_eq!(
        counts(&user.hits),
        [("user=alice", 20), ("user=bob", 2), ("user=carol", 1)]
    );
    assert_eq!(
        counts(&user.denied),
        [("user=alice", 17)],
        "3 of alice's 20 passed an hourly limit of 3"
    );
    assert_eq!(counts(&rule(&top, "api.path").denied), []);
    // `limit` bounds both lists and the rules.
    let top = l.tallies().top_offenders("api", Span::Minute, 1).await.unwrap();
    assert_eq!((top.len(), top[0].hits.len()), (1, 1));
    // Two minutes on, the minute is empty and the hour still holds them; after the hour, nothing.
    for (_, clock) in instances {
        clock.advance(120_000_000);
    }
    assert!(
        l.tallies()
            .top_offenders("api", Span::Minute, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let hour = l.tallies().top_offenders("api", Span::Hour, 10).await.unwrap();
    assert_eq!(counts(&rule(&hour, "api.user").denied), [("user=alice", 17)]);
    for (_, clock) in instances {
        clock.advance(3_600_000_000);
    }
    assert!(
        l.tallies()
            .top_offenders("api", Span::Hour, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let err = l.tallies().top_offenders("nope", Span::Hour, 10).await.unwrap_err();
    assert!(
        matches!(&err, LimitError::NotFound(m) if m.contains("no domain 'nope'")),
        "{err}"
    );
}

every_store!(
    one_instance_ranks_its_offenders,
    a_flood_of_distinct_values_stays_bounded,
    outcomes_per_second_are_counted_per_rule,
);

async fn one_instance_ranks_its_offenders(store: impl Store) {
    offenders_are_summed_and_age_out(&[limiter(store, 100)]).await;
}

/// 5 000 distinct values and one heavy one (a fifth of the traffic), 8 kept: the heavy one, above 1/8 of each flush,
/// is on top with at least its true count, and no bucket holds more than 8.
async fn a_flood_of_distinct_values_stays_bounded(store: impl Store) {
    let (l, _) = limiter(store, 8);
    for i in 0..5_000 {
        send(&l, "path", &format!("/p{i}"), 1).await;
        if i % 4 == 0 {
            send(&l, "path", "/hot", 1).await;
        }
        if i % 1_000 == 999 {
            l.tallies().flush_offenders().await;
        }
    }
    let top = l.tallies().top_offenders("api", Span::Hour, 100).await.unwrap();
    let path = rule(&top, "api.path");
    assert!(path.hits.len() <= 8, "{:?}", path.hits);
    assert_eq!(path.hits[0].0, "path=/hot");
    assert!(path.hits[0].1 >= 1_250, "{:?}", path.hits[0]);
}

#[tokio::test]
async fn two_instances_on_one_redis_sum_their_offenders() {
    let redis = RedisServer::start();
    let a = limiter(redis_store(&redis.url()).await, 100);
    let b = limiter(redis_store(&redis.url()).await, 100);
    offenders_are_summed_and_age_out(&[a, b]).await;
    // Every bucket the two wrote expires (nothing outlives the hour it serves by more than ten minutes).
    let keys = redis.cli(&["--raw", "KEYS", "test:*top|*"]);
    for key in keys.lines().filter(|k| !k.is_empty()) {
        let ttl: i64 = redis.cli(&["--raw", "PTTL", key]).trim().parse().unwrap();
        assert!(ttl > 0 && ttl <= 4_200_000, "{key}: {ttl}");
    }
}

/// The dashboard's series: per rule and second, allowed and denied, read back over the last seconds.
async fn outcomes_per_second_are_counted_per_rule(store: impl Store) {
    let (l, clock) = limiter(store, 0);
    send(&l, "user", "alice", 5).await;
    clock.advance(1_000_000);
    send(&l, "user", "alice", 1).await;
    send(&l, "path", "/a", 2).await;
    // A reported cost is counted whatever the limits say: it is no decision, allowed or denied.
    let costs = Costs {
        cost: 4,
        ..Costs::default()
    };
    l.budgets().report(&req("user", "alice"), &costs).await.unwrap();
    l.tallies().flush_series().await;
    let series = l.tallies().series("api", 3).await.unwrap();
    assert_eq!(series.from, l.now_us() / 1_000_000 - 2);
    assert_eq!(
        series.rules["api.user"],
        (vec![0, 3, 0], vec![0, 2, 1]),
        "3 of 5 allowed, then 1 denied"
    );
    assert_eq!(series.rules["api.path"], (vec![0, 0, 2], vec![0, 0, 0]));
    assert_eq!(
        series.reported,
        [("api.user".to_string(), vec![0, 0, 1])].into(),
        "one report, apart from the decisions"
    );
    let now = l.now_us() / 1_000_000;
    assert_eq!(
        l.tallies().instances_seen(3).await.unwrap(),
        [(l.instance().to_string(), now)].into(),
        "the flush's heartbeat, in its second"
    );
    assert!(matches!(
        l.tallies().series("nope", 3).await,
        Err(LimitError::NotFound(_))
    ));
}

#[tokio::test]
async fn two_instances_sum_their_outcomes() {
    let redis = RedisServer::start();
    let (a, _) = limiter(redis_store(&redis.url()).await, 0);
    let (b, _) = limiter(redis_store(&redis.url()).await, 0);
    send(&a, "path", "/a", 2).await;
    send(&b, "path", "/a", 3).await;
    a.tallies().flush_series().await;
    b.tallies().flush_series().await;
    let series = a.tallies().series("api", 1).await.unwrap();
    assert_eq!(series.rules["api.path"], (vec![5], vec![0]));
    let seen = a.tallies().instances_seen(1).await.unwrap();
    let seen: Vec<&str> = seen.keys().map(|i| i.as_str()).collect();
    let mut both = vec![a.instance(), b.instance()];
    both.sort_unstable();
    assert_eq!(seen, both, "each instance's heartbeat");
}
