//! Envoy's Rate Limit Quota Service (RLQS), without gRPC: usage reports in, quota assignments out.
//!
//! Each Envoy keeps one stream open and reports, per bucket, how many requests it allowed and denied since its last
//! report; it decides requests itself from the assignment it holds, so no request waits on sluice. Here:
//!
//! - every report is charged to the bucket's quota, an ordinary counter in the store
//!   ([`Buckets::charge`](crate::limiter::Buckets::charge)), so all Envoys and all sluice instances on one store
//!   share it;
//! - each Envoy holds a grant: tokens handed to it and not yet reported used, recorded in the bucket's ledger in the
//!   same store ([`Buckets::grant`](crate::limiter::Buckets::grant), [`crate::store::Grants::grant`]). A quota
//!   whose limits all have windows of a minute or less is shared as a rate (`quota/grant.rs`, [`RATE_WINDOW_MAX_US`]): refilling token buckets whose
//!   rates add up to its most constrained limit. Any other is a budget: what is left, but a reserve for newcomers, is
//!   handed out, max-min fair by demand and the surplus by demand (its demand: its requests, allowed or denied, over
//!   the last [`DEMAND_WINDOW_US`], two report intervals; at least 1); an Envoy above its share is shrunk to it at
//!   once. A bucket's first grant goes by the streams connected to every instance ([`Quotas::population`]). So the
//!   tokens all Envoys hold never add up to more than what is left;
//! - a budget's grant reaches Envoy as a token bucket that does not refill (one token per [`NO_REFILL_S`]), sized
//!   from what sluice knows the Envoy holds (`quota/holding.rs`: Envoy 1.40 keeps a bucket whose settings did not
//!   change, starts one whose settings changed at the old one's fill fraction, and one after a DENY_ALL full). Tokens
//!   handed out are not taken back: an Envoy above its share has its bucket shrunk, and its ledger entry goes down
//!   when its next report says what it did not spend. With nothing for it, an Envoy gets DENY_ALL until a request
//!   fits again or another Envoy gives tokens back;
//! - when an Envoy joins a bucket or its demand changes (by half or double), when it gives tokens back, and when a
//!   report finds it short of its share, every stream of the bucket on every instance is told
//!   ([`Notice::Quota`](crate::store::Notice::Quota), through the store) and sizes its grant again at once;
//! - assignments carry a TTL and are refreshed before it lapses (a third of it, and at least two seconds plus one
//!   tick, before); buckets reported with no requests for `abandon_after_seconds` are abandoned, and their grants
//!   given back, as are all of a stream's when its Envoy ends it ([`Quotas::leave`]).
//!
//! The overshoot this allows is bounded and stated in the docs (`docs/src/rlqs.md`).
//!
//! A face drives one [`QuotaStream`] per stream: [`Quotas::report`] for each message, [`Quotas::tick`] about once a
//! second and whenever [`QuotaStream::wake`] fires, and drops it when the stream ends.
//!
//! This file owns [`Quotas`]; its parts: `vocabulary` (what a stream says and is told), `stream` (one stream's
//! state), `demand` (a stream's requests for a bucket), `report` (a message charged and answered), `tick` (idle
//! buckets abandoned, grants refreshed), `grant` (grants sized into assignments), `holding` (what an Envoy holds)
//! and `watchers` (who hears of which ledger).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::limiter::Limiter;
use crate::metrics::QuotaStats;

mod demand;
mod grant;
mod holding;
mod report;
mod stream;
mod tick;
mod vocabulary;
mod watchers;

use crate::store::{Announcements, Counters, Grants, STREAMS_EVERY_US};
pub use demand::DEMAND_WINDOW_US;
pub use grant::{RATE_BURST_PARTS, RATE_WINDOW_MAX_US};
pub use stream::{Inbox, QuotaStream};
pub use vocabulary::{Action, BucketId, NO_REFILL_S, QuotaCaps, QuotaError, Report, ReportedUsage, Strategy, TICK_US};

/// The Rate Limit Quota Service over a limiter: every stream's state, and who watches which bucket's ledger.
pub struct Quotas<S> {
    limiter: Arc<Limiter<S>>,
    caps: QuotaCaps,
    streams: AtomicUsize,
    /// This instance's name in [`Notice::Streams`](crate::store::Notice::Streams).
    instance: String,
    /// The streams of the other instances on the store, as they last said, and when that was heard (us).
    fleet: Mutex<HashMap<String, (u64, u64)>>,
    /// Wakes the task that says how many streams this instance has ([`Quotas::listen`]).
    changed: Arc<tokio::sync::Notify>,
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
    /// What its grant means the Envoy to hold of the bucket's quota (a rate: its tokens per window); `None` when the
    /// assignment is not sized from the quota (an ALLOW_ALL, or a rule's initial assignment).
    pub granted: Option<u64>,
    /// The stream's requests for the bucket reported denied while its budget had quota left, so far.
    pub wrongful: u64,
    /// When it was sent, in microseconds since the Unix epoch, and for how long it holds.
    pub sent_us: u64,
    pub ttl_s: u32,
}

impl<S: Counters + Announcements + Grants> Quotas<S> {
    pub fn new(limiter: Arc<Limiter<S>>, caps: QuotaCaps) -> Arc<Quotas<S>> {
        let stats = limiter.metrics().quota_stats();
        Arc::new(Quotas {
            limiter,
            caps,
            streams: AtomicUsize::new(0),
            instance: crate::limiter::new_lease(),
            fleet: Mutex::new(HashMap::new()),
            changed: Arc::new(tokio::sync::Notify::new()),
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

    /// The RLQS streams connected to every instance on the store: this one's, and those the others said they have
    /// within three of their periods ([`STREAMS_EVERY_US`]).
    pub fn population(&self) -> u64 {
        let now = self.limiter.now_us();
        let others: u64 = lock(&self.fleet)
            .values()
            .filter(|(_, heard)| now.saturating_sub(*heard) < 3 * STREAMS_EVERY_US)
            .map(|(count, _)| count)
            .sum();
        (self.streams.load(Ordering::Acquire) as u64).saturating_add(others)
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
                    let watch = stream.buckets.get(bucket);
                    board.insert(
                        (stream.holder.clone(), bucket.clone()),
                        Assigned {
                            holder: stream.holder.clone(),
                            domain: domain.to_string(),
                            bucket: bucket.clone(),
                            strategy: *strategy,
                            granted: watch
                                .filter(|w| w.ledger.is_some() && *strategy != Strategy::AllowAll)
                                .map(|w| w.granted),
                            wrongful: watch.map_or(0, |w| w.wrongful),
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
        self.changed.notify_one();
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
                    quotas.changed.notify_one();
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
}

/// A poisoned lock's data is still whole here: every update is one insert, remove, retain or take.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
