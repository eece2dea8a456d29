//! The values of what a store keeps beside the counters: run-time list entries ([`ListChange`], [`ListEntry`]), the
//! sets of top values ([`Tally`], [`Span`]) and the per-second outcome counts the dashboard reads.

use super::CounterKey;

/// A change to a list's run-time entries.
#[derive(Debug, Clone, Copy)]
pub enum ListChange<'a> {
    /// Adds `values` (or renews them, when present) until `expires_us`, or for good; refused when the list would then
    /// hold more than `max` entries.
    Add {
        values: &'a [String],
        expires_us: Option<u64>,
        max: usize,
    },
    Remove {
        values: &'a [String],
    },
}

/// Counts to add to a set of top values (see [`Offenders::tally`](crate::store::Offenders::tally)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally {
    pub set: CounterKey,
    pub counts: Vec<(String, u64)>,
}

/// How far back [`Offenders::top`](crate::store::Offenders::top) sums: the last minute (the six 10-second buckets before the current one, and the
/// current one: 60 to 70 seconds), or the last hour (sixty minute buckets and the current one: 60 to 61 minutes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    Minute,
    Hour,
}

impl Span {
    /// The length of its buckets, and how many buckets it sums.
    pub fn buckets(self) -> (u64, u64) {
        match self {
            Span::Minute => (TOP_SHORT_BUCKET_US, 7),
            Span::Hour => (TOP_LONG_BUCKET_US, 61),
        }
    }

    /// The bucket keys of `set` it sums at `now_us`, newest first.
    pub fn keys(self, set: &CounterKey, now_us: u64) -> Vec<CounterKey> {
        let (width, count) = self.buckets();
        let current = now_us - now_us % width;
        (0..count)
            .filter_map(|i| current.checked_sub(i * width))
            .map(|start| set.bucket(self, start))
            .collect()
    }
}

/// Summed counts, largest first (ties by value).
pub fn ranked(sums: std::collections::HashMap<String, u64>) -> Vec<(String, u64)> {
    let mut all: Vec<(String, u64)> = sums.into_iter().collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    all
}

/// The buckets of top values: ten seconds, and a minute.
pub const TOP_SHORT_BUCKET_US: u64 = 10_000_000;
pub const TOP_LONG_BUCKET_US: u64 = 60_000_000;
/// How long a bucket of top values is kept: the hour it serves and ten minutes.
pub const TOP_BUCKET_TTL_US: u64 = 4_200_000_000;

/// How long a second of outcome counts is kept: the dashboard's fifteen minutes, and one more.
pub const SERIES_TTL_US: u64 = 960_000_000;

/// One run-time entry of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    pub value: String,
    /// When it expires, in microseconds since the Unix epoch; `None`: never.
    pub expires_us: Option<u64>,
}
