//! RLQS buckets: usage that already happened, charged to their quotas ([`Buckets::charge`]), and the grants of each
//! bucket's quota to the Envoys that share it ([`Buckets::grant`]), over the store's [`Grants`].
//!
//! An Envoy of the Rate Limit Quota Service decides requests itself from its assignment and reports how many it
//! allowed and denied. Each bucket's quota is an ordinary counter (a rule of the domain's `quota_buckets`), so every
//! Envoy and every sluice instance on one store charges the same count. The allowed requests are counted whatever
//! the limit says (they were served: a forced hit). What each Envoy may spend next is a grant, recorded in the
//! bucket's ledger in the same store ([`Grants::grant`]), so that every instance shares out the same quota.

use std::sync::Arc;

use super::LimitError;
use super::core::Core;
use super::hits::identity_of;
use super::series::Noted;
use crate::metrics::MAX_COUNTED;
use crate::rules::{Algorithm, BucketSettings, Domain, Rule};
use crate::store::{
    Announcements, CounterKey, Counters, Grant, Granted, Grants, Hit, Identity, Mode, Outcome, StoreError, TierSpec,
};

/// One bucket's report: its id (entries sorted by key, no two keys equal) and the requests since the last one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub bucket: Vec<(String, String)>,
    pub allowed: u64,
    pub denied: u64,
}

/// What a bucket's quota is after its usage was charged.
#[derive(Debug, Clone, PartialEq)]
pub enum Charged {
    /// No `quota_buckets` rule matches the bucket id.
    NoRule,
    Unlimited,
    Limited(QuotaState),
}

/// A limited bucket's quota, shared by every Envoy that reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaState {
    /// The rule's name in metrics.
    pub rule: Arc<str>,
    pub settings: BucketSettings,
    pub shadow: bool,
    /// One per limit of the rule, after the charge.
    pub tiers: Vec<TierState>,
    /// The bucket's grant ledger, shared by every Envoy that reports it (and the name its notices carry).
    pub ledger: CounterKey,
}

/// One limit of a bucket after a charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierState {
    pub algorithm: Algorithm,
    pub limit: u64,
    pub window_us: u64,
    pub remaining: u64,
    /// Until a request fits again when nothing remains (a fixed window: until it ends); 0 otherwise.
    pub retry_after_us: u64,
}

/// The RLQS buckets' quotas.
pub struct Buckets<S> {
    core: Arc<Core<S>>,
}

impl<S> Buckets<S> {
    pub(super) fn new(core: Arc<Core<S>>) -> Buckets<S> {
        Buckets { core }
    }
}

impl<S: Counters + Announcements> Buckets<S> {
    /// Charges each bucket's usage to its quota and reports what is left: one store call for every bucket. An
    /// empty usage (nothing allowed or denied) charges nothing and only reads. A bucket whose counters could not be
    /// reached gets its own error; the others keep their answers.
    pub async fn charge(&self, domain: &str, usages: &[Usage]) -> Result<Vec<Result<Charged, StoreError>>, LimitError> {
        let now_us = self.core.clock.now_us();
        let rules = self.core.rules.load();
        let domain_name = domain;
        let domain = rules.domain(domain);
        let matched: Vec<Option<(&Rule, Identity)>> = usages
            .iter()
            .map(|usage| {
                let found = domain?.find_bucket(&usage.bucket)?;
                Some((found.rule, self.bucket_identity(domain?, usage, &found.shared)))
            })
            .collect();
        let hits = quota_hits(usages, &matched);
        let mut answers = if hits.is_empty() {
            Vec::new()
        } else {
            self.core.guard.call(now_us, &hits).await
        }
        .into_iter();

        let mut out = Vec::with_capacity(usages.len());
        for (usage, found) in usages.iter().zip(&matched) {
            let Some((rule, id)) = found else {
                out.push(Ok(Charged::NoRule));
                continue;
            };
            if rule.tiers.is_empty() {
                out.push(Ok(Charged::Unlimited));
                continue;
            }
            let quota = match answers.next() {
                Some(Ok(quota)) => quota,
                Some(Err(e)) => {
                    out.push(Err(e));
                    continue;
                }
                None => {
                    out.push(Err(StoreError::Other("store returned too few outcomes".into())));
                    continue;
                }
            };
            if let Some(domain) = domain {
                // Reported usage shows in the rule's series as its decisions do.
                let (allowed, denied) = (usage.allowed.min(MAX_COUNTED), usage.denied.min(MAX_COUNTED));
                self.core
                    .outcomes
                    .note_many(&domain.name, &rule.path, now_us, Noted::Allowed, allowed);
                self.core
                    .outcomes
                    .note_many(&domain.name, &rule.path, now_us, Noted::Denied, denied);
            }
            let state = self.charged(domain_name, usage, (rule, id), &quota);
            out.push(Ok(Charged::Limited(state)));
        }
        self.retry_times(now_us, &hits, &mut out).await;
        Ok(out)
    }

    /// A limited bucket's quota after its usage was charged (`quota`: what the store answered), the usage counted in
    /// its rule's metrics.
    fn charged(&self, domain: &str, usage: &Usage, (rule, id): (&Rule, &Identity), quota: &Outcome) -> QuotaState {
        let ratio = self.core.metrics.near_limit_ratio();
        if usage.allowed > 0 {
            let (used, limit) = quota
                .tiers
                .iter()
                .zip(rule.tiers.iter())
                .map(|(t, spec)| (t.used, spec.limit.capacity()))
                .max_by_key(|(used, limit)| used.saturating_mul(1000) / u64::from((*limit).max(1)))
                .unwrap_or((0, 0));
            rule.stats(&self.core.metrics, domain)
                .record(usage.allowed, limit, used, true, rule.shadow_mode, ratio);
        }
        if usage.denied > 0 {
            rule.stats(&self.core.metrics, domain)
                .record(usage.denied, 0, 0, false, false, ratio);
        }
        let tiers = quota
            .tiers
            .iter()
            .zip(rule.tiers.iter())
            .map(|(t, spec)| TierState {
                algorithm: spec.limit.algorithm,
                limit: u64::from(spec.limit.requests),
                window_us: spec.limit.window_us(),
                remaining: t.remaining,
                retry_after_us: 0,
            })
            .collect();
        QuotaState {
            rule: rule.path.clone(),
            settings: rule.bucket.as_deref().copied().unwrap_or_default(),
            shadow: rule.shadow_mode,
            tiers,
            ledger: id.grants(),
        }
    }

    /// For each bucket with nothing left, when one more request would fit (one more read, only for those).
    async fn retry_times(&self, now_us: u64, hits: &[Hit], out: &mut [Result<Charged, StoreError>]) {
        let mut quota_hits = hits.iter();
        let mut exhausted = Vec::new();
        for (i, charged) in out.iter().enumerate() {
            if let Ok(Charged::Limited(state)) = charged {
                let hit = quota_hits.next();
                if state.tiers.iter().any(|t| t.remaining == 0) {
                    if let Some(hit) = hit {
                        exhausted.push((
                            i,
                            Hit {
                                cost: 1,
                                mode: Mode::Peek,
                                ..hit.clone()
                            },
                        ));
                    }
                }
            } else if charged.is_err() {
                quota_hits.next();
            }
        }
        if exhausted.is_empty() {
            return;
        }
        let peeks: Vec<Hit> = exhausted.iter().map(|(_, h)| h.clone()).collect();
        let answers = self.core.guard.call(now_us, &peeks).await;
        for ((i, _), answer) in exhausted.iter().zip(answers) {
            let Ok(Charged::Limited(state)) = &mut out[*i] else {
                continue;
            };
            match answer {
                Ok(outcome) => {
                    for (tier, t) in state.tiers.iter_mut().zip(&outcome.tiers) {
                        if tier.remaining == 0 {
                            // A request never fits a limit of 0: look again after its window.
                            tier.retry_after_us = t.retry_after_us.unwrap_or(tier.window_us).max(1);
                        }
                    }
                }
                Err(e) => out[*i] = Err(e),
            }
        }
    }

    fn bucket_identity(&self, domain: &Domain, usage: &Usage, shared: &[(usize, &str)]) -> Identity {
        let key = CounterKey::bucket_builder(&self.core.settings.key_prefix, &domain.name)
            .layout(self.core.settings.key_layout);
        identity_of(key, &usage.bucket, shared)
    }
}

impl<S: Counters + Announcements + Grants> Buckets<S> {
    /// Grants each claim its part of its bucket's quota ([`Grants::grant`]): one store call for every claim. A claim
    /// whose bucket no limited rule matches (or an unlimited or shadow one) gets `None` and touches nothing.
    pub async fn grant(&self, domain: &str, claims: &[Claim<'_>]) -> Vec<Result<Option<Granted>, StoreError>> {
        let now_us = self.core.clock.now_us();
        let rules = self.core.rules.load();
        let domain = rules.domain(domain);
        let mut grants = Vec::new();
        let placed: Vec<bool> = claims
            .iter()
            .map(|claim| {
                let Some(domain) = domain else { return false };
                let Some(found) = domain.find_bucket(claim.bucket) else {
                    return false;
                };
                if found.rule.tiers.is_empty() || found.rule.shadow_mode {
                    return false;
                }
                let usage = Usage {
                    bucket: claim.bucket.to_vec(),
                    ..Usage::default()
                };
                let id = self.bucket_identity(domain, &usage, &found.shared);
                grants.push(Grant {
                    tiers: found.rule.tiers.iter().map(|t| quota_tier(&id, t)).collect(),
                    ledger: id.grants(),
                    holder: claim.holder.to_string(),
                    held: claim.held,
                    want: claim.want,
                    ttl_us: claim.ttl_us,
                    newcomer: claim.newcomer,
                    rate: claim.rate,
                });
                true
            })
            .collect();
        let mut granted = if grants.is_empty() {
            Vec::new()
        } else {
            self.core.guard.store().grant(now_us, &grants).await
        }
        .into_iter();
        placed
            .into_iter()
            .map(|placed| match placed {
                false => Ok(None),
                true => granted
                    .next()
                    .unwrap_or_else(|| Err(StoreError::Other("store returned too few grants".into())))
                    .map(Some),
            })
            .collect()
    }
}

/// One Envoy stream's claim on a bucket's quota ([`Buckets::grant`]): see [`Grant`].
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    /// The bucket id, entries sorted by key.
    pub bucket: &'a [(String, String)],
    pub holder: &'a str,
    pub held: u64,
    pub want: u64,
    pub ttl_us: u64,
    /// See [`Grant::newcomer`].
    pub newcomer: Option<u64>,
    /// A rate's limit per window, when the Envoys share the quota as a rate.
    pub rate: Option<u64>,
}

/// The store's hits of the limited buckets among `matched`: each usage's allowed requests, counted whatever the
/// limits say (they were served).
fn quota_hits(usages: &[Usage], matched: &[Option<(&Rule, Identity)>]) -> Vec<Hit> {
    let mut hits = Vec::new();
    for (usage, found) in usages.iter().zip(matched) {
        let Some((rule, id)) = found else { continue };
        if rule.tiers.is_empty() {
            continue;
        }
        let tiers = rule.tiers.iter().map(|t| quota_tier(id, t)).collect();
        hits.push(Hit {
            tiers,
            cost: usage.allowed,
            mode: Mode::Report,
            ..Hit::default()
        });
    }
    hits
}

/// A quota rule's limit as the store counts it.
fn quota_tier(id: &Identity, t: &crate::rules::Tier) -> TierSpec {
    TierSpec {
        key: id.tier(t.limit.algorithm, t.limit.counter_span_us()),
        algorithm: t.limit.algorithm,
        limit: u64::from(t.limit.requests),
        window_us: t.limit.window_us(),
        burst: u64::from(t.limit.burst),
        cost: None,
        global: false,
    }
}
