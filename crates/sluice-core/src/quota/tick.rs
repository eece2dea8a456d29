//! A stream's periodic work ([`Quotas::tick`]): buckets idle for too long abandoned, and grants sized again where
//! that is due.

use std::sync::atomic::Ordering;

use super::grant::Due;
use super::stream::QuotaStream;
use super::vocabulary::{Action, BucketId, QuotaError};
use super::{Quotas, lock};
use crate::limiter::{Claim, Usage};
use crate::store::{Announcements, Counters, Grants, Notice};

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
                if let Some(ledger) = watch.ledger {
                    self.unwatch(&ledger, &stream.inbox);
                    leaving.push((bucket.clone(), ledger));
                }
            }
            self.stats.abandoned.increment(1);
            actions.push(Action::Abandon { bucket });
        }
        // The Envoy forgets the buckets and their tokens.
        self.give_back(stream, &domain, &leaving).await;
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

    /// A stream the Envoy ended (it closed or cancelled it, or its connection went): its Envoy is gone, and the tokens
    /// it held with it, so its grants go back to the quotas at once. (A stream sluice ends on shutdown keeps its
    /// entries until their TTL lapses: its Envoy keeps its assignments until then.)
    pub async fn leave(&self, stream: &mut QuotaStream) {
        let Some(domain) = stream.domain.clone() else {
            return;
        };
        let leaving: Vec<(BucketId, String)> = stream
            .buckets
            .iter()
            .filter_map(|(bucket, watch)| Some((bucket.clone(), watch.ledger.clone()?)))
            .collect();
        self.give_back(stream, &domain, &leaving).await;
    }

    /// Gives a stream's grants of `leaving` (buckets, with their ledgers) back to their quotas: its entries leave the
    /// ledgers, and the buckets' other streams, on every instance, size theirs again.
    async fn give_back(&self, stream: &QuotaStream, domain: &str, leaving: &[(BucketId, String)]) {
        if leaving.is_empty() {
            return;
        }
        let claims: Vec<Claim<'_>> = leaving
            .iter()
            .map(|(bucket, _)| Claim {
                bucket,
                holder: &stream.holder,
                held: 0,
                want: 0,
                ttl_us: 0,
                newcomer: None,
                rate: None,
            })
            .collect();
        let _ = self.limiter.buckets().grant(domain, &claims).await;
        let ledgers: Vec<String> = leaving.iter().map(|(_, ledger)| ledger.clone()).collect();
        for ledger in &ledgers {
            self.notify(ledger, Some(&stream.inbox));
        }
        self.limiter.store().announce(Notice::Quota(ledgers)).await;
    }
}
