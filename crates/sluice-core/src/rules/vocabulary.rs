//! The words a rule is made of: units, algorithms, limits and their tiers, `record`, the failure policy, rule
//! metadata, and the bounds the compiler enforces on them.
//!
//! These are plain values with no tree and no request in sight, so the limiter, the stores and the service's faces
//! can all name them without depending on how rules are matched or compiled.

pub use crate::store::Algorithm;
use std::sync::Arc;

/// The longest window a limit may have: 100 years, so microsecond times stay far below 2^53.
pub(super) const MAX_WINDOW_SECONDS: u64 = 100 * 365 * 86_400;

/// The time unit of a limit. Months are 30 days and years 365 days, as in the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// Parses a unit name, case-insensitively, as the reference does.
    pub fn from_name(name: &str) -> Option<Unit> {
        Some(match name.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    /// The unit of a `RateLimitOverride` (`envoy.type.v3.RateLimitUnit`, which has no week).
    pub fn from_override(value: i32) -> Option<Unit> {
        Some(match value {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            _ => return None,
        })
    }

    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
}

/// What to answer when the store cannot decide (it failed, timed out, or the circuit breaker is open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Answer OK (counted in `sluice_store_fallback_total`).
    FailOpen,
    /// Answer OVER_LIMIT for every limited descriptor.
    FailClosed,
    /// Answer UNAVAILABLE, so Envoy's `failure_mode_deny` decides.
    Error,
}

impl FailurePolicy {
    pub fn from_name(name: &str) -> Option<FailurePolicy> {
        [FailurePolicy::FailOpen, FailurePolicy::FailClosed, FailurePolicy::Error]
            .into_iter()
            .find(|p| p.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            FailurePolicy::FailOpen => "fail_open",
            FailurePolicy::FailClosed => "fail_closed",
            FailurePolicy::Error => "error",
        }
    }
}

/// The most hits a `sliding_log` limit may allow per window: each admitted hit is one sorted-set member.
pub const MAX_LOG_LIMIT: u32 = 10_000;

/// The most sub-windows a `bucketed_window` limit may have: a decision reads every one of them.
pub const MAX_BUCKETS: u32 = 3_600;

/// The most values `record` may keep per counter.
pub const MAX_RECORDS: u32 = 1_000;

/// A finite limit: at most `requests` hits per window of `multiplier` units, counted by `algorithm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    pub requests: u32,
    pub unit: Unit,
    pub multiplier: u32,
    pub algorithm: Algorithm,
    /// Bucket capacity (`token_bucket`, `leaky_bucket`); the number of sub-windows of a `bucketed_window`; equals
    /// `requests` for the other algorithms.
    pub burst: u32,
}

impl Limit {
    /// A fixed-window limit, as the reference and Envoy's overrides know them.
    pub fn fixed(requests: u32, unit: Unit) -> Limit {
        Limit {
            requests,
            unit,
            multiplier: 1,
            algorithm: Algorithm::default(),
            burst: requests,
        }
    }

    /// The window length in microseconds.
    pub fn window_us(&self) -> u64 {
        self.unit.seconds() * u64::from(self.multiplier) * 1_000_000
    }

    /// The span its counter is named by: the window, but a `bucketed_window`'s sub-window, so that the limits of one
    /// descriptor with the same sub-window share their counts.
    pub fn counter_span_us(&self) -> u64 {
        self.algorithm.counter_span_us(self.window_us(), u64::from(self.burst))
    }

    /// The most hits that can ever pass at once: the bucket for buckets, the limit otherwise.
    pub fn capacity(&self) -> u32 {
        if self.algorithm.is_bucket() {
            self.burst
        } else {
            self.requests
        }
    }
}

/// One limit of a rule, with its own name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    pub limit: Limit,
    pub name: Option<Arc<str>>,
    /// What a hit costs this limit.
    pub cost: TierCost,
    /// Counted in every region (`global: true`): see [`crate::regions`].
    pub global: bool,
}

/// What a hit costs one limit: the request's cost (Envoy's `hits_addend`), one of the named costs a cost-budget
/// call carries (e.g. `input_tokens`), or a priced sum of them, in whole units of the budget.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TierCost {
    #[default]
    Request,
    Named(Arc<str>),
    Priced(Box<[(Arc<str>, u32)]>),
}

impl TierCost {
    /// What names the cost in its limit's counter key: `None` for the request's cost (the reference's keys), the
    /// name, or `price` and the priced names with their prices.
    pub fn label(&self) -> Option<String> {
        match self {
            TierCost::Request => None,
            TierCost::Named(name) => Some(name.to_string()),
            TierCost::Priced(prices) => {
                let parts: Vec<String> = prices.iter().map(|(n, p)| format!("{n}={p}")).collect();
                Some(format!("price:{}", parts.join(",")))
            }
        }
    }

    /// The cost of a hit whose request cost is `request` and named costs `named` (a name not given costs 0). Never
    /// wraps: a priced sum saturates.
    pub fn of(&self, request: u64, named: &[(String, u64)]) -> u64 {
        let find = |name: &str| named.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c);
        match self {
            TierCost::Request => request,
            TierCost::Named(name) => find(name),
            TierCost::Priced(prices) => prices.iter().fold(0u64, |sum, (name, price)| {
                sum.saturating_add(find(name).saturating_mul(u64::from(*price)))
            }),
        }
    }
}

/// `record`: keep the last `size` values of the request entry `key` that hit a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub key: Arc<str>,
    pub size: u32,
}

/// A rule's `metadata`, as plain data: a map of strings to JSON-like values.
pub type Metadata = serde_json::Map<String, serde_json::Value>;

/// How an RLQS bucket's quota is handed out (`quota_buckets` in a domain file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketSettings {
    /// How long an assignment holds without a refresh, in seconds (at least 1).
    pub assignment_ttl_s: u32,
    /// A bucket reported with no requests for this long is abandoned, in seconds.
    pub abandon_after_s: u32,
    pub initial: InitialAssignment,
}

impl BucketSettings {
    pub const DEFAULT_TTL_S: u32 = 15;
    pub const DEFAULT_ABANDON_AFTER_S: u32 = 300;
}

impl Default for BucketSettings {
    fn default() -> Self {
        BucketSettings {
            assignment_ttl_s: BucketSettings::DEFAULT_TTL_S,
            abandon_after_s: BucketSettings::DEFAULT_ABANDON_AFTER_S,
            initial: InitialAssignment::Share,
        }
    }
}

/// The answer to a bucket's first report on a stream, before its demand is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitialAssignment {
    /// A share sized like every later one, from the first report's requests.
    Share,
    AllowAll,
    DenyAll,
}

impl InitialAssignment {
    pub fn from_name(name: &str) -> Option<InitialAssignment> {
        Some(match name {
            "share" => InitialAssignment::Share,
            "allow_all" => InitialAssignment::AllowAll,
            "deny_all" => InitialAssignment::DenyAll,
            _ => return None,
        })
    }
}
