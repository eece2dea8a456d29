//! A stream's periodic work ([`Quotas::tick`]): buckets idle for too long abandoned, and grants sized again where
//! that is due.

use std::sync::atomic::Ordering;

use super::grant::Due;
use super::stream::QuotaStream;
use super::vocabulary::{Action, BucketId, QuotaError};
use super::{Quotas, lock};
use crate::limiter::{Claim, Usage};
use crate::store::{Announcements, Counters, Grants};

impl<S: Counters + Announcements + Grants> Quotas<S> {
    /// A stream's periodic work: abandons buckets idle for too long (giving their grants back), and sizes again the
    /// buckets where that is due (a TTL about to lapse, a DENY_ALL whose window allows more again, or news from
    /// another stream), sending what changed.
    pub async fn tick(&self, stream: &mut QuotaStream) -> Result<Vec<Action>, QuotaError> {
        let Some(domain) = stream.domain.clone() else {
            return Ok(Vec::new());
        };
        let now = self.limiter.now_us();
        let dirty = std::mem::take(&mut *lock(&stream.inbox.dirty));
        let mut actions = Vec::new();
        let idle: Vec<BucketId> = stream
            .buckets
            .iter()
            .filter(|(_, w)| now.saturating_sub(w.active_us) >= u64::from(w.settings.abandon_after_s) * 1_000_000)
            .map(|(b, _)| b.clone())
            .collect();
        let mut leaving = Vec::new();
        for bucket in idle {
            if let Some(watch) = stream.buckets.remove(&bucket) {
                if let Some(ledger) = &watch.ledger {
                    self.unwatch(ledger, &stream.inbox);
                    leaving.push(bucket.clone());
                }
            }
            self.stats.abandoned.increment(1);
            actions.push(Action::Abandon { bucket });
        }
        if !leaving.is_empty() {
            // The Envoy forgets the bucket and its tokens: they go back to the quota.
            let claims: Vec<Claim<'_>> = leaving
                .iter()
                .map(|bucket| Claim {
                    bucket,
                    holder: &stream.holder,
                    held: 0,
                    want: 0,
                    ttl_us: 0,
                    newcomer: false,
                    rate: None,
                })
                .collect();
            let _ = self.limiter.buckets().grant(&domain, &claims).await;
        }
        let due: Vec<Usage> = stream
            .buckets
            .iter()
            .filter(|(_, w)| dirty.all || w.ledger.as_ref().is_some_and(|l| dirty.ledgers.contains(l)) || w.due(now))
            .map(|(bucket, _)| Usage {
                bucket: bucket.clone(),
                ..Usage::default()
            })
            .collect();
        if !due.is_empty() {
            let charged = self.charge(&domain, &due).await?;
            let due = due
                .into_iter()
                .zip(charged)
                .filter_map(|(usage, charged)| {
                    Some(Due {
                        bucket: usage.bucket,
                        charged: charged?,
                        report: None,
                    })
                })
                .collect();
            actions.extend(self.size(stream, &domain, due, now, false).await);
        }
        if !actions.is_empty() {
            self.stats.buckets.set(self.watched.load(Ordering::Relaxed) as f64);
        }
        self.post(stream, &actions);
        Ok(actions)
    }
}
