//! Envoy's Rate Limit Quota Service (RLQS), without gRPC: usage reports in, quota assignments out.
//!
//! Each Envoy keeps one stream open and reports, per bucket, how many requests it allowed and denied since its last
//! report; it decides requests itself from the assignment it holds, so no request waits on sluice. Here:
//!
//! - every report is charged to the bucket's quota, an ordinary counter in the store ([`Limiter::charge_usage`]), so
//!   all Envoys and all sluice instances on one store share it;
//! - each Envoy gets a token bucket holding its share of what is left, the share being its part of the bucket's
//!   recent demand (allowed plus denied, counted in the store too): `floor(remaining * own / all)`, at least 1. With
//!   nothing left, it gets DENY_ALL until a request fits again, and sluice pushes a new assignment then;
//! - assignments carry a TTL and are refreshed before it lapses (a third of it, and at least two seconds plus one
//!   tick, before); buckets reported with no requests for
//!   `abandon_after_seconds` are abandoned; when a report exhausts a quota or a new Envoy joins a bucket, the other
//!   streams of this instance that watch it are told at once.
//!
//! The overshoot this allows is bounded and stated in the docs (`docs/src/rlqs.md`).
//!
//! A face drives one [`QuotaStream`] per stream: [`Quotas::report`] for each message, [`Quotas::tick`] about once a
//! second and whenever [`QuotaStream::wake`] fires, and drops it when the stream ends.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::limiter::{Charged, DEMAND_WINDOW_US, LimitError, Limiter, QuotaState, Usage};
use crate::metrics::{MAX_COUNTED, QuotaStats};
use crate::rules::{Algorithm, BucketSettings, InitialAssignment};
use crate::store::Store;

/// A bucket id: its entries sorted by key.
pub type BucketId = Vec<(String, String)>;

/// A bucket of a domain, as the streams of one instance watch it.
type Watched = (Arc<str>, BucketId);

/// How an Envoy decides a bucket's requests until its next assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    AllowAll,
    DenyAll,
    /// Starts full; refills `tokens_per_fill` every `fill_interval_s` seconds (continuously, in Envoy).
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

/// The Rate Limit Quota Service over a limiter: every stream's state, and who watches which bucket.
pub struct Quotas<S> {
    limiter: Arc<Limiter<S>>,
    caps: QuotaCaps,
    streams: AtomicUsize,
    /// For each bucket of a domain, the inboxes of the streams of this instance that report it.
    watchers: Mutex<HashMap<Watched, Vec<Weak<Inbox>>>>,
    /// Buckets watched, summed over streams (the length of every list of `watchers`).
    watched: AtomicUsize,
    stats: QuotaStats,
}

/// Where other streams leave the buckets a stream should look at again.
#[derive(Debug, Default)]
pub struct Inbox {
    dirty: Mutex<HashSet<BucketId>>,
    wake: tokio::sync::Notify,
}

/// One stream's state: its domain and the buckets it reports.
pub struct QuotaStream {
    domain: Option<Arc<str>>,
    buckets: HashMap<BucketId, Watch>,
    inbox: Arc<Inbox>,
    /// Gives the stream's place back, and its watches, when the stream is dropped.
    release: Option<Release>,
}

/// What a stream does when it ends.
type Release = Box<dyn FnOnce(&QuotaStream) + Send + Sync>;

impl Drop for QuotaStream {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release(self);
        }
    }
}

/// What a stream knows of one of its buckets.
#[derive(Debug, Clone)]
struct Watch {
    settings: BucketSettings,
    /// The last report with requests in it (or the first report).
    active_us: u64,
    /// The last assignment sent, when, and the TTL it carried (seconds); `None` before the first.
    sent: Option<(Strategy, u64, u32)>,
    /// A DENY_ALL holds until then; a new assignment is due.
    retry_at_us: Option<u64>,
    demand: Demand,
}

impl QuotaStream {
    /// Fires when another stream left work for this one: call [`Quotas::tick`].
    pub async fn wake(&self) {
        self.inbox.wake.notified().await;
    }

    /// How many buckets the stream reports.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }
}

impl<S: Store> Quotas<S> {
    pub fn new(limiter: Arc<Limiter<S>>, caps: QuotaCaps) -> Arc<Quotas<S>> {
        let stats = limiter.metrics().quota_stats();
        Arc::new(Quotas {
            limiter,
            caps,
            streams: AtomicUsize::new(0),
            watchers: Mutex::new(HashMap::new()),
            watched: AtomicUsize::new(0),
            stats,
        })
    }

    /// Opens a stream, if the server has room for one more.
    pub fn open(self: &Arc<Self>) -> Result<QuotaStream, QuotaError> {
        let open = self.streams.fetch_add(1, Ordering::AcqRel);
        if open >= self.caps.max_streams {
            self.streams.fetch_sub(1, Ordering::AcqRel);
            return Err(QuotaError::OverCap(format!(
                "the server already has {open} RLQS streams open, its cap (--rlqs-max-streams)"
            )));
        }
        self.stats.streams.increment(1.0);
        let inbox = Arc::new(Inbox::default());
        let quotas = Arc::downgrade(self);
        Ok(QuotaStream {
            domain: None,
            buckets: HashMap::new(),
            inbox,
            release: Some(Box::new(move |stream: &QuotaStream| {
                if let Some(quotas) = quotas.upgrade() {
                    quotas.streams.fetch_sub(1, Ordering::AcqRel);
                    quotas.stats.streams.decrement(1.0);
                    if let Some(domain) = &stream.domain {
                        for bucket in stream.buckets.keys() {
                            quotas.unwatch(domain, bucket, &stream.inbox);
                        }
                    }
                    quotas.stats.buckets.set(quotas.watched.load(Ordering::Relaxed) as f64);
                }
            })),
        })
    }

    /// Charges one message's usage and answers with an assignment for each bucket it names.
    pub async fn report(&self, stream: &mut QuotaStream, report: Report) -> Result<Vec<Action>, QuotaError> {
        let domain = self.check(stream, &report)?;
        let now = self.limiter.now_us();
        let mut usages: Vec<Usage> = Vec::with_capacity(report.usages.len());
        let mut seen: HashMap<BucketId, usize> = HashMap::with_capacity(report.usages.len());
        for reported in report.usages {
            let mut bucket = reported.bucket;
            bucket.sort_unstable();
            match seen.get(&bucket) {
                // The same bucket twice in one message: one report of both.
                Some(&i) => {
                    let u = &mut usages[i];
                    u.allowed = u.allowed.saturating_add(reported.allowed);
                    u.denied = u.denied.saturating_add(reported.denied);
                }
                None => {
                    seen.insert(bucket.clone(), usages.len());
                    usages.push(Usage {
                        bucket,
                        allowed: reported.allowed,
                        denied: reported.denied,
                    });
                }
            }
        }
        let new = usages
            .iter()
            .filter(|u| !stream.buckets.contains_key(&u.bucket))
            .count();
        if stream.buckets.len() + new > self.caps.max_buckets_per_stream {
            return Err(QuotaError::OverCap(format!(
                "bucket_quota_usages: the stream would report {} buckets, over the cap of {} (--rlqs-max-buckets)",
                stream.buckets.len() + new,
                self.caps.max_buckets_per_stream
            )));
        }
        // Each bucket's amounts counted as at most MAX_COUNTED, and summed without wrapping: a counter never goes
        // backwards, whatever a client reports.
        let (mut allowed, mut denied) = (0u64, 0u64);
        for u in &usages {
            allowed = allowed.saturating_add(u.allowed.min(MAX_COUNTED));
            denied = denied.saturating_add(u.denied.min(MAX_COUNTED));
        }
        self.stats.allowed.increment(allowed);
        self.stats.denied.increment(denied);
        let charged = self.charge(&domain, &usages).await?;

        let mut actions = Vec::with_capacity(usages.len());
        for (usage, charged) in usages.into_iter().zip(charged) {
            let Some(charged) = charged else { continue };
            let requests = usage.allowed.saturating_add(usage.denied);
            let first = !stream.buckets.contains_key(&usage.bucket);
            if first {
                self.watch(&domain, &usage.bucket, &stream.inbox);
                self.notify(&domain, &usage.bucket, &stream.inbox);
            }
            let settings = settings_of(&charged);
            let watch = stream.buckets.entry(usage.bucket.clone()).or_insert_with(|| Watch {
                settings,
                active_us: now,
                sent: None,
                retry_at_us: None,
                demand: Demand::default(),
            });
            watch.settings = settings;
            watch.demand.add(now, requests);
            if requests > 0 {
                watch.active_us = now;
            }
            let initial = match settings.initial {
                InitialAssignment::AllowAll if first => Some(Strategy::AllowAll),
                InitialAssignment::DenyAll if first => Some(Strategy::DenyAll),
                _ => None,
            };
            let newly_exhausted = exhausted(&charged) && watch.retry_at_us.is_none();
            let action = match initial {
                Some(strategy) => self.assign(watch, usage.bucket.clone(), strategy, settings.assignment_ttl_s, now),
                None => self.sized(watch, usage.bucket.clone(), &charged, now),
            };
            if newly_exhausted {
                self.stats.exhausted.increment(1);
                self.notify(&domain, &usage.bucket, &stream.inbox);
            }
            actions.push(action);
        }
        self.stats.buckets.set(self.watched.load(Ordering::Relaxed) as f64);
        Ok(actions)
    }

    /// A stream's periodic work: abandons buckets idle for too long, and sends new assignments where one is due (a
    /// TTL about to lapse, a DENY_ALL whose window allows more again, or news from another stream).
    pub async fn tick(&self, stream: &mut QuotaStream) -> Result<Vec<Action>, QuotaError> {
        let Some(domain) = stream.domain.clone() else {
            return Ok(Vec::new());
        };
        let now = self.limiter.now_us();
        let dirty = std::mem::take(&mut *lock(&stream.inbox.dirty));
        let mut actions = Vec::new();
        let idle: Vec<BucketId> = stream
            .buckets
            .iter()
            .filter(|(_, w)| now.saturating_sub(w.active_us) >= u64::from(w.settings.abandon_after_s) * 1_000_000)
            .map(|(b, _)| b.clone())
            .collect();
        for bucket in idle {
            stream.buckets.remove(&bucket);
            self.unwatch(&domain, &bucket, &stream.inbox);
            self.stats.abandoned.increment(1);
            actions.push(Action::Abandon { bucket });
        }
        let due: Vec<Usage> = stream
            .buckets
            .iter()
            .filter(|(bucket, w)| dirty.contains(*bucket) || w.due(now))
            .map(|(bucket, _)| Usage {
                bucket: bucket.clone(),
                ..Usage::default()
            })
            .collect();
        if !due.is_empty() {
            let charged = self.charge(&domain, &due).await?;
            for (usage, charged) in due.into_iter().zip(charged) {
                let (Some(charged), Some(watch)) = (charged, stream.buckets.get_mut(&usage.bucket)) else {
                    continue;
                };
                watch.settings = settings_of(&charged);
                actions.push(self.sized(watch, usage.bucket, &charged, now));
            }
        }
        if !actions.is_empty() {
            self.stats.buckets.set(self.watched.load(Ordering::Relaxed) as f64);
        }
        Ok(actions)
    }

    /// Checks a message and returns the stream's domain (set by its first message).
    fn check(&self, stream: &mut QuotaStream, report: &Report) -> Result<Arc<str>, QuotaError> {
        let cap = self.caps.max_value_bytes;
        let over = |field: String, len: usize| {
            QuotaError::Invalid(format!(
                "{field} is {len} bytes, over the cap of {cap} (--max-value-bytes)"
            ))
        };
        let domain = match (&stream.domain, report.domain.as_str()) {
            (Some(d), "") => d.clone(),
            (Some(d), sent) if **d == *sent => d.clone(),
            (Some(d), sent) => {
                return Err(QuotaError::Invalid(format!(
                    "domain: '{sent}' differs from the stream's domain '{d}'"
                )));
            }
            (None, "") => {
                return Err(QuotaError::Invalid(
                    "domain: empty in the stream's first message".into(),
                ));
            }
            (None, sent) if sent.len() > cap => return Err(over("domain".into(), sent.len())),
            (None, sent) => {
                let d: Arc<str> = Arc::from(sent);
                stream.domain = Some(d.clone());
                d
            }
        };
        if report.usages.is_empty() {
            return Err(QuotaError::Invalid("bucket_quota_usages: empty".into()));
        }
        for (i, usage) in report.usages.iter().enumerate() {
            let at = format!("bucket_quota_usages[{i}].bucket_id.bucket");
            if usage.bucket.is_empty() {
                return Err(QuotaError::Invalid(format!("{at}: the bucket id has no entries")));
            }
            for (k, v) in &usage.bucket {
                if k.is_empty() {
                    return Err(QuotaError::Invalid(format!("{at}: a key is empty")));
                }
                if k.len() > cap {
                    return Err(over(format!("{at}: key '{}…'", truncated(k)), k.len()));
                }
                if v.len() > cap {
                    return Err(over(format!("{at}['{}']", truncated(k)), v.len()));
                }
            }
        }
        Ok(domain)
    }

    /// Charges usages; `None` where a bucket's counters could not be reached (its Envoy keeps its assignment until
    /// the TTL lapses, then follows its own expired-assignment behaviour).
    async fn charge(&self, domain: &str, usages: &[Usage]) -> Result<Vec<Option<Charged>>, QuotaError> {
        match self.limiter.charge_usage(domain, usages).await {
            Ok(answers) => Ok(answers
                .into_iter()
                .map(|a| {
                    a.inspect_err(|e| tracing::warn!(error = %e, "an RLQS report could not be charged"))
                        .ok()
                })
                .collect()),
            Err(LimitError::Store(e)) => Err(QuotaError::Unavailable(e.to_string())),
            Err(e) => Err(QuotaError::Invalid(e.to_string())),
        }
    }

    /// The assignment a bucket's state calls for, sized to this stream's share.
    fn sized(&self, watch: &mut Watch, bucket: BucketId, charged: &Charged, now: u64) -> Action {
        let ttl = watch.settings.assignment_ttl_s;
        match charged {
            Charged::NoRule | Charged::Unlimited => self.assign(watch, bucket, Strategy::AllowAll, ttl, now),
            Charged::Limited(state) if state.shadow => self.assign(watch, bucket, Strategy::AllowAll, ttl, now),
            Charged::Limited(state) => {
                let own = watch.demand.estimate(now);
                let (strategy, retry_after_us) = size(state, own);
                watch.retry_at_us = retry_after_us.map(|r| now.saturating_add(r));
                // A DENY_ALL lasts until a request fits again (sluice pushes a new assignment then), within the TTL.
                let ttl = match retry_after_us {
                    Some(r) => u32::try_from(r.div_ceil(1_000_000)).unwrap_or(u32::MAX).clamp(1, ttl),
                    None => ttl,
                };
                self.assign(watch, bucket, strategy, ttl, now)
            }
        }
    }

    fn assign(&self, watch: &mut Watch, bucket: BucketId, strategy: Strategy, ttl_s: u32, now: u64) -> Action {
        if strategy != Strategy::DenyAll {
            watch.retry_at_us = None;
        }
        watch.sent = Some((strategy, now, ttl_s.max(1)));
        match strategy {
            Strategy::AllowAll => &self.stats.allow_all,
            Strategy::DenyAll => &self.stats.deny_all,
            Strategy::TokenBucket { .. } => &self.stats.token_bucket,
        }
        .increment(1);
        Action::Assign {
            bucket,
            strategy,
            ttl_s: ttl_s.max(1),
        }
    }

    fn watch(&self, domain: &Arc<str>, bucket: &BucketId, inbox: &Arc<Inbox>) {
        lock(&self.watchers)
            .entry((domain.clone(), bucket.clone()))
            .or_default()
            .push(Arc::downgrade(inbox));
        self.watched.fetch_add(1, Ordering::Relaxed);
    }

    /// Ends one stream's watch of a bucket (each stream removes only its own, so the count stays exact).
    fn unwatch(&self, domain: &Arc<str>, bucket: &BucketId, inbox: &Arc<Inbox>) {
        let mut watchers = lock(&self.watchers);
        let key = (domain.clone(), bucket.clone());
        if let Some(list) = watchers.get_mut(&key) {
            let before = list.len();
            list.retain(|w| !std::ptr::eq(w.as_ptr(), Arc::as_ptr(inbox)));
            self.watched.fetch_sub(before - list.len(), Ordering::Relaxed);
            if list.is_empty() {
                watchers.remove(&key);
            }
        }
    }

    /// Asks every other stream that watches the bucket to look at it again.
    fn notify(&self, domain: &Arc<str>, bucket: &BucketId, except: &Arc<Inbox>) {
        let watchers = lock(&self.watchers);
        let Some(list) = watchers.get(&(domain.clone(), bucket.clone())) else {
            return;
        };
        for other in list.iter().filter_map(Weak::upgrade) {
            if !Arc::ptr_eq(&other, except) {
                lock(&other.dirty).insert(bucket.clone());
                other.wake.notify_one();
            }
        }
    }
}

impl Watch {
    /// Whether a new assignment is due: a DENY_ALL whose window allows more, or the TTL the last one carried
    /// within a third of lapsing, and never less than two seconds plus one tick: a face that ticks every second
    /// refreshes at least two seconds before the lapse.
    fn due(&self, now: u64) -> bool {
        if self.retry_at_us.is_some_and(|at| now >= at) {
            return true;
        }
        match self.sent {
            None => true,
            Some((_, at, ttl_s)) => {
                let ttl = u64::from(ttl_s) * 1_000_000;
                let margin = ((ttl / 3).max(2_000_000) + TICK_US).min(ttl);
                now >= at.saturating_add(ttl - margin)
            }
        }
    }
}

/// How often a face calls [`Quotas::tick`] at most apart: refreshes are due one tick early, so that they still go
/// out two seconds before a TTL lapses.
pub const TICK_US: u64 = 1_000_000;

/// The settings of the rule a bucket matched (defaults when none did).
fn settings_of(charged: &Charged) -> BucketSettings {
    match charged {
        Charged::Limited(state) => state.settings,
        _ => BucketSettings::default(),
    }
}

fn exhausted(charged: &Charged) -> bool {
    matches!(charged, Charged::Limited(s) if s.tiers.iter().any(|t| t.remaining == 0))
}

/// The strategy for one Envoy whose recent demand is `own`, out of the bucket's `state.demand`; and, for a
/// DENY_ALL, when a request fits again (microseconds from now).
///
/// The share is `own / all` of the demand (an idle Envoy counts as 1), at most 1. The token bucket holds
/// `floor(share * remaining)` tokens, at least 1, of the most constrained limit. It refills at the share of the
/// limit's rate for sliding windows and token buckets, and by 1 token per window for fixed windows (which free
/// nothing until they end, when sluice sends new assignments).
pub fn size(state: &QuotaState, own: u64) -> (Strategy, Option<u64>) {
    let share = (own.max(1) as f64 / state.demand.max(1) as f64).min(1.0);
    let remaining = state.tiers.iter().map(|t| t.remaining).min().unwrap_or(0);
    if remaining == 0 {
        let retry = state
            .tiers
            .iter()
            .filter(|t| t.remaining == 0)
            .map(|t| t.retry_after_us)
            .max()
            .unwrap_or(1_000_000);
        return (Strategy::DenyAll, Some(retry.max(1)));
    }
    let max_tokens = ((remaining as f64 * share).floor() as u64).clamp(1, u64::from(u32::MAX)) as u32;
    let (tokens_per_fill, fill_interval_s) = state
        .tiers
        .iter()
        .map(|t| {
            let window_s = u32::try_from(t.window_us / 1_000_000).unwrap_or(u32::MAX).max(1);
            let fill = match t.algorithm {
                Algorithm::FixedWindow => 1,
                _ => ((t.limit as f64 * share).floor() as u64).clamp(1, u64::from(u32::MAX)) as u32,
            };
            (fill, window_s)
        })
        .min_by(|a, b| (f64::from(a.0) / f64::from(a.1)).total_cmp(&(f64::from(b.0) / f64::from(b.1))))
        .unwrap_or((1, 1));
    (
        Strategy::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_s,
        },
        None,
    )
}

/// One stream's requests for a bucket over the last [`DEMAND_WINDOW_US`], estimated as the store estimates all
/// streams' (a sliding window over two epoch-aligned windows), so that the two compare.
#[derive(Debug, Clone, Copy, Default)]
struct Demand {
    start: u64,
    current: u64,
    previous: u64,
}

impl Demand {
    fn roll(&mut self, now: u64) {
        let start = now - now % DEMAND_WINDOW_US;
        if start == self.start {
            return;
        }
        self.previous = if start == self.start + DEMAND_WINDOW_US {
            self.current
        } else {
            0
        };
        self.current = 0;
        self.start = start;
    }

    fn add(&mut self, now: u64, requests: u64) {
        self.roll(now);
        self.current = self.current.saturating_add(requests);
    }

    fn estimate(&mut self, now: u64) -> u64 {
        self.roll(now);
        let elapsed = now - self.start;
        let carried = u128::from(self.previous) * u128::from(DEMAND_WINDOW_US - elapsed) / u128::from(DEMAND_WINDOW_US);
        u64::try_from(carried).unwrap_or(u64::MAX).saturating_add(self.current)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn truncated(s: &str) -> &str {
    let mut end = s.len().min(32);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
