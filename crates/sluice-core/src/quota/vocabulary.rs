//! What an RLQS stream says and is told: usage reports in, assignments (a strategy per bucket) out, and why a
//! stream must end.

/// The fill interval of the token buckets sluice sends, in seconds (about 31 years): one token per interval, so an
/// Envoy's bucket holds what it was granted and nothing more.
pub const NO_REFILL_S: u32 = 1_000_000_000;

/// How often a face calls [`Quotas::tick`](super::Quotas::tick) at most apart: refreshes are due one tick early,
/// so that they still go out two seconds before a TTL lapses.
pub const TICK_US: u64 = 1_000_000;

/// A bucket id: its entries sorted by key.
pub type BucketId = Vec<(String, String)>;

/// How an Envoy decides a bucket's requests until its next assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    AllowAll,
    DenyAll,
    /// Starts full (or, replacing another, at its fill fraction, in Envoy 1.40); refills `tokens_per_fill` every
    /// `fill_interval_s` seconds (continuously, in Envoy).
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_interval_s: u32,
    },
}

impl Strategy {
    pub fn name(self) -> &'static str {
        match self {
            Strategy::AllowAll => "allow_all",
            Strategy::DenyAll => "deny_all",
            Strategy::TokenBucket { .. } => "token_bucket",
        }
    }
}

/// What the server tells an Envoy about one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Assign {
        bucket: BucketId,
        strategy: Strategy,
        /// Whole seconds, at least 1 (Envoy's timer granularity; 0 would expire at once).
        ttl_s: u32,
        /// The token bucket must start full: the face sends a DENY_ALL for the bucket first, in the same message, so
        /// that Envoy has no bucket left to carry a fill fraction over from.
        fresh: bool,
    },
    Abandon {
        bucket: BucketId,
    },
}

/// One message of a stream: the domain and each bucket's requests since its last report.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub domain: String,
    pub usages: Vec<ReportedUsage>,
}

/// One bucket of a report, as the client sent it (entries in any order).
#[derive(Debug, Clone, Default)]
pub struct ReportedUsage {
    pub bucket: Vec<(String, String)>,
    pub allowed: u64,
    pub denied: u64,
}

/// Why a stream must end. The message names the field, as the wire format spells it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    #[error("{0}")]
    Invalid(String),
    /// A bound on the server's state: streams per server, buckets per stream.
    #[error("{0}")]
    OverCap(String),
    #[error("{0}")]
    Unavailable(String),
}

/// Bounds on the state the server keeps for its streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaCaps {
    pub max_streams: usize,
    pub max_buckets_per_stream: usize,
    /// Bytes of one bucket key or value, and of the domain.
    pub max_value_bytes: usize,
}

impl Default for QuotaCaps {
    fn default() -> Self {
        QuotaCaps {
            max_streams: 10_000,
            max_buckets_per_stream: 100_000,
            max_value_bytes: 4_096,
        }
    }
}
