//! Usage that already happened, charged to RLQS buckets: [`Limiter::charge_usage`].
//!
//! An Envoy of the Rate Limit Quota Service decides requests itself from its assignment and reports how many it
//! allowed and denied. Each bucket's quota is an ordinary counter (a rule of the domain's `quota_buckets`), so every
//! Envoy and every sluice instance on one store charges the same count. The allowed requests are counted whatever
//! the limit says (they were served: a forced hit), and the demand, allowed plus denied, goes to a second counter
//! from which each Envoy's share is sized (see [`crate::quota`]).

use super::{LimitError, Limiter};
use crate::rules::{Algorithm, BucketSettings, Domain, Rule};
use crate::store::{CounterKey, Hit, Identity, Store, StoreError, TierSpec};

/// The window over which a bucket's demand is counted, in microseconds: two of Envoy's 5 s report periods.
pub const DEMAND_WINDOW_US: u64 = 10_000_000;

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
    pub settings: BucketSettings,
    pub shadow: bool,
    /// One per limit of the rule, after the charge.
    pub tiers: Vec<TierState>,
    /// The requests, allowed or denied, that every Envoy reported for the bucket over the last
    /// [`DEMAND_WINDOW_US`] (a sliding-window estimate).
    pub demand: u64,
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

impl<S: Store> Limiter<S> {
    /// Charges each bucket's usage to its quota and reports what is left: one store call for every bucket. An
    /// empty usage (nothing allowed or denied) charges nothing and only reads. A bucket whose counters could not be
    /// reached gets its own error; the others keep their answers.
    pub async fn charge_usage(
        &self,
        domain: &str,
        usages: &[Usage],
    ) -> Result<Vec<Result<Charged, StoreError>>, LimitError> {
        let now_us = self.clock.now_us();
        let rules = self.rules.load();
        let domain_name = domain;
        let domain = rules.domain(domain);
        let matched: Vec<Option<(&Rule, Identity)>> = usages
            .iter()
            .map(|usage| {
                let found = domain?.find_bucket(&usage.bucket)?;
                Some((found.rule, self.bucket_identity(domain?, usage, &found.shared)))
            })
            .collect();
        let mut hits = Vec::new();
        for (usage, found) in usages.iter().zip(&matched) {
            let Some((rule, id)) = found else { continue };
            if rule.tiers.is_empty() {
                continue;
            }
            let tiers = rule
                .tiers
                .iter()
                .map(|t| TierSpec {
                    key: id.tier(t.limit.algorithm, t.limit.window_us()),
                    algorithm: t.limit.algorithm,
                    limit: u64::from(t.limit.requests),
                    window_us: t.limit.window_us(),
                    burst: u64::from(t.limit.burst),
                    cost: None,
                })
                .collect();
            hits.push(Hit {
                tiers,
                cost: usage.allowed,
                force: true,
                ..Hit::default()
            });
            hits.push(Hit {
                tiers: vec![TierSpec {
                    key: id.demand(),
                    algorithm: Algorithm::SlidingWindow,
                    limit: u64::from(u32::MAX),
                    window_us: DEMAND_WINDOW_US,
                    burst: u64::from(u32::MAX),
                    cost: None,
                }],
                cost: usage.allowed.saturating_add(usage.denied),
                force: true,
                ..Hit::default()
            });
        }
        let mut answers = if hits.is_empty() {
            Vec::new()
        } else {
            self.guard.call("hit", now_us, &hits).await
        }
        .into_iter();

        let ratio = self.metrics.near_limit_ratio();
        let mut out = Vec::with_capacity(usages.len());
        for (usage, found) in usages.iter().zip(&matched) {
            let Some((rule, _)) = found else {
                out.push(Ok(Charged::NoRule));
                continue;
            };
            let settings = rule.bucket.as_deref().copied().unwrap_or_default();
            if rule.tiers.is_empty() {
                out.push(Ok(Charged::Unlimited));
                continue;
            }
            let (quota, demand) = (answers.next(), answers.next());
            let (Some(quota), Some(demand)) = (quota, demand) else {
                out.push(Err(StoreError::Other("store returned too few outcomes".into())));
                continue;
            };
            let (quota, demand) = match (quota, demand) {
                (Ok(q), Ok(d)) => (q, d),
                (Err(e), _) | (_, Err(e)) => {
                    out.push(Err(e));
                    continue;
                }
            };
            if usage.allowed > 0 {
                let (used, limit) = quota
                    .tiers
                    .iter()
                    .zip(rule.tiers.iter())
                    .map(|(t, spec)| (t.used, spec.limit.capacity()))
                    .max_by_key(|(used, limit)| used.saturating_mul(1000) / u64::from((*limit).max(1)))
                    .unwrap_or((0, 0));
                rule.stats(&self.metrics, domain_name).record(
                    usage.allowed,
                    limit,
                    used,
                    true,
                    rule.shadow_mode,
                    ratio,
                );
            }
            if usage.denied > 0 {
                rule.stats(&self.metrics, domain_name)
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
            out.push(Ok(Charged::Limited(QuotaState {
                settings,
                shadow: rule.shadow_mode,
                tiers,
                demand: demand.tiers.first().map_or(0, |t| t.used),
            })));
        }
        self.retry_times(now_us, &hits, &mut out).await;
        Ok(out)
    }

    /// For each bucket with nothing left, when one more request would fit (one more read, only for those).
    async fn retry_times(&self, now_us: u64, hits: &[Hit], out: &mut [Result<Charged, StoreError>]) {
        let mut quota_hits = hits.iter().step_by(2);
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
                                force: false,
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
        let answers = self.guard.call("peek", now_us, &peeks).await;
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
        let key = CounterKey::bucket_builder(&self.settings.key_prefix, &domain.name);
        super::identity_of(key, &usage.bucket, shared)
    }
}
