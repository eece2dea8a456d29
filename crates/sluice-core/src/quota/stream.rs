//! One RLQS stream's state ([`QuotaStream`]): its domain, its name in the ledgers, what it knows of each bucket it
//! reports (a [`Watch`]), and the inbox where other streams leave the ledgers it should look at again.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::demand::Demand;
use super::holding::Holding;
use super::vocabulary::{BucketId, Strategy, TICK_US};
use crate::rules::BucketSettings;

/// Where other streams leave the ledgers a stream should look at again.
#[derive(Debug, Default)]
pub struct Inbox {
    pub(super) dirty: Mutex<Dirty>,
    pub(super) wake: tokio::sync::Notify,
}

/// The ledgers left in an inbox.
#[derive(Debug, Default)]
pub(super) struct Dirty {
    pub(super) ledgers: HashSet<String>,
    /// Notices may have been missed: every bucket.
    pub(super) all: bool,
}

/// One stream's state: its domain, the buckets it reports and its name in the ledgers.
pub struct QuotaStream {
    pub(super) domain: Option<Arc<str>>,
    pub(super) holder: String,
    pub(super) buckets: HashMap<BucketId, Watch>,
    pub(super) inbox: Arc<Inbox>,
    /// Gives the stream's place back, and its watches, when the stream is dropped.
    pub(super) release: Option<Release>,
}

/// What a stream does when it ends.
pub(super) type Release = Box<dyn FnOnce(&QuotaStream) + Send + Sync>;

impl Drop for QuotaStream {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release(self);
        }
    }
}

/// What a stream knows of one of its buckets.
#[derive(Debug, Clone)]
pub(super) struct Watch {
    pub(super) settings: BucketSettings,
    /// The bucket's ledger, once a limited rule matched it.
    pub(super) ledger: Option<String>,
    /// The last report with requests in it (or the first report).
    pub(super) active_us: u64,
    /// The last report.
    pub(super) reported_us: u64,
    /// The last assignment sent, when, and the TTL it carried (seconds); `None` before the first.
    pub(super) sent: Option<(Strategy, u64, u32)>,
    /// A DENY_ALL holds until then; a new assignment is due.
    pub(super) retry_at_us: Option<u64>,
    pub(super) demand: Demand,
    /// What the Envoy holds, as far as sluice can know it.
    pub(super) holding: Holding,
    /// The bucket's ledger entry for this stream, as last written.
    pub(super) entry: u64,
    /// The want the bucket's other streams were last told of.
    pub(super) announced_want: u64,
    /// The reports with this bucket so far: before its second, its demand is not known (it is a newcomer).
    pub(super) reports: u32,
    /// Its share of a quota shared as a rate: tokens per window.
    pub(super) rate_share: u64,
    /// What its last grant meant it to hold (a rate: its tokens per window).
    pub(super) granted: u64,
    /// Its requests reported denied while the bucket's budget had quota left.
    pub(super) wrongful: u64,
}

impl QuotaStream {
    /// Fires when another stream left work for this one: call [`Quotas::tick`](super::Quotas::tick).
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

impl Watch {
    /// A bucket's watch, opened by its first report at `now`.
    pub(super) fn new(settings: BucketSettings, now: u64) -> Watch {
        Watch {
            settings,
            ledger: None,
            active_us: now,
            reported_us: now,
            sent: None,
            retry_at_us: None,
            demand: Demand::default(),
            holding: Holding::default(),
            entry: 0,
            announced_want: 0,
            reports: 0,
            rate_share: 0,
            granted: 0,
            wrongful: 0,
        }
    }

    /// A report: what the Envoy admitted came out of what it held, and a denial says it had less than a token.
    pub(super) fn consume(&mut self, now: u64, allowed: u64, denied: u64) {
        self.reports = self.reports.saturating_add(1);
        self.reported_us = now;
        self.lapse(now);
        self.holding.report(allowed, denied);
    }

    /// An assignment whose TTL has lapsed is gone from the Envoy, and its token bucket with it.
    pub(super) fn lapse(&mut self, now: u64) {
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
    pub(super) fn due(&self, now: u64) -> bool {
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
