//! The decision core: `should_rate_limit(request) -> Decision` and the read-only `get_remaining`.
//!
//! It knows nothing of gRPC or Redis: requests arrive as plain types, counters go through the [`Store`] trait.
//! Per request it reads the clock once, loads the current rule set once (a reload swaps it atomically), matches
//! every descriptor, drops the rules that others `replace`, and sends every counter to the store in one call.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use tracing::Instrument;

use crate::breaker::{BreakerSettings, Breakers};
use crate::cache::{Denial, LocalCache};
use crate::clock::Clock;
use crate::metrics::{DomainStats, Metrics, RuleStats};
use crate::rules::{Algorithm, Domain, FailurePolicy, Limit, Rule, RuleSet, Tier, Unit};
use crate::store::{Answers, CounterKey, Hit, Outcome, RecordSpec, Store, StoreError, TierOutcome, TierSpec};

/// A rate limit request, as Envoy sends it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    pub domain: String,
    pub descriptors: Vec<Descriptor>,
    /// The cost of each descriptor's hit; 0 means 1.
    pub hits_addend: u32,
}

/// One descriptor of a request: ordered entries, an optional limit override and an optional own cost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    pub entries: Vec<(String, String)>,
    pub limit_override: Option<Override>,
    /// Overrides the request's `hits_addend`; `Some(0)` checks without consuming.
    pub hits_addend: Option<u64>,
}

/// A `RateLimitOverride` as received: `unit` is the raw `envoy.type.v3.RateLimitUnit` number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Override {
    pub requests_per_unit: u32,
    pub unit: i32,
}

/// The answer for a request or a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// The limit a status reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedLimit {
    pub limit: Limit,
    pub name: Option<Arc<str>>,
}

impl From<&Tier> for AppliedLimit {
    fn from(tier: &Tier) -> Self {
        AppliedLimit {
            limit: tier.limit,
            name: tier.name.clone(),
        }
    }
}

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    /// Set whenever a finite limit applied.
    pub limit: Option<AppliedLimit>,
    /// Hits left in the window; `u32::MAX` for an unlimited rule, 0 when no rule applied.
    pub remaining: u32,
    /// In microseconds, set whenever a finite limit applied: for an admitted hit, the time until the counter resets
    /// (is full again); for a denied one, the wait until the same hit would be admitted (the time until the
    /// counter resets when the cost can never fit).
    pub reset_after_us: Option<u64>,
}

impl Status {
    const NO_RULE: Status = Status {
        code: Code::Ok,
        limit: None,
        remaining: 0,
        reset_after_us: None,
    };
    const UNLIMITED: Status = Status {
        code: Code::Ok,
        limit: None,
        remaining: u32::MAX,
        reset_after_us: None,
    };
}

/// The answer for a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub overall: Code,
    /// One per request descriptor, in order.
    pub statuses: Vec<Status>,
    /// The `metadata` of the rules whose descriptors passed, when response metadata is on.
    pub metadata: Vec<Arc<crate::rules::Metadata>>,
    /// The lease this request holds in `concurrency` limits, to hand back with `Release`.
    pub lease: Option<String>,
    /// The entries this request appended to `queue` limits.
    pub queued: Vec<Queued>,
}

/// An entry appended to a `queue` limit's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    /// The request descriptor's index.
    pub descriptor: usize,
    /// The stream's key, where workers read.
    pub stream: String,
    pub entry_id: String,
}

/// What GetRemaining reports for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    NoRule,
    Unlimited,
    Limited {
        /// The most constrained limit.
        limit: AppliedLimit,
        /// What is left of it now.
        remaining: u64,
        /// Time until it is full again, in microseconds.
        reset_after_us: u64,
        /// Time until a hit of the asked cost fits every limit; `None`: never.
        retry_after_us: Option<u64>,
        /// Recorded entry values, newest first (`record`).
        records: Vec<String>,
    },
}

/// What Reset does with a `queue` limit's stream that still holds entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueuedWork {
    /// Keep the stream and report it: workers may still be due to process its entries.
    Keep,
    /// Delete it with the rest, abandoning the waiting entries.
    Drop,
}

/// What a Reset did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResetReport {
    /// Stored states that existed and were deleted.
    pub deleted: u64,
    /// The `queue` streams kept because entries still wait in them.
    pub kept_streams: Vec<String>,
}

/// Why a request got no decision.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The request itself is malformed; the message names what is wrong.
    #[error("{0}")]
    InvalidArgument(String),
    /// The request exceeds one of the [`Caps`]; the message names the field and says by how much, and `cap` which
    /// setting bounds it (a face names it as its users set it: the service, by its flag).
    #[error("{message} ({})", cap.setting())]
    OverCap { cap: Cap, message: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Switches of the decision core.
#[derive(Debug, Clone)]
pub struct LimiterSettings {
    /// Prefix of every counter key (no `{` or `}`).
    pub key_prefix: String,
    /// Global shadow mode: an overall OVER_LIMIT is answered OK; statuses keep OVER_LIMIT.
    pub shadow_mode: bool,
    /// Merge the `metadata` of passing rules into the response.
    pub response_metadata: bool,
    /// What to answer when the store fails, for domains that do not say.
    pub failure_policy: FailurePolicy,
    pub breaker: BreakerSettings,
    /// Denials remembered locally (0: none).
    pub local_cache_size: usize,
    pub caps: Caps,
}

/// One of the [`Caps`], as an over-cap error names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    Descriptors,
    Entries,
    ValueBytes,
    RequestBytes,
}

impl Cap {
    /// The name of the [`Caps`] field that sets it.
    pub fn setting(self) -> &'static str {
        match self {
            Cap::Descriptors => "max_descriptors",
            Cap::Entries => "max_entries",
            Cap::ValueBytes => "max_value_bytes",
            Cap::RequestBytes => "max_request_bytes",
        }
    }
}

/// Bounds on a request, each refused with INVALID_ARGUMENT naming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub max_descriptors: usize,
    pub max_entries: usize,
    /// Bytes of one entry key or value (and of the domain).
    pub max_value_bytes: usize,
    /// Bytes of one encoded request (checked by the API, which sees the encoding).
    pub max_request_bytes: usize,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            max_descriptors: 64,
            max_entries: 32,
            max_value_bytes: 4_096,
            max_request_bytes: 65_536,
        }
    }
}

impl Default for LimiterSettings {
    fn default() -> Self {
        LimiterSettings {
            key_prefix: "sluice:".to_string(),
            shadow_mode: false,
            response_metadata: false,
            failure_policy: FailurePolicy::Error,
            breaker: BreakerSettings::default(),
            local_cache_size: 100_000,
            caps: Caps::default(),
        }
    }
}

/// The decision core over a store.
pub struct Limiter<S> {
    rules: ArcSwap<RuleSet>,
    store: S,
    /// Store call latency, registered once: hits and peeks.
    latency: [metrics::Histogram; 2],
    breakers: Breakers,
    cache: LocalCache,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    settings: LimiterSettings,
}

/// What one request descriptor resolved to.
enum Target<'a> {
    NoRule,
    Unlimited(&'a Rule),
    Limited {
        tiers: Cow<'a, [Tier]>,
        rule: Option<&'a Rule>,
        shared: Vec<(usize, &'a str)>,
    },
}

impl Target<'_> {
    fn has(&self, algorithm: Algorithm) -> bool {
        matches!(self, Target::Limited { tiers, .. } if tiers.iter().any(|t| t.limit.algorithm == algorithm))
    }
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
            latency: [
                metrics.store_histogram(store.name(), "hit"),
                metrics.store_histogram(store.name(), "peek"),
            ],
            store,
            breakers: Breakers::new(settings.breaker),
            cache: LocalCache::new(settings.local_cache_size),
            clock,
            metrics,
            settings,
        }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn settings(&self) -> &LimiterSettings {
        &self.settings
    }

    /// The rule set in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    /// Replaces the rule set; requests already running finish with the old one.
    pub fn reload(&self, rules: RuleSet) {
        self.rules.store(Arc::new(rules));
        // A denial cached under the old limits may not hold under the new ones.
        self.cache.clear();
    }

    /// Decides a request, counting each descriptor's hit against its limits.
    pub async fn should_rate_limit(&self, request: &Request) -> Result<Decision, LimitError> {
        validate(request, &self.settings.caps).inspect_err(|_| self.metrics.invalid_request("should_rate_limit"))?;
        let now_us = self.clock.now_us();
        let rules = self.rules.load();
        let domain = rules.domain(&request.domain);
        let stats = self.domain_stats(domain);
        let targets = resolve(domain, request);
        let lease = targets.iter().any(|t| t.has(Algorithm::Concurrency)).then(new_lease);

        let mut hits = Vec::with_capacity(targets.len());
        for (descriptor, target) in request.descriptors.iter().zip(&targets) {
            if let Target::Limited { tiers, rule, shared } = target {
                let capacity = tiers.iter().map(|t| u64::from(t.limit.capacity())).max().unwrap_or(0);
                let cost = cost(request, descriptor).min(capacity + 1);
                let mut hit = self.hit(request, descriptor, tiers, *rule, shared, cost);
                hit.lease = lease.clone().unwrap_or_default();
                hits.push(hit);
            }
        }
        let decided = self.decide_hits(&mut hits, now_us, domain, stats).await?;

        let ratio = self.metrics.near_limit_ratio();
        let mut outcomes = decided.iter().zip(&hits);
        let mut statuses = Vec::with_capacity(targets.len());
        let mut metadata = Vec::new();
        let mut queued = Vec::new();
        let mut leased = false;
        let (mut over, mut quota_total, mut quota_over) = (false, 0usize, 0usize);
        for (index, (descriptor, target)) in request.descriptors.iter().zip(&targets).enumerate() {
            let status = match target {
                Target::NoRule => Status::NO_RULE,
                Target::Unlimited(_) => Status::UNLIMITED,
                Target::Limited { tiers, rule, .. } => {
                    let Some((outcome, hit)) = outcomes.next() else {
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
                    if hit.cost > 0 {
                        self.rule_stats(domain, *rule, descriptor).record(
                            hit.cost,
                            tiers[i].limit.capacity(),
                            tier.used,
                            outcome.admitted,
                            shadow,
                            ratio,
                        );
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
                    let code = if outcome.admitted || shadow {
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
                        remaining: if outcome.admitted {
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
        })
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
        let generation = self.cache.generation();
        let mut decided: Vec<Option<Outcome>> = hits.iter().map(|h| self.cached(h, now_us)).collect();
        let pending: Vec<usize> = (0..hits.len()).filter(|&i| decided[i].is_none()).collect();
        if pending.is_empty() {
            return Ok(decided);
        }
        // Lend the pending hits to the store call without copying them, then put them back.
        let mut sent: Vec<Hit> = pending.iter().map(|&i| std::mem::take(&mut hits[i])).collect();
        let answers = self.store_call("hit", now_us, &sent).await;
        for (&i, hit) in pending.iter().zip(sent.drain(..)) {
            hits[i] = hit;
        }
        let mut failed = None;
        for (&i, answer) in pending.iter().zip(answers) {
            match answer {
                Ok(outcome) => {
                    self.remember(&hits[i], &outcome, now_us, generation);
                    decided[i] = Some(outcome);
                }
                Err(e) => failed = Some(e),
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

    /// One store call behind the circuit breakers of the hits' failure domains: the hits of a domain whose breaker
    /// is open are refused at once, the others go to the store together, and each domain's breaker then learns
    /// whether its server answered. One answer per hit, in order.
    async fn store_call(&self, op: &'static str, now_us: u64, hits: &[Hit]) -> Answers {
        let domains: Vec<u64> = hits.iter().map(|h| self.store.failure_domain(h)).collect();
        let mut breakers = Vec::with_capacity(1);
        for &d in &domains {
            if !breakers.iter().any(|(known, _)| *known == d) {
                breakers.push((d, self.breakers.get(d)));
            }
        }
        // Passes are dropped unrecorded if this future is: an abandoned probe frees its slot (see `breaker`).
        let passes: Vec<_> = breakers.iter().map(|(d, b)| (*d, b.allow(now_us))).collect();
        let allowed = |d: u64| passes.iter().any(|(known, pass)| *known == d && pass.is_some());
        let refused = || Err(StoreError::Connection("circuit breaker open".into()));
        let answers = if domains.iter().all(|&d| allowed(d)) {
            self.timed_call(op, now_us, hits).await
        } else {
            let open: Vec<Hit> = hits
                .iter()
                .zip(&domains)
                .filter(|(_, d)| allowed(**d))
                .map(|(h, _)| h.clone())
                .collect();
            let mut answers = if open.is_empty() {
                Vec::new()
            } else {
                self.timed_call(op, now_us, &open).await
            }
            .into_iter();
            domains
                .iter()
                .map(|&d| {
                    if allowed(d) {
                        answers.next().unwrap_or_else(refused)
                    } else {
                        refused()
                    }
                })
                .collect()
        };
        for (d, pass) in passes {
            if let Some(pass) = pass {
                let reached = domains
                    .iter()
                    .zip(&answers)
                    .filter(|(known, _)| **known == d)
                    .all(|(_, a)| a.as_ref().err().is_none_or(|e| !e.is_unreachable()));
                pass.record(reached, now_us);
            }
        }
        self.metrics.breaker_state(self.breakers.state(now_us) as u8);
        answers
    }

    /// The store call itself, timed, its errors counted and logged.
    async fn timed_call(&self, op: &'static str, now_us: u64, hits: &[Hit]) -> Answers {
        let started = std::time::Instant::now();
        let (store, descriptors) = (self.store.name(), hits.len());
        // The store's future is boxed: moved by value through this state machine it cost a large memmove per call.
        let answers = match op {
            "peek" => {
                let span = tracing::debug_span!("store.peek", store, descriptors);
                Box::pin(self.store.peek(now_us, hits)).instrument(span).await
            }
            _ => {
                let span = tracing::debug_span!("store.hit", store, descriptors);
                Box::pin(self.store.hit(now_us, hits)).instrument(span).await
            }
        };
        let mut answers = answers;
        answers.resize_with(hits.len(), || {
            Err(StoreError::Other("store returned too few outcomes".into()))
        });
        self.record_store_call(op, started, answers.iter().find_map(|a| a.as_ref().err()));
        answers
    }

    /// Whether decisions can reach the store now: it answers a ping and no failure domain's breaker is open.
    pub async fn ready(&self) -> Result<(), StoreError> {
        self.store.ping().await?;
        match self.breakers.state(self.clock.now_us()) {
            crate::breaker::State::Open => Err(StoreError::Connection("circuit breaker open".into())),
            _ => Ok(()),
        }
    }

    /// A denial from the local cache, as the outcome the store gave.
    fn cached(&self, hit: &Hit, now_us: u64) -> Option<Outcome> {
        let first = hit.tiers.first()?;
        let denial = self
            .cache
            .get(first.key.as_str(), limits_fingerprint(hit), hit.cost, now_us)?;
        self.metrics.local_cache_hit();
        let tiers = hit
            .tiers
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let denying = i == denial.tier;
                TierOutcome {
                    ok: !denying,
                    used: if denying { t.limit.saturating_add(hit.cost) } else { 0 },
                    remaining: 0,
                    reset_after_us: if denying {
                        denial.reset_at_us.saturating_sub(now_us)
                    } else {
                        0
                    },
                    retry_after_us: Some(if denying { denial.until_us - now_us } else { 0 }),
                    id: None,
                }
            })
            .collect();
        Some(Outcome {
            admitted: false,
            tiers,
            records: Vec::new(),
        })
    }

    /// Remembers a denial whose end is known and cannot come early (see [`crate::cache`]), made by a request that
    /// started in the cache's `generation`.
    fn remember(&self, hit: &Hit, outcome: &Outcome, now_us: u64, generation: u64) {
        let exact = |a: Algorithm| !matches!(a, Algorithm::Concurrency | Algorithm::Queue);
        if outcome.admitted || hit.cost == 0 || !hit.tiers.iter().all(|t| exact(t.algorithm)) {
            return;
        }
        let (tier, denied) = constraining(outcome);
        if let (Some(first), Some(retry)) = (hit.tiers.first(), denied.retry_after_us) {
            let denial = Denial {
                limits: limits_fingerprint(hit),
                until_us: now_us.saturating_add(retry),
                cost: hit.cost,
                tier,
                reset_at_us: now_us.saturating_add(denied.reset_after_us),
            };
            self.cache.insert(first.key.as_str(), denial, now_us, generation);
        }
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
                    Some(self.hit(request, descriptor, tiers, *rule, shared, cost.min(capacity + 1)))
                }
                _ => None,
            })
            .collect();
        let outcomes: Result<Vec<Outcome>, StoreError> = if hits.is_empty() {
            Ok(Vec::new())
        } else {
            self.store_call("peek", now_us, &hits).await.into_iter().collect()
        };
        let mut outcomes = outcomes
            .inspect_err(|_| stats.remaining_unavailable.increment(1))?
            .into_iter();
        stats.remaining_ok.increment(1);
        targets
            .into_iter()
            .map(|target| {
                Ok(match target {
                    Target::NoRule => Report::NoRule,
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
        Ok(self.store.release(&keys, lease).await?)
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
        self.cache
            .remove(&keys.iter().chain(&streams).map(CounterKey::as_str).collect::<Vec<_>>());
        let deleted = self.store.reset(&keys).await?;
        let streams = if streams.is_empty() {
            crate::store::StreamReset::default()
        } else {
            self.store.reset_idle_streams(self.clock.now_us(), &streams).await?
        };
        Ok(ResetReport {
            deleted: deleted + streams.deleted,
            kept_streams: streams.kept.iter().map(|k| k.as_str().to_string()).collect(),
        })
    }

    /// The keys of the matched limits that `select` picks, and of the hit records when `records`.
    fn keys(&self, request: &Request, select: impl Fn(&Tier) -> bool, records: bool) -> Vec<CounterKey> {
        let rules = self.rules.load();
        let targets = resolve(rules.domain(&request.domain), request);
        let mut keys = Vec::new();
        for (descriptor, target) in request.descriptors.iter().zip(&targets) {
            if let Target::Limited { tiers, rule, shared } = target {
                let id = self.identity(&request.domain, descriptor, shared);
                keys.extend(
                    tiers
                        .iter()
                        .filter(|t| select(t))
                        .map(|t| id.tier(t.limit.algorithm, t.limit.window_us())),
                );
                if records && rule.is_some_and(|r| r.record.is_some()) {
                    keys.push(id.records());
                }
            }
        }
        keys
    }

    fn identity(&self, domain: &str, descriptor: &Descriptor, shared: &[(usize, &str)]) -> crate::store::Identity {
        let mut key = CounterKey::builder(&self.settings.key_prefix, domain);
        for (depth, (k, v)) in descriptor.entries.iter().enumerate() {
            let value = shared
                .iter()
                .find(|(d, _)| *d == depth)
                .map_or(v.as_str(), |(_, pattern)| pattern);
            key = key.entry(k, value);
        }
        key.finish()
    }

    fn hit(
        &self,
        request: &Request,
        descriptor: &Descriptor,
        tiers: &[Tier],
        rule: Option<&Rule>,
        shared: &[(usize, &str)],
        cost: u64,
    ) -> Hit {
        let id = self.identity(&request.domain, descriptor, shared);
        let queue = tiers.iter().any(|t| t.limit.algorithm == Algorithm::Queue);
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
                    key: id.tier(t.limit.algorithm, t.limit.window_us()),
                    algorithm: t.limit.algorithm,
                    limit: u64::from(t.limit.requests),
                    window_us: t.limit.window_us(),
                    burst: u64::from(t.limit.burst),
                })
                .collect(),
            cost,
            lease: String::new(),
            fields: if queue { descriptor.entries.clone() } else { Vec::new() },
            record,
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
            Some(rule) if !rule.dynamic_label => Cow::Borrowed(&rule.stats),
            Some(_) => Cow::Owned(
                self.metrics
                    .rule_stats(&domain.name, &domain.detailed_label(&descriptor.entries)),
            ),
            None => Cow::Borrowed(&domain.override_stats),
        }
    }

    fn record_store_call(&self, op: &'static str, started: std::time::Instant, error: Option<&StoreError>) {
        self.latency[usize::from(op == "peek")].record(started.elapsed().as_secs_f64());
        if let Some(e) = error {
            self.metrics.store_error(self.store.name(), e.kind());
            tracing::warn!(store = self.store.name(), op, error = %e, "store call failed");
        }
    }
}

/// The tier that decides a descriptor's status: when admitted, the one with the least left (then the longest
/// reset); when denied, the one that frees up last.
fn constraining(outcome: &Outcome) -> (usize, &TierOutcome) {
    let tiers = outcome.tiers.iter().enumerate();
    let chosen = if outcome.admitted {
        tiers.min_by_key(|(_, t)| (t.remaining, std::cmp::Reverse(t.reset_after_us)))
    } else {
        tiers
            .filter(|(_, t)| !t.ok)
            .max_by_key(|(_, t)| t.retry_after_us.unwrap_or(u64::MAX))
    };
    chosen.unwrap_or((0, &outcome.tiers[0]))
}

/// What a cached denial is bound to besides its counter: every limit of the hit (algorithm, size, window, burst).
fn limits_fingerprint(hit: &Hit) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    for t in &hit.tiers {
        (t.algorithm.name(), t.limit, t.window_us, t.burst).hash(&mut h);
    }
    h.finish()
}

/// A lease id unique across processes and time: 128 bits from the process's random hasher keys, a counter and the
/// clock. Not a secret: releasing needs the descriptors too.
fn new_lease() -> String {
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

/// The status a failure policy gives a limited descriptor when the store could not decide.
fn fallback_status(policy: FailurePolicy, tier: &Tier, shadow: bool) -> Status {
    match policy {
        FailurePolicy::FailClosed => Status {
            code: if shadow { Code::Ok } else { Code::OverLimit },
            limit: Some(AppliedLimit::from(tier)),
            remaining: 0,
            reset_after_us: Some(1_000_000),
        },
        FailurePolicy::FailOpen | FailurePolicy::Error => Status::NO_RULE,
    }
}

/// The cost of a descriptor's hit: its own `hits_addend` if present (0 = check only), else the request's, 0 = 1.
fn cost(request: &Request, descriptor: &Descriptor) -> u64 {
    descriptor.hits_addend.unwrap_or(u64::from(request.hits_addend.max(1)))
}

/// Rejects what Envoy's protocol forbids and what exceeds the caps, naming the offending field or cap.
fn validate(request: &Request, caps: &Caps) -> Result<(), LimitError> {
    let invalid = |m: String| Err(LimitError::InvalidArgument(m));
    let over = |cap: Cap, message: String| Err(LimitError::OverCap { cap, message });
    if request.domain.is_empty() {
        return invalid("domain is empty".into());
    }
    if request.domain.len() > caps.max_value_bytes {
        return over(
            Cap::ValueBytes,
            format!(
                "domain is {} bytes, over the cap of {}",
                request.domain.len(),
                caps.max_value_bytes
            ),
        );
    }
    if request.descriptors.is_empty() {
        return invalid("no descriptors".into());
    }
    if request.descriptors.len() > caps.max_descriptors {
        return over(
            Cap::Descriptors,
            format!(
                "{} descriptors, over the cap of {}",
                request.descriptors.len(),
                caps.max_descriptors
            ),
        );
    }
    for (i, d) in request.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return invalid(format!("descriptors[{i}] has no entries"));
        }
        if d.entries.len() > caps.max_entries {
            return over(
                Cap::Entries,
                format!(
                    "descriptors[{i}] has {} entries, over the cap of {}",
                    d.entries.len(),
                    caps.max_entries
                ),
            );
        }
        for (j, (k, v)) in d.entries.iter().enumerate() {
            if k.is_empty() {
                return invalid(format!("descriptors[{i}].entries[{j}].key is empty"));
            }
            if k.len() > caps.max_value_bytes || v.len() > caps.max_value_bytes {
                return over(
                    Cap::ValueBytes,
                    format!(
                        "descriptors[{i}].entries[{j}] is over the cap of {} bytes per key or value",
                        caps.max_value_bytes
                    ),
                );
            }
        }
        if let Some(o) = d.limit_override {
            if Unit::from_override(o.unit).is_none() {
                return invalid(format!(
                    "descriptors[{i}].limit.unit {} is not a valid unit (SECOND to YEAR)",
                    o.unit
                ));
            }
        }
    }
    Ok(())
}

/// Matches every descriptor, then drops the rules named in the `replaces` of any matched rule.
fn resolve<'a>(domain: Option<&'a Domain>, request: &Request) -> Vec<Target<'a>> {
    let Some(domain) = domain else {
        return request.descriptors.iter().map(|_| Target::NoRule).collect();
    };
    let mut replaced: Option<HashSet<&str>> = None;
    let mut targets: Vec<Target<'a>> = request
        .descriptors
        .iter()
        .map(|d| {
            if let Some(o) = d.limit_override {
                let unit = Unit::from_override(o.unit).unwrap_or(Unit::Second);
                return Target::Limited {
                    tiers: Cow::Owned(vec![Tier {
                        limit: Limit::fixed(o.requests_per_unit, unit),
                        name: None,
                    }]),
                    rule: None,
                    shared: Vec::new(),
                };
            }
            let Some(m) = domain.find(&d.entries) else {
                return Target::NoRule;
            };
            if !m.rule.replaces.is_empty() {
                replaced
                    .get_or_insert_with(HashSet::new)
                    .extend(m.rule.replaces.iter().map(|n| &**n));
            }
            if m.rule.tiers.is_empty() {
                Target::Unlimited(m.rule)
            } else {
                Target::Limited {
                    tiers: Cow::Borrowed(&m.rule.tiers),
                    rule: Some(m.rule),
                    shared: m.shared,
                }
            }
        })
        .collect();
    if let Some(replaced) = replaced {
        for target in &mut targets {
            if let Target::Limited { rule: Some(r), .. } | Target::Unlimited(r) = target {
                if r.is_replaced(&replaced) {
                    *target = Target::NoRule;
                }
            }
        }
    }
    targets
}
