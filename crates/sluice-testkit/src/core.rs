//! The decision core over real stores: rule sets from YAML text, limiters on a manual clock, stores on a test
//! Redis, and store-level tiers.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::clock::ManualClock;
use sluice_core::config;
use sluice_core::limiter::{Limiter, LimiterSettings};
use sluice_core::metrics::Metrics;
use sluice_core::rules::{Algorithm, RuleSet};
use sluice_core::store::memory::MemoryStore;
use sluice_core::store::redis::{RedisSettings, RedisStore};
use sluice_core::store::{Answers, CounterKey, KeyLayout, Outcome, Store, TierSpec};

use crate::harness::T0;

/// One limit of the descriptor `k=<name>` in domain `d`, as the store receives it.
pub fn tier(name: &str, algorithm: Algorithm, limit: u64, window_us: u64, burst: u64) -> TierSpec {
    TierSpec {
        key: CounterKey::builder("test:", "d")
            .layout(KeyLayout::Compact)
            .entry("k", name)
            .finish()
            .tier(algorithm, window_us),
        algorithm,
        limit,
        window_us,
        burst,
        cost: None,
        global: false,
    }
}

/// The key of the counter of one limit (`algorithm` over `window_us`) of the descriptor `entries` of `domain`, in the
/// compact layout under `prefix`: its windows' keys start with it.
pub fn counter_of(
    prefix: &str,
    domain: &str,
    entries: &[(&str, &str)],
    algorithm: Algorithm,
    window_us: u64,
) -> String {
    let mut key = CounterKey::builder(prefix, domain).layout(KeyLayout::Compact);
    for (k, v) in entries {
        key = key.entry(k, v);
    }
    key.finish().tier(algorithm, window_us).as_str().to_string()
}

/// Compiles a one-file configuration.
pub fn rules(yaml: &str, metrics: &Metrics) -> RuleSet {
    let file = config::parse(Path::new("test.yaml"), yaml).expect("test config parses");
    RuleSet::compile(&[file], metrics).expect("test config compiles")
}

/// A limiter over `store` recording into `metrics`, with a manual clock at [`T0`].
pub fn limiter_over<S: Store>(
    yaml: &str,
    store: S,
    settings: LimiterSettings,
    metrics: Metrics,
) -> (Arc<Limiter<S>>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let limiter = Limiter::new(rules(yaml, &metrics), store, clock.clone(), metrics, settings);
    (Arc::new(limiter), clock)
}

/// Every outcome of a store call, which must have decided every hit.
pub fn decided(answers: Answers) -> Vec<Outcome> {
    answers
        .into_iter()
        .map(|a| a.expect("the store decides every hit"))
        .collect()
}

pub fn memory() -> MemoryStore {
    MemoryStore::new()
}

/// A Redis store on `url` deciding by the time it is given (not Redis's clock), so tests drive time. Its timeout only
/// bounds a hang, for tests that are not about timeouts: generous, so that a call on a busy host is not failed for
/// being slow. A test of timeouts gives its own to [`redis_store_with`].
pub async fn redis_store(url: &str) -> RedisStore {
    redis_store_with(url, Duration::from_secs(5)).await
}

pub async fn redis_store_with(url: &str, timeout: Duration) -> RedisStore {
    RedisStore::connect(&RedisSettings {
        url: url.to_string(),
        timeout,
        pool_size: 1,
        server_time: false,
        tls: Default::default(),
    })
    .await
    .expect("redis store connects")
}
