//! Which streams of this instance watch which ledger (a bucket's quota), and the task that hands them the store's
//! notices: a stream told that a ledger changed sizes its grant of that bucket again on its next tick.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::stream::Inbox;
use super::{Quotas, lock};
use crate::store::{Announcements, Counters, Grants, Notice, STREAMS_EVERY_US};

impl<S: Counters + Announcements + Grants> Quotas<S> {
    /// Starts, once and inside a runtime, the task that hands the store's notices to the streams that watch the
    /// ledgers they name, notes how many streams the other instances have, and says how many this one has: when
    /// the number changes, and every [`STREAMS_EVERY_US`] while it is not 0.
    pub(super) fn listen(self: &Arc<Self>) {
        if tokio::runtime::Handle::try_current().is_err() || self.listening.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut notices = self.limiter.store().notices();
        let quotas = Arc::downgrade(self);
        let changed = self.changed.clone();
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            let mut every = tokio::time::interval(Duration::from_micros(STREAMS_EVERY_US));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut said = 0;
            loop {
                let event = tokio::select! {
                    notice = notices.recv() => Some(notice),
                    _ = every.tick() => None,
                    () = changed.notified() => None,
                };
                let Some(strong) = quotas.upgrade() else { return };
                match event {
                    None => {
                        let count = strong.streams.load(Ordering::Acquire) as u64;
                        if count > 0 || said > 0 {
                            said = count;
                            let notice = Notice::Streams(strong.instance.clone(), count);
                            strong.limiter.store().announce(notice).await;
                        }
                    }
                    Some(Ok(Notice::Quota(ledgers))) => {
                        for ledger in &ledgers {
                            strong.notify(ledger, None);
                        }
                    }
                    Some(Ok(Notice::Streams(instance, count))) if instance != strong.instance => {
                        let now = strong.limiter.now_us();
                        let mut fleet = lock(&strong.fleet);
                        // Instances gone quiet (stopped, or restarted under another name) are forgotten.
                        fleet.retain(|_, (_, heard)| now.saturating_sub(*heard) < 3 * STREAMS_EVERY_US);
                        fleet.insert(instance, (count, now));
                    }
                    Some(Ok(Notice::Missed) | Err(RecvError::Lagged(_))) => strong.notify_all(),
                    Some(Ok(Notice::Freed(_) | Notice::Lists(_) | Notice::Streams(..))) => {}
                    Some(Err(RecvError::Closed)) => return,
                }
                strong.stats.fleet_streams.set(strong.population() as f64);
            }
        });
    }

    /// Notes that the stream of `inbox` reports the ledger.
    pub(super) fn watch(&self, ledger: &str, inbox: &Arc<Inbox>) {
        lock(&self.watchers)
            .entry(ledger.to_string())
            .or_default()
            .push(Arc::downgrade(inbox));
        self.watched.fetch_add(1, Ordering::Relaxed);
    }

    /// Ends one stream's watch of a ledger (each stream removes only its own, so the count stays exact).
    pub(super) fn unwatch(&self, ledger: &str, inbox: &Arc<Inbox>) {
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
    pub(super) fn notify(&self, ledger: &str, except: Option<&Arc<Inbox>>) {
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
