//! Ending leases and deleting state: [`Decisions::release`] ends a lease in the `concurrency` limits a request maps
//! to, [`Decisions::reset`] deletes the counters (and hit records) of exactly the limits it maps to.

use super::Decisions;
use crate::limiter::decision::{LimitError, QueuedWork, ResetReport};
use crate::limiter::hits::{alone, tier_key};
use crate::limiter::request::{Request, validate};
use crate::limiter::resolve::{Target, resolve};
use crate::limiter::settings::Cap;
use crate::rules::Tier;
use crate::store::{Announcements, CounterKey, Counters, Releases, StreamReset, algorithm};

impl<S: Counters + Announcements + Releases> Decisions<S> {
    /// Ends `lease` in every `concurrency` limit the request's descriptors map to; returns how many leases ended.
    pub async fn release(&self, request: &Request, lease: &str) -> Result<u64, LimitError> {
        validate(request, &self.core.settings.caps).inspect_err(|_| self.core.metrics.invalid_request("release"))?;
        if lease.is_empty() {
            self.core.metrics.invalid_request("release");
            return Err(LimitError::InvalidArgument("lease_id is empty".into()));
        }
        if lease.len() > self.core.settings.caps.max_value_bytes {
            self.core.metrics.invalid_request("release");
            return Err(LimitError::OverCap {
                cap: Cap::ValueBytes,
                message: format!(
                    "lease_id is {} bytes, over the cap of {}",
                    lease.len(),
                    self.core.settings.caps.max_value_bytes
                ),
            });
        }
        let keys = self.keys(request, |t| t.limit.algorithm.takes_lease(), false);
        Ok(self.core.guard.store().release(&keys, lease).await?)
    }

    /// Deletes the state of exactly the limits (and hit records) the request's descriptors map to. A `queue`
    /// limit's stream that still holds entries is work waiting for a worker: it is kept, and named in the report,
    /// unless `queued` says to drop it.
    pub async fn reset(&self, request: &Request, queued: QueuedWork) -> Result<ResetReport, LimitError> {
        validate(request, &self.core.settings.caps).inspect_err(|_| self.core.metrics.invalid_request("reset"))?;
        let keep_streams = queued == QueuedWork::Keep;
        let is_stream = |t: &Tier| keep_streams && t.limit.algorithm.queues();
        let keys = self.keys(request, |t| !is_stream(t), true);
        let streams = self.keys(request, is_stream, false);
        let deleted = self.core.guard.store().reset(&keys).await;
        // Freed once the counters are gone (or may be, when the call failed): a denial decided before is dropped,
        // and one decided across the reset is never stored (freeing moves the cache's generation on).
        self.core
            .guard
            .freed(keys.iter().chain(&streams).map(|k| String::from(k.clone())).collect())
            .await;
        let deleted = deleted?;
        let streams = if streams.is_empty() {
            StreamReset::default()
        } else {
            self.core
                .guard
                .store()
                .reset_idle_streams(self.core.clock.now_us(), &streams)
                .await?
        };
        Ok(ResetReport {
            deleted: deleted + streams.deleted,
            kept_streams: streams.kept.iter().map(|k| k.as_str().to_string()).collect(),
        })
    }

    /// The keys of the matched limits that `select` picks, and of the hit records when `records`. A plain counter
    /// (kept in Redis as a key per window, [`CounterKey::window`]) comes with the keys of every window it may hold now
    /// (`algorithm::window_starts`), as does the counter's own key, by which the memory store keeps its state and the
    /// Redis store finds it (its own key, or its record in its descriptor's packed state).
    fn keys(&self, request: &Request, select: impl Fn(&Tier) -> bool, records: bool) -> Vec<CounterKey> {
        let rules = self.core.rules.load();
        let targets = resolve(rules.domain(&request.domain), request);
        let now_us = self.core.clock.now_us();
        let mut keys = Vec::new();
        for (descriptor, target) in request.descriptors.iter().zip(&targets) {
            if let Target::Limited { tiers, rule, shared } = target {
                let id = self.core.identity(&request.domain, descriptor, shared);
                for tier in tiers.iter().filter(|t| select(t)) {
                    let key = tier_key(&id, tier, alone(tiers, *rule));
                    let windows = algorithm::window_starts(tier.limit.algorithm, tier.limit.window_us(), now_us);
                    keys.extend(windows.map(|s| key.window(s)));
                    keys.push(key);
                }
                if records && rule.is_some_and(|r| r.record.is_some()) {
                    keys.push(id.records());
                }
            }
        }
        keys
    }
}
