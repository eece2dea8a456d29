//! The decision core: `should_rate_limit(request) -> Decision` and the read-only `get_remaining`.
//!
//! It knows nothing of gRPC or Redis: requests arrive as plain types, counters go through the [`Store`] trait.
//! Per request it reads the clock once, loads the current rule set once (a reload swaps it atomically), matches
//! every descriptor, drops the rules that others `replace`, and sends every counter to the store in one call.

use std::collections::HashSet;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::clock::Clock;
use crate::metrics::{DomainStats, Metrics, RuleStats};
use crate::rules::{Algorithm, Domain, Limit, Rule, RuleSet, Unit};
use crate::store::{CounterKey, Hit, Remaining, Store, StoreError};

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

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    /// Set whenever a finite limit applied.
    pub limit: Option<AppliedLimit>,
    /// Hits left in the window; `u32::MAX` for an unlimited rule, 0 when no rule applied.
    pub remaining: u32,
    /// Time until the counter resets, in microseconds; set whenever a finite limit applied.
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
    pub metadata: Vec<Arc<serde_yaml_ng::Mapping>>,
}

/// What GetRemaining reports for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    NoRule,
    Unlimited,
    Limited {
        limit: AppliedLimit,
        state: Remaining,
    },
}

/// Why a request got no decision.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The request itself is malformed; the message names what is wrong.
    #[error("{0}")]
    InvalidArgument(String),
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
}

impl Default for LimiterSettings {
    fn default() -> Self {
        LimiterSettings {
            key_prefix: "sluice:".to_string(),
            shadow_mode: false,
            response_metadata: false,
        }
    }
}

/// The decision core over a store.
pub struct Limiter<S> {
    rules: ArcSwap<RuleSet>,
    store: S,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    settings: LimiterSettings,
}

/// What one request descriptor resolved to.
enum Target<'a> {
    NoRule,
    Unlimited(&'a Rule),
    Limited {
        limit: Limit,
        rule: Option<&'a Rule>,
        shared: Vec<(usize, &'a str)>,
    },
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
            store,
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

    /// The rule set in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    /// Replaces the rule set; requests already running finish with the old one.
    pub fn reload(&self, rules: RuleSet) {
        self.rules.store(Arc::new(rules));
    }

    /// Decides a request, counting each descriptor's hit against its limit.
    pub async fn should_rate_limit(&self, request: &Request) -> Result<Decision, LimitError> {
        validate(request).inspect_err(|_| self.metrics.invalid_request("should_rate_limit"))?;
        let now_us = self.clock.now_us();
        let rules = self.rules.load();
        let domain = rules.domain(&request.domain);
        let stats = self.domain_stats(domain);
        let targets = resolve(domain, request);

        let mut hits = Vec::with_capacity(targets.len());
        for (descriptor, target) in request.descriptors.iter().zip(&targets) {
            if let Target::Limited { limit, shared, .. } = target {
                let cost = cost(request, descriptor).min(u64::from(limit.requests) + 1);
                hits.push(self.hit(&request.domain, descriptor, limit, shared, cost, now_us));
            }
        }
        let started = std::time::Instant::now();
        let outcomes = self.store.hit(now_us, &hits).await;
        self.record_store_call("hit", started, outcomes.as_ref().err());
        let outcomes = outcomes.inspect_err(|_| stats.should_unavailable.increment(1))?;

        let ratio = self.metrics.near_limit_ratio();
        let mut outcomes = outcomes.into_iter().zip(&hits);
        let mut statuses = Vec::with_capacity(targets.len());
        let mut metadata = Vec::new();
        let (mut over, mut quota_total, mut quota_over) = (false, 0usize, 0usize);
        for (descriptor, target) in request.descriptors.iter().zip(&targets) {
            let status = match target {
                Target::NoRule => Status::NO_RULE,
                Target::Unlimited(_) => Status::UNLIMITED,
                Target::Limited { limit, rule, .. } => {
                    let Some((outcome, hit)) = outcomes.next() else {
                        return Err(
                            StoreError::Other("store returned too few outcomes".into()).into()
                        );
                    };
                    let shadow = rule.is_some_and(|r| r.shadow_mode);
                    let quota = rule.is_some_and(|r| r.quota_mode);
                    if hit.cost > 0 {
                        self.rule_stats(domain, *rule, descriptor).record(
                            hit.cost,
                            limit.requests,
                            outcome.used,
                            outcome.allowed,
                            shadow,
                            ratio,
                        );
                    }
                    let code = match (outcome.allowed, shadow) {
                        (true, _) | (false, true) => Code::Ok,
                        (false, false) => Code::OverLimit,
                    };
                    if quota {
                        quota_total += 1;
                        quota_over += usize::from(code == Code::OverLimit);
                        // A quota status reports OVER_LIMIT but decides the request only together with the others.
                    } else {
                        over |= code == Code::OverLimit;
                    }
                    Status {
                        code,
                        limit: Some(AppliedLimit {
                            limit: *limit,
                            name: rule.and_then(|r| r.name.clone()),
                        }),
                        remaining: u32::try_from(outcome.remaining).unwrap_or(u32::MAX),
                        reset_after_us: Some(outcome.reset_after_us),
                    }
                }
            };
            if self.settings.response_metadata && status.code == Code::Ok {
                if let Target::Limited {
                    rule: Some(rule), ..
                }
                | Target::Unlimited(rule) = target
                {
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
        })
    }

    /// Reports each descriptor's limit and what is left of it, and when a hit of `cost` would pass. Read-only.
    pub async fn get_remaining(
        &self,
        request: &Request,
        cost: u64,
    ) -> Result<Vec<Report>, LimitError> {
        validate(request).inspect_err(|_| self.metrics.invalid_request("get_remaining"))?;
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
                Target::Limited { limit, shared, .. } => {
                    Some(self.hit(&request.domain, descriptor, limit, shared, cost, now_us))
                }
                _ => None,
            })
            .collect();
        let started = std::time::Instant::now();
        let states = self.store.peek(now_us, &hits).await;
        self.record_store_call("peek", started, states.as_ref().err());
        let mut states = states
            .inspect_err(|_| stats.remaining_unavailable.increment(1))?
            .into_iter();
        stats.remaining_ok.increment(1);
        targets
            .into_iter()
            .map(|target| {
                Ok(match target {
                    Target::NoRule => Report::NoRule,
                    Target::Unlimited(_) => Report::Unlimited,
                    Target::Limited { limit, rule, .. } => Report::Limited {
                        limit: AppliedLimit {
                            limit,
                            name: rule.and_then(|r| r.name.clone()),
                        },
                        state: states.next().ok_or_else(|| {
                            LimitError::Store(StoreError::Other(
                                "store returned too few states".into(),
                            ))
                        })?,
                    },
                })
            })
            .collect()
    }

    fn hit(
        &self,
        domain: &str,
        descriptor: &Descriptor,
        limit: &Limit,
        shared: &[(usize, &str)],
        cost: u64,
        now_us: u64,
    ) -> Hit {
        let mut key = CounterKey::builder(&self.settings.key_prefix, domain);
        for (depth, (k, v)) in descriptor.entries.iter().enumerate() {
            let value = shared
                .iter()
                .find(|(d, _)| *d == depth)
                .map_or(v.as_str(), |(_, pattern)| pattern);
            key = key.entry(k, value);
        }
        Hit {
            key: key.window(limit.algorithm.name(), limit.window_us(), now_us),
            limit: u64::from(limit.requests),
            window_us: limit.window_us(),
            cost,
        }
    }

    fn domain_stats<'a>(&'a self, domain: Option<&'a Domain>) -> &'a DomainStats {
        domain.map_or(self.metrics.unknown_domain(), |d| &d.stats)
    }

    /// The counters a hit is recorded in: the rule's own, or, when labels carry request values (opt-in) or the
    /// limit came from an override, counters registered for this request's label.
    fn rule_stats<'a>(
        &'a self,
        domain: Option<&'a Domain>,
        rule: Option<&'a Rule>,
        descriptor: &Descriptor,
    ) -> std::borrow::Cow<'a, RuleStats> {
        let Some(domain) = domain else {
            return std::borrow::Cow::Owned(
                self.metrics.rule_stats(crate::metrics::UNKNOWN_DOMAIN, ""),
            );
        };
        match rule {
            Some(rule) if !rule.dynamic_label => std::borrow::Cow::Borrowed(&rule.stats),
            Some(_) => std::borrow::Cow::Owned(
                self.metrics
                    .rule_stats(&domain.name, &domain.detailed_label(&descriptor.entries)),
            ),
            None => {
                let mut label = String::from(&*domain.name);
                for (k, _) in &descriptor.entries {
                    label.push('.');
                    label.push_str(k);
                }
                std::borrow::Cow::Owned(self.metrics.rule_stats(&domain.name, &label))
            }
        }
    }

    fn record_store_call(
        &self,
        op: &'static str,
        started: std::time::Instant,
        error: Option<&StoreError>,
    ) {
        self.metrics
            .store_call(self.store.name(), op, started.elapsed());
        if let Some(e) = error {
            self.metrics.store_error(self.store.name(), e.kind());
            tracing::warn!(store = self.store.name(), op, error = %e, "store call failed");
        }
    }
}

/// The cost of a descriptor's hit: its own `hits_addend` if present (0 = check only), else the request's, 0 = 1.
fn cost(request: &Request, descriptor: &Descriptor) -> u64 {
    descriptor
        .hits_addend
        .unwrap_or(u64::from(request.hits_addend.max(1)))
}

/// Rejects what Envoy's protocol forbids, naming the offending field.
fn validate(request: &Request) -> Result<(), LimitError> {
    let invalid = |m: String| Err(LimitError::InvalidArgument(m));
    if request.domain.is_empty() {
        return invalid("domain is empty".into());
    }
    if request.descriptors.is_empty() {
        return invalid("no descriptors".into());
    }
    for (i, d) in request.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return invalid(format!("descriptors[{i}] has no entries"));
        }
        if let Some(j) = d.entries.iter().position(|(k, _)| k.is_empty()) {
            return invalid(format!("descriptors[{i}].entries[{j}].key is empty"));
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
                    limit: Limit {
                        requests: o.requests_per_unit,
                        unit,
                        multiplier: 1,
                        algorithm: Algorithm::FixedWindow,
                    },
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
            match m.rule.limit {
                None => Target::Unlimited(m.rule),
                Some(limit) => Target::Limited {
                    limit,
                    rule: Some(m.rule),
                    shared: m.shared,
                },
            }
        })
        .collect();
    if let Some(replaced) = replaced {
        for target in &mut targets {
            let name = match target {
                Target::Limited { rule: Some(r), .. } | Target::Unlimited(r) => r.name.as_deref(),
                _ => None,
            };
            if name.is_some_and(|n| replaced.contains(n)) {
                *target = Target::NoRule;
            }
        }
    }
    targets
}
