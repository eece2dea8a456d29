//! What this instance tallies for every instance sharing the store, and what they tallied together: the top
//! offenders (`offenders.rs`: over the store's [`Offenders`](store::Offenders)), the outcomes per rule and second
//! with each instance's heartbeat (`series.rs`: over its [`Series`](store::Series)). The decision path notes both in
//! the core's tables; this part adds them to the store and reads the sums back for the dashboard.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::core::Core;
use super::decision::LimitError;
use super::offenders::{FLUSH_EVERY, RULES, RuleOffenders};
use super::series::Series;
use crate::store::{self, Announcements, CounterKey, Counters, Span};

/// The tallies of top offenders and outcomes per second.
pub struct Tallies<S> {
    core: Arc<Core<S>>,
}

/// The set of per-second hashes the heartbeats go to, as if it were a domain's: a domain's name cannot be empty, so no
/// domain's outcomes share it. One set for every domain: an instance writes one heartbeat a second, however many
/// domains it has.
const HEARTBEATS: &str = "";

/// How often the counts are added to the store, and how often the top offenders are (see `offenders`).
const EVERY: Duration = Duration::from_secs(1);

impl<S> Tallies<S> {
    pub(super) fn new(core: Arc<Core<S>>) -> Tallies<S> {
        Tallies { core }
    }
}

impl<S: Counters + Announcements + store::Series + store::Offenders> Tallies<S> {
    /// Adds this instance's counts to the store for as long as it runs: the outcomes every second, the top offenders
    /// every [`FLUSH_EVERY`]. Run it once per limiter, in a task of its own.
    pub async fn keep(&self) {
        // The first tick a second from now: at start there is nothing to add, not even a heartbeat worth a key.
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + EVERY, EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let per_offenders_flush = (FLUSH_EVERY.as_secs() / EVERY.as_secs()).max(1);
        for n in 1u64.. {
            tick.tick().await;
            self.flush_series().await;
            if n % per_offenders_flush == 0 {
                self.flush_offenders().await;
            }
        }
    }
}

impl<S: Counters + Announcements + store::Offenders> Tallies<S> {
    /// Adds what was noted since the last flush to the store now (what a failed flush held is dropped and logged).
    pub async fn flush_offenders(&self) {
        let kept = self.core.settings.top_offenders;
        let tallies = self.core.offenders.take(&self.core.settings.key_prefix, kept);
        if tallies.is_empty() {
            return;
        }
        if let Err(e) = self.core.store().tally(self.core.clock.now_us(), &tallies, kept).await {
            tracing::warn!(error = %e, tallies = tallies.len(), "top offenders of the last second not stored");
        }
    }

    /// The rules of `domain` noted over `span` (the busiest first, at most `limit`), each with its `limit` values
    /// hit most and denied most, summed across every instance sharing the store.
    pub async fn top_offenders(
        &self,
        domain: &str,
        span: Span,
        limit: usize,
    ) -> Result<Vec<RuleOffenders>, LimitError> {
        if self.core.rules().domain(domain).is_none() {
            return Err(LimitError::NotFound(format!(
                "domain: no domain '{domain}' is configured"
            )));
        }
        let prefix = &self.core.settings.key_prefix;
        let now_us = self.core.clock.now_us();
        let store = self.core.store();
        let mut rules = store
            .top(now_us, &CounterKey::top(prefix, domain, "", RULES), span)
            .await?;
        rules.truncate(limit);
        let reads = rules.into_iter().map(|(rule, _)| async move {
            let (hits, denied) = (
                CounterKey::top(prefix, domain, &rule, "hits"),
                CounterKey::top(prefix, domain, &rule, "denied"),
            );
            let (mut hits, mut denied) =
                futures::future::try_join(store.top(now_us, &hits, span), store.top(now_us, &denied, span)).await?;
            hits.truncate(limit);
            denied.truncate(limit);
            Ok::<_, LimitError>(RuleOffenders { rule, hits, denied })
        });
        futures::future::try_join_all(reads).await
    }
}

impl<S: Counters + Announcements + store::Series> Tallies<S> {
    /// Adds the outcomes counted since the last flush to the store now, and this instance's heartbeat for the current
    /// second (what a failed flush held is dropped and logged).
    pub async fn flush_series(&self) {
        let mut taken = self.core.outcomes.take();
        let beat = (self.core.clock.now_us() / 1_000_000, self.core.instance.to_string(), 1);
        taken.entry(Arc::from(HEARTBEATS)).or_default().push(beat);
        for (domain, counts) in taken {
            let set = CounterKey::series(&self.core.settings.key_prefix, &domain);
            if let Err(e) = self.core.store().series_add(&set, &counts).await {
                tracing::warn!(error = %e, domain = %domain, "outcomes of the last second not stored");
            }
        }
    }

    /// The instances sharing the store whose heartbeat is in the last `seconds` seconds (the current one included),
    /// by name ([`Limiter::instance`](super::Limiter::instance)), each with the last second it was seen. An instance
    /// beats once a second.
    pub async fn instances_seen(&self, seconds: u64) -> Result<BTreeMap<String, u64>, LimitError> {
        let now = self.core.clock.now_us() / 1_000_000;
        let from = now + 1 - seconds.max(1);
        let set = CounterKey::series(&self.core.settings.key_prefix, HEARTBEATS);
        let hashes = self.core.store().series_read(&set, from, now).await?;
        let mut seen = BTreeMap::new();
        for (i, hash) in hashes.into_iter().enumerate() {
            for instance in hash.into_keys() {
                seen.insert(instance, from + i as u64);
            }
        }
        Ok(seen)
    }

    /// The outcomes of `domain`'s rules over the last `seconds` seconds (the current one included), summed across
    /// every instance sharing the store.
    pub async fn series(&self, domain: &str, seconds: u64) -> Result<Series, LimitError> {
        if self.core.rules().domain(domain).is_none() {
            return Err(LimitError::NotFound(format!(
                "domain: no domain '{domain}' is configured"
            )));
        }
        let now = self.core.clock.now_us() / 1_000_000;
        let from = now + 1 - seconds.max(1);
        let set = CounterKey::series(&self.core.settings.key_prefix, domain);
        let hashes = self.core.store().series_read(&set, from, now).await?;
        Ok(Series::from_hashes(from, hashes))
    }
}
