//! The read-only report of a request's limits ([`Decisions::get_remaining`]): what is left of each descriptor's most
//! constrained limit, and when a hit of a given cost would pass, from one peek of the store.

use super::Decisions;
use crate::limiter::decision::{AppliedLimit, LimitError, Report};
use crate::limiter::request::{Request, validate};
use crate::limiter::resolve::{Target, resolve};
use crate::store::{Announcements, Counters, Hit, Mode, Outcome, StoreError};

impl<S: Counters + Announcements> Decisions<S> {
    /// Reports each descriptor's most constrained limit, what is left of it, and when a hit of `cost` would pass
    /// every limit. Read-only.
    pub async fn get_remaining(&self, request: &Request, cost: u64) -> Result<Vec<Report>, LimitError> {
        validate(request, &self.core.settings.caps)
            .inspect_err(|_| self.core.metrics.invalid_request("get_remaining"))?;
        let now_us = self.core.clock.now_us();
        let rules = self.core.rules.load();
        let domain = rules.domain(&request.domain);
        let stats = self.core.domain_stats(domain);
        let targets = resolve(domain, request);
        let hits: Vec<Hit> = request
            .descriptors
            .iter()
            .zip(&targets)
            .filter_map(|(descriptor, target)| match target {
                Target::Limited { tiers, rule, shared } => {
                    let hit = self.core.hit(request, descriptor, (tiers, *rule, shared), cost, &[]);
                    Some(Hit {
                        mode: Mode::Peek,
                        ..hit
                    })
                }
                _ => None,
            })
            .collect();
        let outcomes: Result<Vec<Outcome>, StoreError> = if hits.is_empty() {
            Ok(Vec::new())
        } else {
            self.core.guard.call(now_us, &hits).await.into_iter().collect()
        };
        let mut outcomes = outcomes
            .inspect_err(|_| stats.remaining_unavailable.increment(1))?
            .into_iter();
        stats.remaining_ok.increment(1);
        targets
            .into_iter()
            .map(|target| {
                Ok(match target {
                    // GetRemaining reports the limits; lists decide only hits.
                    Target::NoRule | Target::Listed(_) => Report::NoRule,
                    Target::Unlimited(_) => Report::Unlimited,
                    Target::Limited { tiers, .. } => {
                        let outcome = outcomes.next().ok_or_else(|| {
                            LimitError::Store(StoreError::Other("store returned too few states".into()))
                        })?;
                        let (i, tier) = outcome
                            .tiers
                            .iter()
                            .enumerate()
                            .min_by_key(|(_, t)| (t.remaining, std::cmp::Reverse(t.reset_after_us)))
                            .ok_or_else(|| LimitError::Store(StoreError::Other("no tier state".into())))?;
                        let never = outcome.tiers.iter().any(|t| t.retry_after_us.is_none());
                        Report::Limited {
                            limit: AppliedLimit::from(&tiers[i]),
                            remaining: tier.remaining,
                            reset_after_us: tier.reset_after_us,
                            retry_after_us: if never {
                                None
                            } else {
                                outcome.tiers.iter().filter_map(|t| t.retry_after_us).max()
                            },
                            records: outcome.records,
                        }
                    }
                })
            })
            .collect()
    }
}
