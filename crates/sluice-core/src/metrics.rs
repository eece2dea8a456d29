//! Metrics: names, labels, and the handles the hot path increments, recorded through the `metrics` facade into a
//! [`Sink`] the embedder chooses (the service's is a Prometheus recorder; an embedder with no use for them passes
//! [`NoSink`]). The core knows no exporter.
//!
//! Each limiter owns its own sink (no global recorder), so two limiters in one process — as in the tests — never
//! share counters. A rule's handles are registered on its first hit (so a configuration of many rules exposes series
//! only for the rules in use), after which a decision increments atomics and allocates nothing; only rules that opt
//! into request values in labels (`detailed_metric`,
//! `value_to_metric`) register series per request. Unknown domains share one label, and descriptors that carry their
//! own limit one label per domain, so clients cannot create series: no label carries request text unless a rule
//! opts in.

use std::sync::Arc;

use metrics::{Counter, Histogram, Key, Label, Metadata, Recorder};

/// The most one hit or one usage report adds to a counter metric: a larger amount (an RLQS report of 2^64 - 1
/// requests) is counted as this, so that no amount can wrap a counter, which Prometheus would read as a reset and
/// see go backwards. It would take 2^32 such reports to reach the counter's 2^64.
pub const MAX_COUNTED: u64 = 1 << 32;

/// RPC requests by domain, RPC and result (`ok`, `over_limit`, `invalid_argument`, `unavailable`).
pub const REQUESTS: &str = "sluice_requests_total";
/// Hits counted against a rule (each hit weighs its cost).
pub const RULE_HITS: &str = "sluice_rule_hits_total";
/// Hits that were within the rule's limit.
pub const RULE_WITHIN_LIMIT: &str = "sluice_rule_within_limit_total";
/// Hits that were over the rule's limit (shadow-mode rules included).
pub const RULE_OVER_LIMIT: &str = "sluice_rule_over_limit_total";
/// Hits within the limit that brought the count above `near_limit_ratio` of it.
pub const RULE_NEAR_LIMIT: &str = "sluice_rule_near_limit_total";
/// Over-limit hits of shadow-mode rules, answered OK.
pub const RULE_SHADOW_MODE: &str = "sluice_rule_shadow_mode_total";
/// Latency of one store call (all counters of one request), by store and operation.
pub const STORE_DURATION: &str = "sluice_store_call_duration_seconds";
/// Store calls that failed, by store and kind (`timeout`, `connection`, `script`, `other`).
pub const STORE_ERRORS: &str = "sluice_store_errors_total";

/// Configuration reloads by result (`success`, `failure`).
pub const CONFIG_RELOADS: &str = "sluice_config_reloads_total";
/// The low 32 bits of the loaded configuration's digest: instances with equal values run equal configurations.
pub const CONFIG_HASH: &str = "sluice_config_hash";
/// When the configuration in force was loaded, in Unix seconds.
pub const CONFIG_LOADED: &str = "sluice_config_loaded_timestamp_seconds";

/// Decisions made without the store, by the failure policy that answered.
pub const STORE_FALLBACK: &str = "sluice_store_fallback_total";
/// Descriptors whose store call failed after it may have run (a timeout, a broken connection), by store: each may have
/// been counted once, at its cost, though the failure policy answered it.
pub const STORE_UNKNOWN: &str = "sluice_store_unknown_outcomes_total";
/// Requests a deny or allow list decided, by domain, list and action.
pub const LISTED: &str = "sluice_list_matches_total";
/// Fetches of a list from its URL, by domain, list and result (`success`, `failure`).
pub const LIST_FETCHES: &str = "sluice_list_fetches_total";
/// When a list was last fetched from its URL successfully, in Unix seconds, by domain and list.
pub const LIST_FETCHED: &str = "sluice_list_fetched_timestamp_seconds";
/// Entries a list holds beyond its configuration, by domain, list and source (`fetched`, `managed`).
pub const LIST_ENTRIES: &str = "sluice_list_entries";
/// The circuit breaker in front of the store: 0 closed, 1 open, 2 half-open (probing).
pub const BREAKER_STATE: &str = "sluice_breaker_state";
/// Descriptors answered OVER_LIMIT from the local over-limit cache, without a store call.
pub const LOCAL_CACHE_HITS: &str = "sluice_local_cache_hits_total";
/// Window counts of global limits shipped to another region and taken there, by region.
pub const REGION_SHIPPED: &str = "sluice_region_shipped_total";
/// Window counts dropped because a region's backlog was full, by region.
pub const REGION_DROPPED: &str = "sluice_region_dropped_total";
/// Window counts waiting to be shipped to a region, by region.
pub const REGION_BACKLOG: &str = "sluice_region_backlog";
/// Whether the last shipment to a region reached it (1) or not (0), by region.
pub const REGION_LINKED: &str = "sluice_region_linked";

/// Cost counted by the cost-budget calls, by domain, rule, limit (its name, or its position) and kind: `reported`,
/// `reserved`, `settled` (the estimates of settled reservations), `actual` (what they really cost), `refunded` and
/// `charged` (given back and counted beyond their estimates), and `expired` (the estimates of reservations that
/// expired unsettled, counted by the instance that made them). Registered on first use, so a configuration without
/// budgets shows none.
pub const RULE_COST: &str = "sluice_rule_cost_total";

/// Open RLQS streams (one per Envoy and filter configuration).
pub const RLQS_STREAMS: &str = "sluice_rlqs_streams";
/// RLQS streams open on every instance sharing the store, as this one counts them.
pub const RLQS_FLEET_STREAMS: &str = "sluice_rlqs_fleet_streams";
/// RLQS buckets the open streams report, summed over streams.
pub const RLQS_BUCKETS: &str = "sluice_rlqs_buckets";
/// RLQS assignments sent, by strategy (`allow_all`, `deny_all`, `token_bucket`).
pub const RLQS_ASSIGNMENTS: &str = "sluice_rlqs_assignments_total";
/// RLQS buckets abandoned because their Envoy reported no requests for `abandon_after_seconds`.
pub const RLQS_ABANDONED: &str = "sluice_rlqs_abandoned_total";
/// Requests RLQS clients reported, by result (`allowed`, `denied`).
pub const RLQS_USAGE: &str = "sluice_rlqs_usage_total";
/// Times a report left a bucket's quota with nothing remaining.
pub const RLQS_EXHAUSTED: &str = "sluice_rlqs_quota_exhausted_total";
/// Requests RLQS clients reported denied while their bucket's quota (a budget) had that many left: the 429s that
/// sharing, not the quota, caused.
pub const RLQS_WRONGFUL_DENIALS: &str = "sluice_rlqs_wrongful_denials_total";

/// The label value standing for every domain the configuration does not define.
pub const UNKNOWN_DOMAIN: &str = "(unknown)";
/// The last segment of the `rule` label shared by every descriptor that carries its own limit: `<domain>.(override)`.
pub const OVERRIDE_RULE: &str = "(override)";

static METADATA: Metadata<'static> = Metadata::new(module_path!(), metrics::Level::INFO, None);

/// Where the core's metrics go: any `metrics` recorder, which may also render what it holds as text for a scrape
/// endpoint.
pub trait Sink: Recorder + Send + Sync + 'static {
    /// Everything recorded, as text for an exposition endpoint; empty when the sink keeps nothing to show.
    fn render(&self) -> String {
        String::new()
    }

    /// Housekeeping between scrapes (draining histogram samples, say); called now and then by the embedder.
    fn upkeep(&self) {}
}

/// A sink that drops everything, for an embedder with no use for metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoSink;

impl Recorder for NoSink {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

impl Sink for NoSink {}

/// The metrics of one limiter.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    recorder: Arc<dyn Sink>,
    near_limit_ratio: f64,
    unknown_domain: DomainStats,
    local_cache_hits: Counter,
    breaker_state: metrics::Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Request counters of one domain.
#[derive(Debug, Clone)]
pub struct DomainStats {
    pub should_ok: Counter,
    pub should_over_limit: Counter,
    pub should_unavailable: Counter,
    pub remaining_ok: Counter,
    pub remaining_unavailable: Counter,
}

/// The instruments of the Rate Limit Quota Service.
#[derive(Debug, Clone)]
pub struct QuotaStats {
    pub streams: metrics::Gauge,
    pub fleet_streams: metrics::Gauge,
    pub buckets: metrics::Gauge,
    pub allow_all: Counter,
    pub deny_all: Counter,
    pub token_bucket: Counter,
    pub abandoned: Counter,
    pub allowed: Counter,
    pub denied: Counter,
    pub exhausted: Counter,
}

/// Hit counters of one rule (or one detailed label of it).
#[derive(Debug, Clone)]
pub struct RuleStats {
    pub hits: Counter,
    pub within_limit: Counter,
    pub over_limit: Counter,
    pub near_limit: Counter,
    pub shadow_mode: Counter,
}

impl Metrics {
    /// Metrics recorded into `sink`. `near_limit_ratio`: a hit is "near" the limit when the count after it exceeds
    /// `floor(limit * ratio)`.
    pub fn new(near_limit_ratio: f64, sink: Arc<dyn Sink>) -> Metrics {
        let recorder = sink;
        let unknown_domain = domain_stats(&*recorder, UNKNOWN_DOMAIN);
        let local_cache_hits = recorder.register_counter(&Key::from_name(LOCAL_CACHE_HITS), &METADATA);
        let breaker_state = recorder.register_gauge(&Key::from_name(BREAKER_STATE), &METADATA);
        breaker_state.set(0.0);
        Metrics {
            inner: Arc::new(Inner {
                recorder,
                near_limit_ratio,
                unknown_domain,
                local_cache_hits,
                breaker_state,
            }),
        }
    }

    /// Metrics that go nowhere.
    pub fn discarded(near_limit_ratio: f64) -> Metrics {
        Metrics::new(near_limit_ratio, Arc::new(NoSink))
    }

    /// Every metric as the sink renders it (Prometheus text for the service's).
    pub fn render(&self) -> String {
        self.inner.recorder.render()
    }

    pub fn near_limit_ratio(&self) -> f64 {
        self.inner.near_limit_ratio
    }

    pub fn domain_stats(&self, domain: &str) -> DomainStats {
        domain_stats(&*self.inner.recorder, domain)
    }

    /// The stats of requests to domains the configuration does not define.
    pub fn unknown_domain(&self) -> &DomainStats {
        &self.inner.unknown_domain
    }

    /// The counters of a rule path (`domain.key_value.key`).
    pub fn rule_stats(&self, domain: &str, rule: &str) -> RuleStats {
        let counter = |name: &'static str| {
            let labels = vec![
                Label::new("domain", domain.to_string()),
                Label::new("rule", rule.to_string()),
            ];
            self.counter(name, labels)
        };
        RuleStats {
            hits: counter(RULE_HITS),
            within_limit: counter(RULE_WITHIN_LIMIT),
            over_limit: counter(RULE_OVER_LIMIT),
            near_limit: counter(RULE_NEAR_LIMIT),
            shadow_mode: counter(RULE_SHADOW_MODE),
        }
    }

    /// The counters of the hits a domain decides by a descriptor's own limit (`RateLimitOverride`), whatever its
    /// entries: the rule label `<domain>.(override)`.
    pub fn override_stats(&self, domain: &str) -> RuleStats {
        self.rule_stats(domain, &format!("{domain}.{OVERRIDE_RULE}"))
    }

    /// Adds `amount` of cost of `kind` (see [`RULE_COST`]) to one limit of a rule.
    pub fn cost(&self, domain: &str, rule: &str, limit: &str, kind: &'static str, amount: u64) {
        if amount == 0 {
            return;
        }
        let labels = vec![
            Label::new("domain", domain.to_string()),
            Label::new("rule", rule.to_string()),
            Label::new("limit", limit.to_string()),
            Label::from_static_parts("kind", kind),
        ];
        self.counter(RULE_COST, labels).increment(amount);
    }

    /// The instruments of the Rate Limit Quota Service; register once per server.
    pub fn quota_stats(&self) -> QuotaStats {
        let recorder = &*self.inner.recorder;
        let gauge = |name: &'static str| recorder.register_gauge(&Key::from_name(name), &METADATA);
        let counter = |name: &'static str, label: Option<(&'static str, &'static str)>| {
            let labels: Vec<Label> = label.map(|(k, v)| Label::from_static_parts(k, v)).into_iter().collect();
            self.counter(name, labels)
        };
        let streams = gauge(RLQS_STREAMS);
        streams.set(0.0);
        let fleet_streams = gauge(RLQS_FLEET_STREAMS);
        fleet_streams.set(0.0);
        let buckets = gauge(RLQS_BUCKETS);
        buckets.set(0.0);
        QuotaStats {
            streams,
            fleet_streams,
            buckets,
            allow_all: counter(RLQS_ASSIGNMENTS, Some(("strategy", "allow_all"))),
            deny_all: counter(RLQS_ASSIGNMENTS, Some(("strategy", "deny_all"))),
            token_bucket: counter(RLQS_ASSIGNMENTS, Some(("strategy", "token_bucket"))),
            abandoned: counter(RLQS_ABANDONED, None),
            allowed: counter(RLQS_USAGE, Some(("result", "allowed"))),
            denied: counter(RLQS_USAGE, Some(("result", "denied"))),
            exhausted: counter(RLQS_EXHAUSTED, None),
        }
    }

    /// The RLQS requests denied while quota was left, of one domain's bucket rule (registered on first use).
    pub fn rlqs_wrongful_denials(&self, domain: &str, rule: &str) -> Counter {
        let labels = vec![
            Label::new("domain", domain.to_string()),
            Label::new("rule", rule.to_string()),
        ];
        self.counter(RLQS_WRONGFUL_DENIALS, labels)
    }

    /// The latency histogram of one store and operation; register once, record per call.
    pub fn store_histogram(&self, store: &'static str, op: &'static str) -> Histogram {
        let labels = vec![
            Label::from_static_parts("store", store),
            Label::from_static_parts("op", op),
        ];
        self.inner
            .recorder
            .register_histogram(&Key::from_parts(STORE_DURATION, labels), &METADATA)
    }

    /// The sink's housekeeping (see [`Sink::upkeep`]); calling it periodically keeps memory flat between scrapes.
    pub fn run_upkeep(&self) {
        self.inner.recorder.upkeep();
    }

    /// Counts one failed store call.
    pub fn store_error(&self, store: &'static str, kind: &'static str) {
        let labels = vec![
            Label::from_static_parts("store", store),
            Label::from_static_parts("kind", kind),
        ];
        self.counter(STORE_ERRORS, labels).increment(1);
    }

    /// Counts `n` descriptors whose store call failed after it may have run (see [`STORE_UNKNOWN`]).
    pub fn unknown_outcomes(&self, store: &'static str, n: u64) {
        self.counter(STORE_UNKNOWN, vec![Label::from_static_parts("store", store)])
            .increment(n);
    }

    /// Counts a request rejected before it reached a domain (bad input).
    pub fn invalid_request(&self, rpc: &'static str) {
        let labels = vec![
            Label::from_static_parts("domain", UNKNOWN_DOMAIN),
            Label::from_static_parts("rpc", rpc),
            Label::from_static_parts("result", "invalid_argument"),
        ];
        self.counter(REQUESTS, labels).increment(1);
    }

    /// Counts a request that the list `list` of `domain` decided (`action`: `deny` or `allow`, the list's action
    /// by its name).
    pub fn listed(&self, domain: &str, list: &str, action: &'static str) {
        let labels = vec![
            Label::new("domain", domain.to_string()),
            Label::new("list", list.to_string()),
            Label::from_static_parts("action", action),
        ];
        self.counter(LISTED, labels).increment(1);
    }

    /// Counts a fetch of the list `list` of `domain` from its URL; a success also sets when, and how many entries.
    pub fn list_fetched(&self, domain: &str, list: &str, ok: Option<usize>) {
        let labels = |extra: Label| {
            vec![
                Label::new("domain", domain.to_string()),
                Label::new("list", list.to_string()),
                extra,
            ]
        };
        let result = if ok.is_some() { "success" } else { "failure" };
        self.counter(LIST_FETCHES, labels(Label::from_static_parts("result", result)))
            .increment(1);
        if let Some(entries) = ok {
            let key = Key::from_parts(
                LIST_FETCHED,
                vec![
                    Label::new("domain", domain.to_string()),
                    Label::new("list", list.to_string()),
                ],
            );
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.inner.recorder.register_gauge(&key, &METADATA).set(now);
            self.list_entries(domain, list, "fetched", entries);
        }
    }

    /// Records one link's state after a round: whether it is linked, what waits, and what was shipped and dropped
    /// since the last round.
    pub fn region_link(&self, region: &str, linked: bool, backlog: usize, shipped: u64, dropped: u64) {
        let labels = || vec![Label::new("region", region.to_string())];
        let gauge = |name: &'static str| {
            self.inner
                .recorder
                .register_gauge(&Key::from_parts(name, labels()), &METADATA)
        };
        gauge(REGION_LINKED).set(if linked { 1.0 } else { 0.0 });
        gauge(REGION_BACKLOG).set(backlog as f64);
        self.counter(REGION_SHIPPED, labels()).increment(shipped);
        self.counter(REGION_DROPPED, labels()).increment(dropped);
    }

    /// Sets how many entries the list `list` of `domain` holds from `source` (`fetched`, `managed`).
    pub fn list_entries(&self, domain: &str, list: &str, source: &'static str, entries: usize) {
        let labels = vec![
            Label::new("domain", domain.to_string()),
            Label::new("list", list.to_string()),
            Label::from_static_parts("source", source),
        ];
        let key = Key::from_parts(LIST_ENTRIES, labels);
        self.inner.recorder.register_gauge(&key, &METADATA).set(entries as f64);
    }

    /// Counts a descriptor answered by the failure policy `policy` without the store.
    pub fn fallback(&self, policy: &'static str) {
        self.counter(STORE_FALLBACK, vec![Label::from_static_parts("policy", policy)])
            .increment(1);
    }

    pub fn breaker_state(&self, state: u8) {
        self.inner.breaker_state.set(f64::from(state));
    }

    pub fn local_cache_hit(&self) {
        self.inner.local_cache_hits.increment(1);
    }

    /// Counts a configuration reload and, when it succeeded, records what is now in force.
    pub fn config_reload(&self, result: Result<u64, ()>) {
        let outcome = if result.is_ok() { "success" } else { "failure" };
        self.counter(CONFIG_RELOADS, vec![Label::from_static_parts("result", outcome)])
            .increment(1);
        if let Ok(digest) = result {
            self.config_loaded(digest);
        }
    }

    /// Records the configuration in force (at start and after each successful reload).
    pub fn config_loaded(&self, digest: u64) {
        let gauge = |name: &'static str| self.inner.recorder.register_gauge(&Key::from_name(name), &METADATA);
        gauge(CONFIG_HASH).set((digest & 0xffff_ffff) as f64);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        gauge(CONFIG_LOADED).set(now);
    }

    fn counter(&self, name: &'static str, labels: Vec<Label>) -> Counter {
        self.inner
            .recorder
            .register_counter(&Key::from_parts(name, labels), &METADATA)
    }
}

fn domain_stats(recorder: &dyn Sink, domain: &str) -> DomainStats {
    let counter = |rpc: &'static str, result: &'static str| {
        let labels = vec![
            Label::new("domain", domain.to_string()),
            Label::from_static_parts("rpc", rpc),
            Label::from_static_parts("result", result),
        ];
        recorder.register_counter(&Key::from_parts(REQUESTS, labels), &METADATA)
    };
    DomainStats {
        should_ok: counter("should_rate_limit", "ok"),
        should_over_limit: counter("should_rate_limit", "over_limit"),
        should_unavailable: counter("should_rate_limit", "unavailable"),
        remaining_ok: counter("get_remaining", "ok"),
        remaining_unavailable: counter("get_remaining", "unavailable"),
    }
}

impl RuleStats {
    /// Records one decided hit of `cost` against a rule of `limit` whose count is now `used`.
    pub fn record(&self, cost: u64, limit: u32, used: u64, allowed: bool, shadow: bool, ratio: f64) {
        let cost = cost.min(MAX_COUNTED);
        self.hits.increment(cost);
        if allowed {
            self.within_limit.increment(cost);
            let near = (f64::from(limit) * ratio).floor() as u64;
            if used > near {
                self.near_limit.increment(cost);
            }
        } else {
            self.over_limit.increment(cost);
            if shadow {
                self.shadow_mode.increment(cost);
            }
        }
    }
}
