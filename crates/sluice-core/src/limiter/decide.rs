//! Deciding a request (the decisions' ShouldRateLimit and the budgets' calls, each a [`How`]), in three phases: the
//! store's hit of each limited descriptor, the answers to them (the local cache's, then one store call for the
//! rest), and each descriptor's status shaped from its answer, with the metrics of its outcome counted on the way.

use std::borrow::Cow;
use std::sync::Arc;

use super::core::Core;
use super::decision::{AppliedLimit, Code, Decision, LimitError, Queued, Status, fallback_status};
use super::guard::constraining;
use super::new_lease;
use super::request::{Costs, Descriptor, Request, cost as request_cost, validate};
use super::resolve::{Target, listed, resolve};
use super::series::Noted;
use crate::metrics::{DomainStats, RuleStats, UNKNOWN_DOMAIN};
use crate::rules::{Algorithm, Domain, FailurePolicy, List, ListAction, Metadata, Rule, Tier};
use crate::store::{Announcements, Counters, Hit, Mode, Outcome, ReservationSpec, StoreError, TierOutcome};

impl<S: Counters + Announcements> Core<S> {
    /// Decides a request the way `how` says: each descriptor's hit counted when it fits, only checked, counted
    /// whatever (a report), or counted and held under a reservation.
    pub(crate) async fn decide(&self, request: &Request, how: How<'_>) -> Result<Decision, LimitError> {
        validate(request, &self.settings.caps).inspect_err(|_| self.metrics.invalid_request(how.rpc()))?;
        let now_us = self.clock.now_us();
        let rules = self.rules.load();
        let domain = rules.domain(&request.domain);
        let stats = self.domain_stats(domain);
        let mut targets = resolve(domain, request);
        if domain.is_some_and(|d| !d.lists.is_empty()) {
            let live = self.live_lists.load();
            listed(domain, request, &mut targets, live.get(request.domain.as_str()));
        }
        let lease = targets.iter().any(|t| t.has(Algorithm::takes_lease)).then(new_lease);
        let mut hits = self.hits_of(request, &targets, how, lease.as_deref())?;
        let decided = self.decide_hits(&mut hits, now_us, domain, stats).await?;
        let answers = decided.iter().zip(&hits);
        let shaped = self.shape(request, &targets, (domain, how, now_us), answers)?;
        let overall = if shaped.over() && !self.settings.shadow_mode {
            stats.should_over_limit.increment(1);
            Code::OverLimit
        } else {
            stats.should_ok.increment(1);
            Code::Ok
        };
        Ok(Decision {
            overall,
            statuses: shaped.statuses,
            metadata: shaped.metadata,
            lease: lease.filter(|_| shaped.leased),
            queued: shaped.queued,
            lists: shaped.lists,
        })
    }

    /// The store's hit of each limited descriptor, in the mode `how` says (a check is a read-only peek, a report is
    /// counted whatever the limits say, a reservation is held) and holding `lease`. A reservation that a hit could
    /// not pay for is refused here, before anything is counted.
    fn hits_of(
        &self,
        request: &Request,
        targets: &[Target<'_>],
        how: How<'_>,
        lease: Option<&str>,
    ) -> Result<Vec<Hit>, LimitError> {
        let named = how.named();
        let mut hits = Vec::with_capacity(targets.len());
        for (index, (descriptor, target)) in request.descriptors.iter().zip(targets).enumerate() {
            if let Target::Limited { tiers, rule, shared } = target {
                let cost = how.cost(request, descriptor);
                let mut hit = self.hit(request, descriptor, (tiers, *rule, shared), cost, named);
                hit.lease = lease.map(str::to_string).unwrap_or_default();
                let reports = rule.is_some_and(|r| r.cost_reports);
                hit.mode = match how {
                    How::Check(_) => Mode::Peek,
                    How::Report(_) => Mode::Report,
                    How::Reserve { id, ttl_us, .. } => {
                        refuse_unpaid(&hit, index).inspect_err(|_| self.metrics.invalid_request(how.rpc()))?;
                        Mode::Reserve(ReservationSpec {
                            key: self.identity(&request.domain, descriptor, shared).reservation(id),
                            ttl_us,
                        })
                    }
                    // A rule of reported costs: a hit with a cost is a report, one without checks that one more
                    // unit is left.
                    How::Decide if reports && hit_costs(&hit) => Mode::Report,
                    How::Decide if reports => {
                        hit.cost = 1;
                        Mode::Peek
                    }
                    How::Decide => Mode::Hit,
                };
                hits.push(hit);
            }
        }
        Ok(hits)
    }

    /// Decides every hit: from the local over-limit cache when a denial still holds, otherwise by one store call
    /// for the rest. `None` where the store could not decide a hit and the domain's failure policy must answer for
    /// it alone (an `error` policy returns the failure instead).
    async fn decide_hits(
        &self,
        hits: &mut [Hit],
        now_us: u64,
        domain: Option<&Domain>,
        stats: &DomainStats,
    ) -> Result<Vec<Option<Outcome>>, LimitError> {
        let generation = self.guard.cache().generation();
        let mut decided: Vec<Option<Outcome>> = hits
            .iter()
            .map(|h| if h.peeks() { None } else { self.guard.cached(h, now_us) })
            .collect();
        let mut failed = None;
        // Hits, then peeks, each in a store call of their own.
        for as_peek in [false, true] {
            let pending: Vec<usize> = (0..hits.len())
                .filter(|&i| decided[i].is_none() && hits[i].peeks() == as_peek)
                .collect();
            if pending.is_empty() {
                continue;
            }
            // Lend the pending hits to the store call without copying them, then put them back.
            let mut sent: Vec<Hit> = pending.iter().map(|&i| std::mem::take(&mut hits[i])).collect();
            let answers = self.guard.call(now_us, &sent).await;
            for (&i, hit) in pending.iter().zip(sent.drain(..)) {
                hits[i] = hit;
            }
            for (&i, answer) in pending.iter().zip(answers) {
                match answer {
                    Ok(outcome) => {
                        if !as_peek {
                            self.guard.remember(&hits[i], &outcome, now_us, generation);
                        }
                        decided[i] = Some(outcome);
                    }
                    Err(e) => failed = Some(e),
                }
            }
        }
        match failed {
            Some(e) if self.policy(domain) == FailurePolicy::Error => {
                stats.should_unavailable.increment(1);
                Err(e.into())
            }
            _ => Ok(decided),
        }
    }

    /// Each descriptor's status, from its target and, for a limited one, its answer (the store's outcome, or `None`
    /// when the failure policy answers), its hit and whether a peek decided it.
    fn shape<'a>(
        &self,
        request: &Request,
        targets: &[Target<'_>],
        (domain, how, now_us): (Option<&Domain>, How<'_>, u64),
        mut answers: impl Iterator<Item = (&'a Option<Outcome>, &'a Hit)>,
    ) -> Result<Shaped, LimitError> {
        let mut shaped = Shaped {
            statuses: Vec::with_capacity(targets.len()),
            ..Shaped::default()
        };
        for (index, (descriptor, target)) in request.descriptors.iter().zip(targets).enumerate() {
            let status = match target {
                Target::NoRule => Status::NO_RULE,
                Target::Unlimited(_) => Status::UNLIMITED,
                Target::Listed(list) => self.listed_status(list, domain, &mut shaped),
                Target::Limited { tiers, rule, .. } => {
                    let Some((outcome, hit)) = answers.next() else {
                        return Err(StoreError::Other("store returned too few outcomes".into()).into());
                    };
                    let Some(outcome) = outcome else {
                        // The store failed and the domain's failure policy answers instead.
                        let status = self.fallback(domain, &tiers[0], *rule, &mut shaped);
                        shaped.statuses.push(status);
                        continue;
                    };
                    let answered = Answered {
                        index,
                        descriptor,
                        tiers,
                        rule: *rule,
                        hit,
                        outcome,
                        peek: hit.peeks(),
                    };
                    self.limited_status(&answered, (domain, how, now_us), &mut shaped)
                }
            };
            if self.settings.response_metadata && status.code == Code::Ok {
                if let Target::Limited { rule: Some(rule), .. } | Target::Unlimited(rule) = target {
                    shaped.metadata.extend(rule.metadata.clone());
                }
            }
            shaped.statuses.push(status);
        }
        Ok(shaped)
    }

    /// A descriptor a list matched: a deny list denies it, an allow list passes it. Each list is reported, and
    /// counted, once per request.
    fn listed_status(&self, list: &List, domain: Option<&Domain>, shaped: &mut Shaped) -> Status {
        if !shaped.lists.iter().any(|(_, name)| *name == list.name) {
            shaped.lists.push((list.action, list.name.clone()));
            if let Some(domain) = domain {
                self.metrics.listed(&domain.name, &list.name, list.action.name());
            }
        }
        if list.action == ListAction::Deny {
            shaped.over = true;
            Status::LISTED_DENY
        } else {
            Status::UNLIMITED
        }
    }

    /// The status that the domain's failure policy gives a descriptor the store could not decide (`first`: the
    /// first limit it matched).
    fn fallback(&self, domain: Option<&Domain>, first: &Tier, rule: Option<&Rule>, shaped: &mut Shaped) -> Status {
        let policy = self.policy(domain);
        self.metrics.fallback(policy.name());
        let status = fallback_status(policy, first, rule.is_some_and(|r| r.shadow_mode));
        shaped.tally(rule.is_some_and(|r| r.quota_mode), status.code);
        status
    }

    /// A limited descriptor's status from the store's outcome, its most constraining limit's; counts the outcome's
    /// metrics, and notes a queue entry or a lease the hit took.
    fn limited_status(
        &self,
        answered: &Answered<'_>,
        (domain, how, now_us): (Option<&Domain>, How<'_>, u64),
        shaped: &mut Shaped,
    ) -> Status {
        let Answered {
            index,
            tiers,
            rule,
            hit,
            outcome,
            peek,
            ..
        } = *answered;
        let shadow = rule.is_some_and(|r| r.shadow_mode);
        let (i, tier) = constraining(outcome);
        if hit.cost > 0 && !peek {
            self.record_outcome(answered, domain, now_us, (i, tier));
        }
        if let (Some(kind), Some(rule), Some(domain)) = (how.counted_kind(), rule, domain) {
            if outcome.admitted || hit.reports() {
                for (i, (spec, tier)) in hit.tiers.iter().zip(tiers.iter()).enumerate() {
                    let limit = tier.name.as_deref().map_or_else(|| i.to_string(), str::to_string);
                    let amount = spec.cost.unwrap_or(hit.cost);
                    self.metrics.cost(&domain.name, &rule.path, &limit, kind, amount);
                }
            }
        }
        for (spec, t) in hit.tiers.iter().zip(&outcome.tiers) {
            match &t.id {
                Some(id) if spec.algorithm.queues() => shaped.queued.push(Queued {
                    descriptor: index,
                    stream: spec.key.as_str().to_string(),
                    entry_id: id.clone(),
                }),
                Some(_) if spec.algorithm.takes_lease() => shaped.leased = true,
                _ => {}
            }
        }
        // A report is never refused.
        let code = if outcome.admitted || shadow || hit.reports() {
            Code::Ok
        } else {
            Code::OverLimit
        };
        shaped.tally(rule.is_some_and(|r| r.quota_mode), code);
        Status {
            code,
            limit: Some(AppliedLimit::from(&tiers[i])),
            remaining: if outcome.admitted || hit.reports() {
                u32::try_from(tier.remaining).unwrap_or(u32::MAX)
            } else {
                0
            },
            // Denied: the wait until this hit would pass (Envoy's `x-ratelimit-reset`, clients' back-off); a cost
            // that can never fit keeps the tier's reset time.
            reset_after_us: Some(match tier.retry_after_us {
                Some(retry) if !outcome.admitted => retry,
                _ => tier.reset_after_us,
            }),
        }
    }

    /// Counts a counted hit's outcome: in its rule's series and top offenders, and in its rule's counters (`i`,
    /// `tier`: the limit that decided it).
    fn record_outcome(
        &self,
        answered: &Answered<'_>,
        domain: Option<&Domain>,
        now_us: u64,
        (i, tier): (usize, &TierOutcome),
    ) {
        let Answered {
            descriptor,
            tiers,
            rule,
            hit,
            outcome,
            ..
        } = *answered;
        if let (Some(rule), Some(domain)) = (rule, domain) {
            let denied = !outcome.admitted && !hit.reports();
            let noted = if hit.reports() {
                Noted::Reported
            } else if denied {
                Noted::Denied
            } else {
                Noted::Allowed
            };
            self.outcomes.note(&domain.name, &rule.path, now_us, noted);
            if let kept @ 1.. = self.settings.top_offenders {
                self.offenders
                    .note(kept, &domain.name, &rule.path, &descriptor.entries, denied);
            }
        }
        self.rule_stats(domain, rule, descriptor).record(
            hit.cost,
            tiers[i].limit.capacity(),
            tier.used,
            outcome.admitted,
            rule.is_some_and(|r| r.shadow_mode),
            self.metrics.near_limit_ratio(),
        );
    }

    /// The failure policy of a domain: its own, or the server's default.
    fn policy(&self, domain: Option<&Domain>) -> FailurePolicy {
        domain
            .and_then(|d| d.failure_policy)
            .unwrap_or(self.settings.failure_policy)
    }

    /// The counters a hit is recorded in: the rule's own, the domain's override counters when the limit came from
    /// the request (whose entries may be anything, so they never reach a label), or, when the rule opts into request
    /// values in labels, counters registered for this request's label.
    fn rule_stats<'a>(
        &'a self,
        domain: Option<&'a Domain>,
        rule: Option<&'a Rule>,
        descriptor: &Descriptor,
    ) -> Cow<'a, RuleStats> {
        let Some(domain) = domain else {
            return Cow::Owned(self.metrics.rule_stats(UNKNOWN_DOMAIN, ""));
        };
        match rule {
            Some(rule) if !rule.dynamic_label => Cow::Borrowed(rule.stats(&self.metrics, &domain.name)),
            Some(_) => Cow::Owned(
                self.metrics
                    .rule_stats(&domain.name, &domain.detailed_label(&descriptor.entries)),
            ),
            None => Cow::Borrowed(&domain.override_stats),
        }
    }
}

/// How a request's hits are counted (see [`Core::decide`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum How<'a> {
    /// ShouldRateLimit: each hit counted when it fits.
    Decide,
    Check(&'a Costs),
    Report(&'a Costs),
    Reserve {
        costs: &'a Costs,
        id: &'a str,
        ttl_us: u64,
    },
}

impl How<'_> {
    /// The RPC name in metrics.
    pub(crate) fn rpc(self) -> &'static str {
        match self {
            How::Decide => "should_rate_limit",
            How::Check(_) => "check",
            How::Report(_) => "report",
            How::Reserve { .. } => "reserve",
        }
    }

    /// The kind of cost a counted hit adds to the cost metrics, for the cost-budget calls that count.
    pub(crate) fn counted_kind(self) -> Option<&'static str> {
        match self {
            How::Report(_) => Some("reported"),
            How::Reserve { .. } => Some("reserved"),
            How::Decide | How::Check(_) => None,
        }
    }

    pub(crate) fn named(&self) -> &[(String, u64)] {
        match self {
            How::Decide => &[],
            How::Check(c) | How::Report(c) | How::Reserve { costs: c, .. } => &c.named,
        }
    }

    /// A descriptor's cost: its own `hits_addend`, else Envoy's request-wide one (0 means 1) or the call's.
    pub(crate) fn cost(self, request: &Request, descriptor: &Descriptor) -> u64 {
        match self {
            How::Decide => request_cost(request, descriptor),
            How::Check(c) | How::Report(c) | How::Reserve { costs: c, .. } => descriptor.hits_addend.unwrap_or(c.cost),
        }
    }
}

/// Whether a hit costs anything to any of its limits.
pub(crate) fn hit_costs(hit: &Hit) -> bool {
    hit.tiers.iter().any(|t| t.cost.unwrap_or(hit.cost) > 0)
}

/// A limited descriptor and its answer.
#[derive(Clone, Copy)]
struct Answered<'a> {
    /// The descriptor's index in the request.
    index: usize,
    descriptor: &'a Descriptor,
    tiers: &'a [Tier],
    rule: Option<&'a Rule>,
    hit: &'a Hit,
    outcome: &'a Outcome,
    /// A read-only peek decided it (a check): nothing was counted.
    peek: bool,
}

/// The statuses of a request's descriptors as they are shaped, and what the decision gathers on the way.
#[derive(Default)]
struct Shaped {
    statuses: Vec<Status>,
    metadata: Vec<Arc<Metadata>>,
    queued: Vec<Queued>,
    /// A `concurrency` limit took the request's lease.
    leased: bool,
    /// A status decides the request over the limit.
    over: bool,
    /// The quota statuses, and how many of them are over the limit.
    quota_total: usize,
    quota_over: usize,
    lists: Vec<(ListAction, Arc<str>)>,
}

impl Shaped {
    /// Counts a status toward the request's code. A quota status reports OVER_LIMIT but decides the request only
    /// together with the others.
    fn tally(&mut self, quota: bool, code: Code) {
        if quota {
            self.quota_total += 1;
            self.quota_over += usize::from(code == Code::OverLimit);
        } else {
            self.over |= code == Code::OverLimit;
        }
    }

    /// Whether the request is over the limit: a status decides it, or every quota status is over.
    fn over(&self) -> bool {
        self.over || (self.quota_total > 0 && self.quota_over == self.quota_total)
    }
}

/// A reservation must be paid for when it is settled: refused up front when the descriptor's hit could hold
/// nothing (every limit it matches would count 0, so no record would be kept for Settle to charge), or when one of
/// its limits cannot hold a reservation at all (only the counting algorithms can).
fn refuse_unpaid(hit: &Hit, index: usize) -> Result<(), LimitError> {
    if let Some(t) = hit.tiers.iter().find(|t| !t.algorithm.counts()) {
        return Err(LimitError::InvalidArgument(format!(
            "descriptors[{index}]: a {} limit cannot hold a reservation (only fixed_window, sliding_window, \
             token_bucket and leaky_bucket can)",
            t.algorithm.name()
        )));
    }
    if !hit_costs(hit) {
        return Err(LimitError::InvalidArgument(format!(
            "estimate: descriptors[{index}] would hold 0 against every limit it matches; a reservation holds a \
             positive estimate (estimate, estimates or the descriptor's hits_addend), and a cost known only \
             afterwards is counted with Report"
        )));
    }
    Ok(())
}
