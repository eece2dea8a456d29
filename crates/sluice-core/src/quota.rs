//! Envoy's Rate Limit Quota Service (RLQS), without gRPC: usage reports in, quota assignments out.
//!
//! Each Envoy keeps one stream open and reports, per bucket, how many requests it allowed and denied since its last
//! report; it decides requests itself from the assignment it holds, so no request waits on sluice. Here:
//!
//! - every report is charged to the bucket's quota, an ordinary counter in the store ([`Limiter::charge_usage`]), so
//!   all Envoys and all sluice instances on one store share it;
//! - each Envoy holds a grant: tokens handed to it and not yet reported used, recorded in the bucket's ledger in the
//!   same store ([`Limiter::grant_quota`], [`crate::store::Grants::grant`]). A grant comes from what no Envoy holds,
//!   up to the Envoy's max-min fair share, by demand, of what is left (its demand: its requests, allowed or denied,
//!   over the last [`DEMAND_WINDOW_US`], two report intervals; at least 1); an Envoy above its share gives back what the others
//!   lack. So the tokens all Envoys hold never add up to more than what is left;
//! - a grant reaches Envoy as a token bucket that does not refill (one token per [`NO_REFILL_S`]), sized from what
//!   sluice knows the Envoy holds (`quota/holding.rs`: Envoy 1.40 keeps a bucket whose settings did not change,
//!   starts one whose settings changed at the old one's fill fraction, and one after a DENY_ALL full). Tokens handed
//!   out are not taken back: an Envoy above its share has its bucket shrunk, and its ledger entry goes down when its
//!   next report says what it did not spend. With nothing for it, an Envoy gets DENY_ALL until a request fits again
//!   or another Envoy gives tokens back;
//! - when an Envoy joins a bucket or its demand changes (by half or double), when it gives tokens back, and when a
//!   report finds it short of its share, every stream of the bucket on every instance is told ([`Notice::Quota`],
//!   through the store) and sizes its grant again at once;
//! - assignments carry a TTL and are refreshed before it lapses (a third of it, and at least two seconds plus one
//!   tick, before); buckets reported with no requests for `abandon_after_seconds` are abandoned, and their grants
//!   given back.
//!
//! The overshoot this allows is bounded and stated in the docs (`docs/src/rlqs.md`).
//!
//! A face drives one [`QuotaStream`] per stream: [`Quotas::report`] for each message, [`Quotas::tick`] about once a
//! second and whenever [`QuotaStream::wake`] fires, and drops it when the stream ends.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::limiter::{Charged, Claim, LimitError, Limiter, QuotaState, Usage};
use crate::metrics::{MAX_COUNTED, QuotaStats};
use crate::rules::{BucketSettings, InitialAssignment};
use crate::store::{Granted, MAX_LEDGER_AMOUNT, Notice, Store};

mod holding;

use holding::{Change, Holding};

/// The window over which each stream's demand for a bucket is counted, in microseconds: two of Envoy's 5 s report
/// periods.
pub const DEMAND_WINDOW_US: u64 = 10_000_000;

/// The fill interval of the token buckets sluice sends, in seconds (about 31 years): one token per interval, so an
/// Envoy's bucket holds what it was granted and nothing more.
pub const NO_REFILL_S: u32 = 1_000_000_000;

/// How often a face calls [`Quotas::tick`] at most apart: refreshes are due one tick early, so that they still go
/// out two seconds before a TTL lapses.
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

/// The Rate Limit Quota Service over a limiter: every stream's state, and who watches which bucket's ledger.
pub struct Quotas<S> {
    limiter: Arc<Limiter<S>>,
    caps: QuotaCaps,
    streams: AtomicUsize,
    /// For each ledger (a bucket's quota), the inboxes of the streams of this instance that report it.
    watchers: Mutex<HashMap<String, Vec<Weak<Inbox>>>>,
    /// Buckets watched, summed over streams (the length of every list of `watchers`).
    watched: AtomicUsize,
    stats: QuotaStats,
    /// Whether the task that hands the store's notices to the streams runs.
    listening: AtomicBool,
    /// What each stream of this instance was last told about each of its buckets: the dashboard's view of the shares.
    board: Mutex<HashMap<(String, BucketId), Assigned>>,
}

/// The last assignment a stream sent for a bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    /// The stream, as the ledgers name it.
    pub holder: String,
    pub domain: String,
    pub bucket: BucketId,
    pub strategy: Strategy,
    /// When it was sent, in microseconds since the Unix epoch, and for how long it holds.
    pub sent_us: u64,
    pub ttl_s: u32,
}

/// Where other streams leave the ledgers a stream should look at again.
#[derive(Debug, Default)]
pub struct Inbox {
    dirty: Mutex<Dirty>,
    wake: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Dirty {
    ledgers: HashSet<String>,
    /// Notices may have been missed: every bucket.
    all: bool,
}

/// One stream's state: its domain, the buckets it reports and its name in the ledgers.
pub struct QuotaStream {
    domain: Option<Arc<str>>,
    holder: String,
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
    /// The bucket's ledger, once a limited rule matched it.
    ledger: Option<String>,
    /// The last report with requests in it (or the first report).
    active_us: u64,
    /// The last assignment sent, when, and the TTL it carried (seconds); `None` before the first.
    sent: Option<(Strategy, u64, u32)>,
    /// A DENY_ALL holds until then; a new assignment is due.
    retry_at_us: Option<u64>,
    demand: Demand,
    /// What the Envoy holds, as far as sluice can know it.
    holding: Holding,
    /// The bucket's ledger entry for this stream, as last written.
    entry: u64,
    /// The want the bucket's other streams were last told of.
    announced_want: u64,
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

    /// The stream's name in the buckets' ledgers.
    pub fn holder(&self) -> &str {
        &self.holder
    }
}

/// One bucket to size a grant for, after its report (or a read) was charged.
struct Due {
    bucket: BucketId,
    charged: Charged,
    /// From a report: its allowed and denied requests.
    report: Option<(u64, u64)>,
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
            listening: AtomicBool::new(false),
            board: Mutex::new(HashMap::new()),
        })
    }

    /// The assignments the open streams of this instance last sent, by domain, bucket and stream: each Envoy's share
    /// of its buckets' quotas (a token bucket's `max_tokens`), what it may pass, or what it must deny.
    pub fn assignments(&self) -> Vec<Assigned> {
        let mut all: Vec<Assigned> = lock(&self.board).values().cloned().collect();
        all.sort_by(|a, b| (&a.domain, &a.bucket, &a.holder).cmp(&(&b.domain, &b.bucket, &b.holder)));
        all
    }

    /// Notes what a stream was just told.
    fn post(&self, stream: &QuotaStream, actions: &[Action]) {
        if actions.is_empty() {
            return;
        }
        let now = self.limiter.now_us();
        let domain = stream.domain.as_deref().unwrap_or_default();
        let mut board = lock(&self.board);
        for action in actions {
            match action {
                Action::Assign {
                    bucket,
                    strategy,
                    ttl_s,
                    ..
                } => {
                    board.insert(
                        (stream.holder.clone(), bucket.clone()),
                        Assigned {
                            holder: stream.holder.clone(),
                            domain: domain.to_string(),
                            bucket: bucket.clone(),
                            strategy: *strategy,
                            sent_us: now,
                            ttl_s: *ttl_s,
                        },
                    );
                }
                Action::Abandon { bucket } => {
                    board.remove(&(stream.holder.clone(), bucket.clone()));
                }
            }
        }
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
        self.listen();
        self.stats.streams.increment(1.0);
        let inbox = Arc::new(Inbox::default());
        let quotas = Arc::downgrade(self);
        Ok(QuotaStream {
            domain: None,
            holder: crate::limiter::new_lease(),
            buckets: HashMap::new(),
            inbox,
            release: Some(Box::new(move |stream: &QuotaStream| {
                if let Some(quotas) = quotas.upgrade() {
                    quotas.streams.fetch_sub(1, Ordering::AcqRel);
                    quotas.stats.streams.decrement(1.0);
                    for ledger in stream.buckets.values().filter_map(|w| w.ledger.as_ref()) {
                        quotas.unwatch(ledger, &stream.inbox);
                    }
                    quotas.stats.buckets.set(quotas.watched.load(Ordering::Relaxed) as f64);
                    lock(&quotas.board).retain(|(holder, _), _| *holder != stream.holder);
                }
            })),
        })
    }

    /// Starts, once and inside a runtime, the task that hands the store's notices to the streams that watch the
    /// ledgers they name.
    fn listen(self: &Arc<Self>) {
        if tokio::runtime::Handle::try_current().is_err() || self.listening.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut notices = self.limiter.store().notices();
        let quotas = Arc::downgrade(self);
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                let notice = notices.recv().await;
                let Some(quotas) = quotas.upgrade() else { return };
                match notice {
                    Ok(Notice::Quota(ledgers)) => {
                        for ledger in &ledgers {
                            quotas.notify(ledger, None);
                        }
                    }
                    Ok(Notice::Missed) | Err(RecvError::Lagged(_)) => quotas.notify_all(),
                    Ok(Notice::Freed(_) | Notice::Lists(_)) => {}
                    Err(RecvError::Closed) => return,
                }
            }
        });
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
        let mut due = Vec::with_capacity(usages.len());
        for (usage, charged) in usages.into_iter().zip(charged) {
            let Some(charged) = charged else { continue };
            let requests = usage.allowed.saturating_add(usage.denied);
            let first = !stream.buckets.contains_key(&usage.bucket);
            let settings = settings_of(&charged);
            let watch = stream.buckets.entry(usage.bucket.clone()).or_insert_with(|| Watch {
                settings,
                ledger: None,
                active_us: now,
                sent: None,
                retry_at_us: None,
                demand: Demand::default(),
                holding: Holding::default(),
                entry: 0,
                announced_want: 0,
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
            match initial {
                Some(strategy) => {
                    watch.consume(now, usage.allowed, usage.denied);
                    let action = self.assign(watch, usage.bucket, strategy, settings.assignment_ttl_s, false);
                    self.record(watch, &action, now);
                    actions.push(action);
                }
                None => due.push(Due {
                    bucket: usage.bucket,
                    charged,
                    report: Some((usage.allowed, usage.denied)),
                }),
            }
        }
        actions.extend(self.size(stream, &domain, due, now, true).await);
        self.stats.buckets.set(self.watched.load(Ordering::Relaxed) as f64);
        self.post(stream, &actions);
        Ok(actions)
    }

    /// A stream's periodic work: abandons buckets idle for too long (giving their grants back), and sizes again the
    /// buckets where that is due (a TTL about to lapse, a DENY_ALL whose window allows more again, or news from
    /// another stream), sending what changed.
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
        let mut leaving = Vec::new();
        for bucket in idle {
            if let Some(watch) = stream.buckets.remove(&bucket) {
                if let Some(ledger) = &watch.ledger {
                    self.unwatch(ledger, &stream.inbox);
                    leaving.push(bucket.clone());
                }
            }
            self.stats.abandoned.increment(1);
            actions.push(Action::Abandon { bucket });
        }
        if !leaving.is_empty() {
            // The Envoy forgets the bucket and its tokens: they go back to the quota.
            let claims: Vec<Claim<'_>> = leaving
                .iter()
                .map(|bucket| Claim {
                    bucket,
                    holder: &stream.holder,
                    held: 0,
                    want: 0,
                    ttl_us: 0,
                })
                .collect();
            let _ = self.limiter.grant_quota(&domain, &claims).await;
        }
        let due: Vec<Usage> = stream
            .buckets
            .iter()
            .filter(|(_, w)| dirty.all || w.ledger.as_ref().is_some_and(|l| dirty.ledgers.contains(l)) || w.due(now))
            .map(|(bucket, _)| Usage {
                bucket: bucket.clone(),
                ..Usage::default()
            })
            .collect();
        if !due.is_empty() {
            let charged = self.charge(&domain, &due).await?;
            let due = due
                .into_iter()
                .zip(charged)
                .filter_map(|(usage, charged)| {
                    Some(Due {
                        bucket: usage.bucket,
                        charged: charged?,
                        report: None,
                    })
                })
                .collect();
            actions.extend(self.size(stream, &domain, due, now, false).await);
        }
        if !actions.is_empty() {
            self.stats.buckets.set(self.watched.load(Ordering::Relaxed) as f64);
        }
        self.post(stream, &actions);
        Ok(actions)
    }

    /// Sizes each due bucket's grant and turns it into assignments: after a report, one for every bucket; on a tick,
    /// only those that changed or are due.
    async fn size(
        &self,
        stream: &mut QuotaStream,
        domain: &Arc<str>,
        due: Vec<Due>,
        now: u64,
        reported: bool,
    ) -> Vec<Action> {
        let mut actions = Vec::with_capacity(due.len());
        let mut claimed: Vec<(BucketId, QuotaState, u64)> = Vec::new();
        for Due {
            bucket,
            charged,
            report,
        } in due
        {
            let Some(watch) = stream.buckets.get_mut(&bucket) else {
                continue;
            };
            watch.settings = settings_of(&charged);
            if let Some((allowed, denied)) = report {
                watch.consume(now, allowed, denied);
            } else {
                watch.lapse(now);
            }
            let ttl = watch.settings.assignment_ttl_s;
            match charged {
                Charged::Limited(state) if !state.shadow => {
                    let ledger = state.ledger.as_str().to_string();
                    if watch.ledger.as_deref() != Some(ledger.as_str()) {
                        if let Some(old) = watch.ledger.take() {
                            self.unwatch(&old, &stream.inbox);
                        }
                        self.watch(&ledger, &stream.inbox);
                        watch.ledger = Some(ledger);
                    }
                    let want = watch.demand.estimate(now).clamp(1, MAX_LEDGER_AMOUNT);
                    claimed.push((bucket, state, want));
                }
                // No limit, or one that only counts: everything passes.
                _ => {
                    let unchanged = watch.sent.is_some_and(|(s, _, _)| s == Strategy::AllowAll);
                    if reported || !unchanged || watch.due(now) {
                        let action = self.assign(watch, bucket, Strategy::AllowAll, ttl, false);
                        self.record(watch, &action, now);
                        actions.push(action);
                    }
                }
            }
        }
        if claimed.is_empty() {
            return actions;
        }
        let claims: Vec<Claim<'_>> = claimed
            .iter()
            .map(|(bucket, state, want)| {
                let watch = &stream.buckets[bucket];
                Claim {
                    bucket,
                    holder: &stream.holder,
                    held: watch.holding.exposure().min(MAX_LEDGER_AMOUNT),
                    want: *want,
                    ttl_us: (u64::from(state.settings.assignment_ttl_s) + 1) * 1_000_000,
                }
            })
            .collect();
        let granted = self.limiter.grant_quota(domain, &claims).await;
        let mut announce = Vec::new();
        for ((bucket, state, want), granted) in claimed.into_iter().zip(granted) {
            let granted = match granted {
                Ok(Some(granted)) => granted,
                Ok(None) => continue,
                Err(e) => {
                    // Its Envoy keeps its assignment until the TTL lapses, then follows its expired-assignment
                    // behaviour.
                    tracing::warn!(error = %e, "an RLQS grant could not be sized");
                    continue;
                }
            };
            let Some(watch) = stream.buckets.get_mut(&bucket) else {
                continue;
            };
            let (kind, size, due) = (watch.sent.map(|s| s.0), watch.holding.size(), watch.due(now));
            // The first to find the quota spent tells the others, who hold tokens that are no longer there.
            let exhausted = granted.left == 0 && watch.retry_at_us.is_none() && watch.sent.is_some();
            if exhausted {
                self.stats.exhausted.increment(1);
            }
            let tell = exhausted
                || watch.announced_want == 0
                || want >= watch.announced_want.saturating_mul(2)
                || want.saturating_mul(2) <= watch.announced_want
                || granted.entry < watch.entry
                || (reported && granted.held < granted.share);
            watch.entry = granted.entry;
            let action = self.deliver(watch, bucket, &state, granted, now, reported);
            if tell {
                watch.announced_want = want;
                announce.extend(watch.ledger.clone());
            }
            // On a tick, only what changed (a bucket that starts full always does, even at the same size), or a
            // refresh that is due.
            let Action::Assign { strategy, fresh, .. } = &action else {
                continue;
            };
            if reported || due || *fresh || kind != Some(*strategy) || size != watch.holding.size() {
                self.record(watch, &action, now);
                actions.push(action);
            }
        }
        if !announce.is_empty() {
            for ledger in &announce {
                self.notify(ledger, Some(&stream.inbox));
            }
            self.limiter.store().announce(Notice::Quota(announce)).await;
        }
        actions
    }

    /// The assignment that brings the Envoy to `granted.held` tokens, given what it holds ([`Holding::resize`]).
    fn deliver(
        &self,
        watch: &mut Watch,
        bucket: BucketId,
        state: &QuotaState,
        granted: Granted,
        now: u64,
        reported: bool,
    ) -> Action {
        let ttl = watch.settings.assignment_ttl_s;
        let (size, fresh) = match (watch.holding.resize(granted.held, reported), watch.holding.size()) {
            (Change::Resize(size), _) | (Change::Keep, Some(size)) => (size, false),
            (Change::Fresh(size), _) => (size, true),
            (Change::Deny, _) | (Change::Keep, None) => {
                // With nothing left, DENY_ALL until a request fits again (sluice sends a new assignment then),
                // within the TTL; with tokens held by others, until they give some back (they tell), or the TTL.
                let retry = (granted.left == 0).then(|| retry_after(state));
                watch.retry_at_us = retry.map(|r| now.saturating_add(r));
                let ttl = match retry {
                    Some(r) => u32::try_from(r.div_ceil(1_000_000)).unwrap_or(u32::MAX).clamp(1, ttl),
                    None => ttl,
                };
                return self.assign(watch, bucket, Strategy::DenyAll, ttl, false);
            }
        };
        let strategy = Strategy::TokenBucket {
            max_tokens: size,
            tokens_per_fill: 1,
            fill_interval_s: NO_REFILL_S,
        };
        self.assign(watch, bucket, strategy, ttl, fresh)
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

    /// An assignment of `strategy` for `bucket`; see [`Action::Assign`].
    fn assign(&self, watch: &mut Watch, bucket: BucketId, strategy: Strategy, ttl_s: u32, fresh: bool) -> Action {
        if strategy != Strategy::DenyAll {
            watch.retry_at_us = None;
        }
        match strategy {
            // Not counted in a ledger: whatever the Envoy admits is charged when it reports.
            Strategy::AllowAll => watch.holding.clear(),
            Strategy::DenyAll => watch.holding.drop_bucket(),
            Strategy::TokenBucket { .. } => {}
        }
        Action::Assign {
            bucket,
            strategy,
            ttl_s: ttl_s.max(1),
            fresh,
        }
    }

    /// Notes an assignment as sent: its TTL runs from now.
    fn record(&self, watch: &mut Watch, action: &Action, now: u64) {
        let Action::Assign { strategy, ttl_s, .. } = action else {
            return;
        };
        watch.sent = Some((*strategy, now, *ttl_s));
        match strategy {
            Strategy::AllowAll => &self.stats.allow_all,
            Strategy::DenyAll => &self.stats.deny_all,
            Strategy::TokenBucket { .. } => &self.stats.token_bucket,
        }
        .increment(1);
    }

    fn watch(&self, ledger: &str, inbox: &Arc<Inbox>) {
        lock(&self.watchers)
            .entry(ledger.to_string())
            .or_default()
            .push(Arc::downgrade(inbox));
        self.watched.fetch_add(1, Ordering::Relaxed);
    }

    /// Ends one stream's watch of a ledger (each stream removes only its own, so the count stays exact).
    fn unwatch(&self, ledger: &str, inbox: &Arc<Inbox>) {
        let mut watchers = lock(&self.watchers);
        if let Some(list) = watchers.get_mut(ledger) {
            let before = list.len();
            list.retain(|w| !std::ptr::eq(w.as_ptr(), Arc::as_ptr(inbox)));
            self.watched.fetch_sub(before - list.len(), Ordering::Relaxed);
            if list.is_empty() {
                watchers.remove(ledger);
            }
        }
    }

    /// Asks every stream of this instance that watches the ledger, but `except`, to size its grant again.
    fn notify(&self, ledger: &str, except: Option<&Arc<Inbox>>) {
        let watchers = lock(&self.watchers);
        let Some(list) = watchers.get(ledger) else {
            return;
        };
        for other in list.iter().filter_map(Weak::upgrade) {
            if except.is_none_or(|e| !Arc::ptr_eq(&other, e)) {
                lock(&other.dirty).ledgers.insert(ledger.to_string());
                other.wake.notify_one();
            }
        }
    }

    /// Asks every stream of this instance to size all its grants again (notices may have been missed).
    fn notify_all(&self) {
        let watchers = lock(&self.watchers);
        for inbox in watchers.values().flatten().filter_map(Weak::upgrade) {
            lock(&inbox.dirty).all = true;
            inbox.wake.notify_one();
        }
    }
}

impl Watch {
    /// A report: what the Envoy admitted came out of what it held, and a denial says it had less than a token.
    fn consume(&mut self, now: u64, allowed: u64, denied: u64) {
        self.lapse(now);
        self.holding.report(allowed, denied);
    }

    /// An assignment whose TTL has lapsed is gone from the Envoy, and its token bucket with it.
    fn lapse(&mut self, now: u64) {
        if self
            .sent
            .is_some_and(|(_, at, ttl)| now >= at.saturating_add(u64::from(ttl) * 1_000_000))
        {
            self.holding.drop_bucket();
        }
    }

    /// Whether a new assignment is due: a DENY_ALL whose window allows more, or the TTL the last one carried
    /// within a third of lapsing, and never less than two seconds plus one tick: a face that ticks every second
    /// refreshes at least two seconds before the lapse.
    fn due(&self, now: u64) -> bool {
        if self.retry_at_us.is_some_and(|at| now >= at) {
            return true;
        }
        match self.sent {
            None => true,
            Some((_, at, ttl_s)) => due_at(at, ttl_s, now),
        }
    }
}

/// Whether an assignment sent at `at` with a TTL of `ttl_s` is due for a refresh at `now`: a third of the TTL (at
/// least 2 s) before it lapses, plus a tick and a quarter, so that the tick that finds it due (up to a tick later, and
/// itself a little late when the host is busy) still refreshes it that long before.
fn due_at(at: u64, ttl_s: u32, now: u64) -> bool {
    let ttl = u64::from(ttl_s) * 1_000_000;
    let margin = ((ttl / 3).max(2_000_000) + TICK_US + TICK_US / 4).min(ttl);
    now >= at.saturating_add(ttl - margin)
}

/// The settings of the rule a bucket matched (defaults when none did).
fn settings_of(charged: &Charged) -> BucketSettings {
    match charged {
        Charged::Limited(state) => state.settings,
        _ => BucketSettings::default(),
    }
}

/// When a request fits the quota again, from now: the latest of its exhausted limits'.
fn retry_after(state: &QuotaState) -> u64 {
    state
        .tiers
        .iter()
        .filter(|t| t.remaining == 0)
        .map(|t| t.retry_after_us)
        .max()
        .unwrap_or(1_000_000)
        .max(1)
}

/// One stream's requests for a bucket over the last [`DEMAND_WINDOW_US`], estimated as a sliding window over two
/// epoch-aligned windows.
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
