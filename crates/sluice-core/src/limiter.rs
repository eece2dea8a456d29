//! The decision core: `should_rate_limit(request) -> Decision` and the read-only `get_remaining`.
//!
//! It knows nothing of gRPC or Redis: requests arrive as plain types, counters go through the [`Store`] trait.
//! Per request it reads the clock once, loads the current rule set once (a reload swaps it atomically), matches
//! every descriptor, drops the rules that others `replace`, and sends every counter to the store in one call.

//!
//! Its parts: `request` (what a request is, and the checks it passes), `resolve` (which rule each descriptor
//! meets), `decision` (what the core answers), `settings` (the core's switches and caps), `guard` (the
//! breakers, local cache and timing around every store call), `global` (what is shared with the shipping of global
//! limits' counts to other regions), `usage` (RLQS usage charged to bucket quotas),
//! `wait` (calls held until their hit would pass), `lists` (what the lists hold at run time), `offenders`
//! (the values hit and denied most per rule) and `series` (outcomes per rule and second).

mod budget;
mod decision;
mod global;
mod guard;
mod lists;
mod offenders;
mod request;
mod resolve;
mod series;
mod settings;
mod usage;
mod wait;

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

pub use budget::{Costs, MAX_TRACKED, Reserved, SettledDescriptor};
use budget::{How, hit_costs};
use decision::fallback_status;
pub use decision::{AppliedLimit, Code, Decision, LimitError, Queued, QueuedWork, Report, ResetReport, Status};
pub use global::{LinkState, Regions};
use guard::{Guard, constraining};
pub use lists::{MAX_LIST_ENTRIES, MAX_LIST_VALUES_PER_CALL};
pub use offenders::{FLUSH_EVERY, RuleOffenders};
use request::validate;
pub use request::{Descriptor, Override, Request};
use resolve::{Target, listed, resolve};
pub use series::Series;
pub use settings::{Cap, Caps, LimiterSettings};
pub use usage::{Charged, Claim, QuotaState, TierState, Usage};
pub use wait::Waited;

use crate::breaker::Breakers;
use crate::cache::LocalCache;
use crate::clock::Clock;
use crate::metrics::{DomainStats, Metrics, RuleStats};
use crate::rules::{Algorithm, Domain, FailurePolicy, ListAction, Rule, RuleSet, Tier, TierCost};
use crate::store::{CounterKey, Hit, Outcome, RecordSpec, ReservationSpec, Store, StoreError, TierSpec};

/// The decision core over a store.
pub struct Limiter<S> {
    rules: ArcSwap<RuleSet>,
    /// The store, behind its breakers and the local cache.
    guard: Guard<S>,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    settings: LimiterSettings,
    /// The reservations made here and not yet seen settled, to count those that expire.
    reservations: std::sync::Mutex<budget::ReservationBook>,
    /// The calls waiting for a permit.
    waiters: wait::Waiters,
    /// What the lists hold at run time: fetched from their URLs, managed through the admin API.
    lists: lists::LiveState,
    /// The values hit and denied per rule since the last flush.
    offenders: offenders::Offenders,
    /// The outcomes per rule and second since the last flush.
    outcomes: series::Outcomes,
}

impl<S: Store> Limiter<S> {
    pub fn new(
        rules: RuleSet,
        store: S,
        clock: Arc<dyn Clock>,
        metrics: Metrics,
        settings: LimiterSettings,
    ) -> Limiter<S> {
        Limiter {
            rules: ArcSwap::from_pointee(rules),
            guard: Guard::new(
                store,
                Breakers::new(settings.breaker),
                LocalCache::new(settings.local_cache_size),
                metrics.clone(),
            ),
            clock,
            metrics,
            waiters: wait::Waiters::new(settings.max_waiters),
            settings,
            reservations: std::sync::Mutex::default(),
            lists: lists::LiveState::default(),
            offenders: offenders::Offenders::default(),
            outcomes: series::Outcomes::default(),
        }
    }

    pub fn store(&self) -> &S {
        self.guard.store()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn settings(&self) -> &LimiterSettings {
        &self.settings
    }

    /// How many notices from the instances sharing the store (this one included) the local cache has applied. A
    /// change announced elsewhere (a refund, a reset) is in force here once this has counted it.
    pub fn notices_heard(&self) -> u64 {
        self.guard.notices_heard()
    }

    /// How many denials the local cache holds now.
    pub fn cached_denials(&self) -> usize {
        self.guard.cache().len()
    }

    /// Makes this instance one region of several: its global limits count what the other regions shipped, and the
    /// windows it counts in are noted in `regions`, for shipping. Once; a second call changes nothing.
    pub fn join_regions(&self, regions: Arc<Regions>) {
        self.guard.join_regions(regions);
    }

    /// One line per other region for `/readyz`: linked or not, and what waits for it.
    pub fn region_lines(&self) -> Vec<String> {
        self.guard
            .regions()
            .map(|r| r.links().iter().map(|l| l.line()).collect())
            .unwrap_or_default()
    }

    /// The time by the limiter's clock, in microseconds since the Unix epoch.
    pub fn now_us(&self) -> u64 {
        self.clock.now_us()
    }

    /// The limiter's clock.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// The rule set in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    /// Replaces the rule set; requests already running finish with the old one.
    pub fn reload(&self, rules: RuleSet) {
        self.rules.store(Arc::new(rules));
        // A denial cached under the old limits may not hold under the new ones.
        self.guard.cache().clear();
    }

    /// Decides a request, counting each descriptor's hit against its limits.
    pub async fn should_rate_limit(&self, request: &Request) -> Result<Decision, LimitError> {
        self.decide(request, How::Decide).await
    }

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
            let live = self.lists.load();
            listed(domain, request, &mut targets, live.get(request.domain.as_str()));
        }
        let lease = targets.iter().any(|t| t.has(Algorithm::Concurrency)).then(new_lease);
        let named = how.named();

        let mut hits = Vec::with_capacity(targets.len());
        // Per hit: decided by a read-only peek (a check) rather than counted.
        let mut peeks = Vec::with_capacity(targets.len());
        for (index, (descriptor, target)) in request.descriptors.iter().zip(&targets).enumerate() {
            if let Target::Limited { tiers, rule, shared } = target {
                let capacity = tiers.iter().map(|t| u64::from(t.limit.capacity())).max().unwrap_or(0);
                let cost = how.cost(request, descriptor).min(capacity + 1);
                let mut hit = self.hit(request, descriptor, (tiers, *rule, shared), cost, named);
                hit.lease = lease.clone().unwrap_or_default();
                let reports = rule.is_some_and(|r| r.cost_reports);
                let peek = match how {
                    How::Check(_) => true,
                    How::Report(_) => {
                        hit.force = true;
                        false
                    }
                    How::Reserve { id, ttl_us, .. } => {
                        refuse_unpaid(&hit, index).inspect_err(|_| self.metrics.invalid_request(how.rpc()))?;
                        hit.reservation = Some(ReservationSpec {
                            key: self.identity(&request.domain, descriptor, shared).reservation(id),
                            ttl_us,
                        });
                        false
                    }
                    // A rule of reported costs: a hit with a cost is a report, one without checks that one more
                    // unit is left.
                    How::Decide if reports && hit_costs(&hit) => {
                        hit.force = true;
                        false
                    }
                    How::Decide if reports => {
                        hit.cost = 1;
                        true
                    }
                    How::Decide => false,
                };
                hits.push(hit);
                peeks.push(peek);
            }
        }
        let decided = self.decide_hits(&mut hits, &peeks, now_us, domain, stats).await?;

        let ratio = self.metrics.near_limit_ratio();
        let mut outcomes = decided.iter().zip(&hits).zip(&peeks);
        let mut statuses = Vec::with_capacity(targets.len());
        let mut metadata = Vec::new();
        let mut queued = Vec::new();
        let mut leased = false;
        let (mut over, mut quota_total, mut quota_over) = (false, 0usize, 0usize);
        let mut lists: Vec<(ListAction, Arc<str>)> = Vec::new();
        for (index, (descriptor, target)) in request.descriptors.iter().zip(&targets).enumerate() {
            let status = match target {
                Target::NoRule => Status::NO_RULE,
                Target::Unlimited(_) => Status::UNLIMITED,
                Target::Listed(list) => {
                    if !lists.iter().any(|(_, name)| *name == list.name) {
                        lists.push((list.action, list.name.clone()));
                        if let Some(domain) = domain {
                            self.metrics.listed(&domain.name, &list.name, list.action.name());
                        }
                    }
                    if list.action == ListAction::Deny {
                        over = true;
                        Status::LISTED_DENY
                    } else {
                        Status::UNLIMITED
                    }
                }
                Target::Limited { tiers, rule, .. } => {
                    let Some(((outcome, hit), &peek)) = outcomes.next() else {
                        return Err(StoreError::Other("store returned too few outcomes".into()).into());
                    };
                    let shadow = rule.is_some_and(|r| r.shadow_mode);
                    let Some(outcome) = outcome else {
                        // The store failed and the domain's failure policy answers instead.
                        let policy = self.policy(domain);
                        self.metrics.fallback(policy.name());
                        let status = fallback_status(policy, &tiers[0], shadow);
                        if rule.is_some_and(|r| r.quota_mode) {
                            quota_total += 1;
                            quota_over += usize::from(status.code == Code::OverLimit);
                        } else {
                            over |= status.code == Code::OverLimit;
                        }
                        statuses.push(status);
                        continue;
                    };
                    let (i, tier) = constraining(outcome);
                    if hit.cost > 0 && !peek {
                        if let (Some(rule), Some(domain)) = (rule, domain) {
                            let denied = !outcome.admitted && !hit.force;
                            self.outcomes.note(&domain.name, &rule.path, now_us, denied);
                            if let kept @ 1.. = self.settings.top_offenders {
                                self.offenders
                                    .note(kept, &domain.name, &rule.path, &descriptor.entries, denied);
                            }
                        }
                        self.rule_stats(domain, *rule, descriptor).record(
                            hit.cost,
                            tiers[i].limit.capacity(),
                            tier.used,
                            outcome.admitted,
                            shadow,
                            ratio,
                        );
                    }
                    if let (Some(kind), Some(rule), Some(domain)) = (how.counted_kind(), rule, domain) {
                        if outcome.admitted || hit.force {
                            for (i, (spec, tier)) in hit.tiers.iter().zip(tiers.iter()).enumerate() {
                                let limit = tier.name.as_deref().map_or_else(|| i.to_string(), str::to_string);
                                let amount = spec.cost.unwrap_or(hit.cost);
                                self.metrics.cost(&domain.name, &rule.path, &limit, kind, amount);
                            }
                        }
                    }
                    for (spec, t) in hit.tiers.iter().zip(&outcome.tiers) {
                        match (spec.algorithm, &t.id) {
                            (Algorithm::Queue, Some(id)) => queued.push(Queued {
                                descriptor: index,
                                stream: spec.key.as_str().to_string(),
                                entry_id: id.clone(),
                            }),
                            (Algorithm::Concurrency, Some(_)) => leased = true,
                            _ => {}
                        }
                    }
                    // A report is never refused.
                    let code = if outcome.admitted || shadow || hit.force {
                        Code::Ok
                    } else {
                        Code::OverLimit
                    };
                    if rule.is_some_and(|r| r.quota_mode) {
                        // A quota status reports OVER_LIMIT but decides the request only together with the others.
                        quota_total += 1;
                        quota_over += usize::from(code == Code::OverLimit);
                    } else {
                        over |= code == Code::OverLimit;
                    }
                    Status {
                        code,
                        limit: Some(AppliedLimit::from(&tiers[i])),
                        remaining: if outcome.admitted || hit.force {
                            u32::try_from(tier.remaining).unwrap_or(u32::MAX)
                        } else {
                            0
                        },
                        // Denied: the wait until this hit would pass (Envoy's `x-ratelimit-reset`, clients' back-off);
                        // a cost that can never fit keeps the tier's reset time.
                        reset_after_us: Some(match tier.retry_after_us {
                            Some(retry) if !outcome.admitted => retry,
                            _ => tier.reset_after_us,
                        }),
                    }
                }
            };
            if self.settings.response_metadata && status.code == Code::Ok {
                if let Target::Limited { rule: Some(rule), .. } | Target::Unlimited(rule) = target {
                    metadata.extend(rule.metadata.clone());
                }
            }
            statuses.push(status);
        }
        over |= quota_total > 0 && quota_over == quota_total;
        let overall = if over && !self.settings.shadow_mode {
            stats.should_over_limit.increment(1);
            Code::OverLimit
        } else {
            stats.should_ok.increment(1);
            Code::Ok
        };
        Ok(Decision {
            overall,
            statuses,
            metadata,
            lease: lease.filter(|_| leased),
            queued,
            lists,
        })
    }

    /// Decides every hit: from the local over-limit cache when a denial still holds, otherwise by one store call
    /// for the rest. `None` where the store could not decide a hit and the domain's failure policy must answer for
    /// it alone (an `error` policy returns the failure instead).
    async fn decide_hits(
        &self,
        hits: &mut [Hit],
        peeks: &[bool],
        now_us: u64,
        domain: Option<&Domain>,
        stats: &DomainStats,
    ) -> Result<Vec<Option<Outcome>>, LimitError> {
        let generation = self.guard.cache().generation();
        let mut decided: Vec<Option<Outcome>> = hits
            .iter()
            .zip(peeks)
            .map(|(h, &peek)| if peek { None } else { self.guard.cached(h, now_us) })
            .collect();
        let mut failed = None;
        for (op, as_peek) in [("hit", false), ("peek", true)] {
            let pending: Vec<usize> = (0..hits.len())
                .filter(|&i| decided[i].is_none() && peeks[i] == as_peek)
                .collect();
            if pending.is_empty() {
                continue;
            }
            // Lend the pending hits to the store call without copying them, then put them back.
            let mut sent: Vec<Hit> = pending.iter().map(|&i| std::mem::take(&mut hits[i])).collect();
            let answers = self.guard.call(op, now_us, &sent).await;
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

    /// Whether decisions can reach the store now: it answers a ping and no failure domain's breaker is open.
    pub async fn ready(&self) -> Result<(), StoreError> {
        self.guard.ready(self.clock.now_us()).await
    }

    /// The failure policy of a domain: its own, or the server's default.
    fn policy(&self, domain: Option<&Domain>) -> FailurePolicy {
        domain
            .and_then(|d| d.failure_policy)
            .unwrap_or(self.settings.failure_policy)
    }

    /// Reports each descriptor's most constrained limit, what is left of it, and when a hit of `cost` would pass
    /// every limit. Read-only.
    pub async fn get_remaining(&self, request: &Request, cost: u64) -> Result<Vec<Report>, LimitError> {
        validate(request, &self.settings.caps).inspect_err(|_| self.metrics.invalid_request("get_remaining"))?;
        let now_us = self.clock.now_us();
        let rules = self.rules.load();
        let domain = rules.domain(&request.domain);
        let stats = self.domain_stats(domain);
        let targets = resolve(domain, request);
        let hits: Vec<Hit> = request
            .descriptors
            .iter()
            .zip(&targets)
            .filter_map(|(descriptor, target)| match target {
                Target::Limited { tiers, rule, shared } => {
                    let capacity = tiers.iter().map(|t| u64::from(t.limit.capacity())).max().unwrap_or(0);
                    Some(self.hit(request, descriptor, (tiers, *rule, shared), cost.min(capacity + 1), &[]))
                }
                _ => None,
            })
            .collect();
        let outcomes: Result<Vec<Outcome>, StoreError> = if hits.is_empty() {
            Ok(Vec::new())
        } else {
            self.guard.call("peek", now_us, &hits).await.into_iter().collect()
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

    /// Ends `lease` in every `concurrency` limit the request's descriptors map to; returns how many leases ended.
    pub async fn release(&self, request: &Request, lease: &str) -> Result<u64, LimitError> {
        validate(request, &self.settings.caps).inspect_err(|_| self.metrics.invalid_request("release"))?;
        if lease.is_empty() {
            self.metrics.invalid_request("release");
            return Err(LimitError::InvalidArgument("lease_id is empty".into()));
        }
        if lease.len() > self.settings.caps.max_value_bytes {
            self.metrics.invalid_request("release");
            return Err(LimitError::OverCap {
                cap: Cap::ValueBytes,
                message: format!(
                    "lease_id is {} bytes, over the cap of {}",
                    lease.len(),
                    self.settings.caps.max_value_bytes
                ),
            });
        }
        let keys = self.keys(request, |t| t.limit.algorithm == Algorithm::Concurrency, false);
        Ok(self.guard.store().release(&keys, lease).await?)
    }

    /// Deletes the state of exactly the limits (and hit records) the request's descriptors map to. A `queue`
    /// limit's stream that still holds entries is work waiting for a worker: it is kept, and named in the report,
    /// unless `queued` says to drop it.
    pub async fn reset(&self, request: &Request, queued: QueuedWork) -> Result<ResetReport, LimitError> {
        validate(request, &self.settings.caps).inspect_err(|_| self.metrics.invalid_request("reset"))?;
        let keep_streams = queued == QueuedWork::Keep;
        let is_stream = |t: &Tier| keep_streams && t.limit.algorithm == Algorithm::Queue;
        let keys = self.keys(request, |t| !is_stream(t), true);
        let streams = self.keys(request, is_stream, false);
        let deleted = self.guard.store().reset(&keys).await;
        // Freed once the counters are gone (or may be, when the call failed): a denial decided before is dropped,
        // and one decided across the reset is never stored (freeing moves the cache's generation on).
        self.guard
            .freed(keys.iter().chain(&streams).map(|k| String::from(k.clone())).collect())
            .await;
        let deleted = deleted?;
        let streams = if streams.is_empty() {
            crate::store::StreamReset::default()
        } else {
            self.guard
                .store()
                .reset_idle_streams(self.clock.now_us(), &streams)
                .await?
        };
        Ok(ResetReport {
            deleted: deleted + streams.deleted,
            kept_streams: streams.kept.iter().map(|k| k.as_str().to_string()).collect(),
        })
    }

    /// The keys of the matched limits that `select` picks, and of the hit records when `records`. A fixed or sliding
    /// window's counter in Redis is a key per window ([`CounterKey::window`]): the keys of this window and the next
    /// (the store may decide by its own clock, a little ahead of this one), and a sliding window's previous one, come
    /// with it, as does the counter's own key, which the memory store and the previous form of the Redis counter use.
    fn keys(&self, request: &Request, select: impl Fn(&Tier) -> bool, records: bool) -> Vec<CounterKey> {
        let rules = self.rules.load();
        let targets = resolve(rules.domain(&request.domain), request);
        let now_us = self.clock.now_us();
        let mut keys = Vec::new();
        for (descriptor, target) in request.descriptors.iter().zip(&targets) {
            if let Target::Limited { tiers, rule, shared } = target {
                let id = self.identity(&request.domain, descriptor, shared);
                for tier in tiers.iter().filter(|t| select(t)) {
                    let key = tier_key(&id, tier);
                    let window = tier.limit.window_us();
                    if window > 0 {
                        let start = now_us - now_us % window;
                        // The next window too: the store's clock may already be in it. A sliding window reads the
                        // previous one's count as well; a fixed window never reads it again.
                        let windows: &[u64] = match tier.limit.algorithm {
                            Algorithm::FixedWindow => &[start, start.saturating_add(window)],
                            Algorithm::SlidingWindow => {
                                &[start.saturating_sub(window), start, start.saturating_add(window)]
                            }
                            _ => &[],
                        };
                        keys.extend(windows.iter().map(|&s| key.window(s)));
                    }
                    keys.push(key);
                }
                if records && rule.is_some_and(|r| r.record.is_some()) {
                    keys.push(id.records());
                }
            }
        }
        keys
    }

    fn identity(&self, domain: &str, descriptor: &Descriptor, shared: &[(usize, &str)]) -> crate::store::Identity {
        identity_of(
            CounterKey::builder(&self.settings.key_prefix, domain),
            &descriptor.entries,
            shared,
        )
    }

    /// The store's hit for one descriptor and the limits it matched (`tiers`, `rule`, `shared` levels), of `cost`
    /// (and `named` costs for limits that count one).
    fn hit(
        &self,
        request: &Request,
        descriptor: &Descriptor,
        (tiers, rule, shared): (&[Tier], Option<&Rule>, &[(usize, &str)]),
        cost: u64,
        named: &[(String, u64)],
    ) -> Hit {
        let id = self.identity(&request.domain, descriptor, shared);
        let queue = tiers.iter().any(|t| t.limit.algorithm == Algorithm::Queue);
        let regions = self.guard.regions().is_some();
        let record = rule.and_then(|r| r.record.as_ref()).map(|record| RecordSpec {
            key: id.records(),
            size: record.size,
            // The recorded entry may sit in this descriptor or in another one of the same request.
            value: std::iter::once(descriptor)
                .chain(&request.descriptors)
                .flat_map(|d| &d.entries)
                .find(|(k, _)| **k == *record.key)
                .map(|(_, v)| v.clone()),
        });
        Hit {
            tiers: tiers
                .iter()
                .map(|t| TierSpec {
                    key: tier_key(&id, t),
                    algorithm: t.limit.algorithm,
                    limit: u64::from(t.limit.requests),
                    window_us: t.limit.window_us(),
                    burst: u64::from(t.limit.burst),
                    cost: match t.cost {
                        TierCost::Request => None,
                        ref other => Some(other.of(cost, named)),
                    },
                    // Without other regions a global limit is an ordinary one (and keeps the compact calls).
                    global: t.global && regions,
                })
                .collect(),
            cost,
            lease: String::new(),
            fields: if queue { descriptor.entries.clone() } else { Vec::new() },
            record,
            force: false,
            reservation: None,
        }
    }

    fn domain_stats<'a>(&'a self, domain: Option<&'a Domain>) -> &'a DomainStats {
        domain.map_or(self.metrics.unknown_domain(), |d| &d.stats)
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
            return Cow::Owned(self.metrics.rule_stats(crate::metrics::UNKNOWN_DOMAIN, ""));
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

/// The identity of `entries` after `key`'s start: each entry's value, or the `share_threshold` pattern at the levels
/// in `shared`.
fn identity_of(
    mut key: crate::store::KeyBuilder,
    entries: &[(String, String)],
    shared: &[(usize, &str)],
) -> crate::store::Identity {
    for (depth, (k, v)) in entries.iter().enumerate() {
        let value = shared
            .iter()
            .find(|(d, _)| *d == depth)
            .map_or(v.as_str(), |(_, pattern)| pattern);
        key = key.entry(k, value);
    }
    key.finish()
}

/// The counter key of one limit of a descriptor.
fn tier_key(id: &crate::store::Identity, tier: &Tier) -> CounterKey {
    match tier.cost.label() {
        None => id.tier(tier.limit.algorithm, tier.limit.window_us()),
        Some(label) => id.tier_costing(tier.limit.algorithm, tier.limit.window_us(), &label),
    }
}

/// A lease id unique across processes and time: 128 bits from the process's random hasher keys, a counter and the
/// clock. Not a secret: releasing needs the descriptors too.
pub(crate) fn new_lease() -> String {
    use std::hash::{BuildHasher, RandomState};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    thread_local!(static STATE: RandomState = RandomState::new());
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let (a, b) = STATE.with(|s| (s.hash_one((seq, nanos, 1u8)), s.hash_one((seq, nanos, 2u8))));
    format!("{a:016x}{b:016x}")
}

/// A reservation must be paid for when it is settled: refused up front when the descriptor's hit could hold
/// nothing (every limit it matches would count 0, so no record would be kept for Settle to charge), or when one of
/// its limits cannot hold a reservation at all (only the counting algorithms can).
fn refuse_unpaid(hit: &Hit, index: usize) -> Result<(), LimitError> {
    if let Some(t) = hit.tiers.iter().find(|t| {
        !matches!(
            t.algorithm,
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::TokenBucket | Algorithm::LeakyBucket
        )
    }) {
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
