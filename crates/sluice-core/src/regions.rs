//! One limit across several regions. Each region decides from its own store, as always; a limit marked `global`
//! (a `fixed_window` or `sliding_window`) is counted per region and decided against the sum of every region's count
//! of its window, as this region knows it.
//!
//! What a region knows of the others is what they ship. Every instance notes the windows of global limits it counted in
//! (in the limiter's [`Regions`]), each with the largest count of it the store answered a hit with: this region's own
//! count after that hit ([`TierOutcome::own`](crate::store::TierOutcome::own)), so shipping reads nothing back from
//! the store. A count only grows within a window and each hit's script sees every hit before it, so the hit counted
//! last in a window saw its final count, and once every instance of the region has shipped what it saw, the largest
//! of their counts, which is what the other regions keep, is exact. (A window some hit counted in without the store
//! saying what it left is read back instead:
//! [`RegionCounts::window_counts`].)
//!
//! Every `interval` an instance hands what it noted to one [`Link`] per other region, which keeps it in a backlog (one
//! entry per window, the larger count kept) and ships it to that region's store
//! ([`RegionCounts::merge_counts`]), where each region's count of a window is
//! kept as the larger of what it held and what arrived. Counts are absolute, so a batch applied twice, late or out of
//! order counts once, and a link that comes back after a cut ships what its backlog kept. The backlog holds at most
//! `backlog` windows per link; a window that finds it full is dropped and counted (`sluice_region_dropped_total`),
//! and windows whose time is over leave it unshipped (they no longer weigh in any decision).
//!
//! A link never waits for its last shipment to be answered before it sends the next: every interval it ships what
//! was queued since, in a task of its own, so that several shipments may be in flight on a slow link (merges are
//! idempotent and order-free). A window in flight is not sent again unless its count grew or its shipment failed.
//! Counts therefore leave every interval whatever the round trip, and arrive the link's one-way delay later.
//!
//! Local decisions never wait for a link: shipping runs in tasks of its own, each shipment bounded by a timeout.
//! Stopping ([`Replicator::run`]'s `stop`) ships once more whatever was not shipped, within the timeout, and names
//! each region that could not be reached with what it missed.
//!
//! The bound: a region admits a hit when its own count, plus the others' as last shipped, plus the cost fit the
//! limit. What was shipped is at most `interval` + the link's one-way delay (+ one read and one write) old, so over one
//! window every region together admits at most the limit plus what the other regions admitted within that
//! staleness of the last admission (README, "Several regions").

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::Clock;
use crate::limiter::Regions;
// The state shared with the limiter is the limiter's (its decisions note windows there), named here too.
pub use crate::limiter::{LinkState, Regions as Shared};
use crate::metrics::Metrics;
use crate::store::{Counters, RegionCount, RegionCounts, StoreError, WindowRef};

/// How often counts are read and shipped, unless told otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(100);

/// How often a link with nothing to ship checks that its region answers.
const PING_EVERY: Duration = Duration::from_secs(1);

/// How many windows a link's backlog keeps, unless told otherwise.
pub const DEFAULT_BACKLOG: usize = 100_000;

/// This region, and how it ships to the others.
#[derive(Debug, Clone)]
pub struct RegionSettings {
    /// This region's name, as the others record its counts.
    pub name: String,
    /// How often counts are read and shipped.
    pub interval: Duration,
    /// The most windows a link's backlog keeps.
    pub backlog: usize,
    /// The bound on one shipment to another region.
    pub timeout: Duration,
}

/// One other region: its store, and the counts waiting to reach it.
pub struct Link<R> {
    state: Arc<LinkState>,
    store: R,
    backlog: Mutex<Backlog>,
    /// Rung when counts were queued: the link ships at once rather than on its next tick.
    queued: tokio::sync::Notify,
}

/// A link's counts not yet taken by its region: each window's newest count, and the count a shipment in flight
/// carries (a window is sent again only when its count grew past it, or that shipment failed).
#[derive(Default)]
struct Backlog {
    waiting: HashMap<WindowRef, u64>,
    in_flight: HashMap<WindowRef, u64>,
}

/// What a link did not ship: windows, and the sum of this region's counts of them.
#[derive(Debug, Clone, Copy)]
struct Missed {
    windows: usize,
    counts: u64,
}

/// Ships this region's counts of global windows to the other regions ([module docs](self)).
pub struct Replicator<R> {
    shared: Arc<Regions>,
    links: Vec<Arc<Link<R>>>,
    settings: RegionSettings,
}

impl<R: RegionCounts + Counters + 'static> Replicator<R> {
    /// Ships to `others` (name, store), in that order.
    pub fn new(settings: RegionSettings, others: Vec<(String, R)>) -> Replicator<R> {
        let names: Vec<String> = others.iter().map(|(n, _)| n.clone()).collect();
        let shared = Arc::new(Regions::new(&settings.name, &names));
        let links = others
            .into_iter()
            .zip(shared.links())
            .map(|((_, store), state)| {
                Arc::new(Link {
                    state: state.clone(),
                    store,
                    backlog: Mutex::default(),
                    queued: tokio::sync::Notify::new(),
                })
            })
            .collect();
        Replicator {
            shared,
            links,
            settings,
        }
    }

    /// What the limiter shares with it ([`Limiter::join_regions`](crate::limiter::Limiter::join_regions)).
    pub fn shared(&self) -> Arc<Regions> {
        self.shared.clone()
    }

    /// Queues on every link this region's counts of the windows noted since the last time, at `now_us`: the largest
    /// count the decisions saw the store answer, and, for the windows some hit counted in without the store saying
    /// what it left, the count read from `store`. A read that fails leaves those windows noted, to be read next time
    /// (the others are queued). Returns how many windows were queued.
    pub async fn collect<S: RegionCounts>(&self, store: &S, now_us: u64) -> Result<usize, StoreError> {
        let noted = self.shared.take();
        if noted.is_empty() {
            return Ok(0);
        }
        let (unread, seen): (Vec<_>, Vec<_>) = noted.into_iter().partition(|(_, n)| n.read);
        let mut windows: Vec<WindowRef> = Vec::with_capacity(seen.len() + unread.len());
        let mut counts: Vec<u64> = Vec::with_capacity(windows.capacity());
        for (window, noted) in seen {
            windows.push(window);
            counts.push(noted.seen);
        }
        let mut failed = None;
        if !unread.is_empty() {
            let reads: Vec<WindowRef> = unread.iter().map(|(w, _)| w.clone()).collect();
            match store.window_counts(now_us, &reads).await {
                Ok(read) => {
                    for ((window, noted), read) in unread.into_iter().zip(read) {
                        windows.push(window);
                        counts.push(noted.seen.max(read));
                    }
                }
                Err(e) => {
                    self.shared.restore(unread);
                    failed = Some(e);
                }
            }
        }
        if !windows.is_empty() {
            for link in &self.links {
                link.queue(now_us, &windows, &counts, self.settings.backlog);
                link.queued.notify_one();
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(windows.len()),
        }
    }

    /// Ships every link's whole backlog once (what is in flight included), the links concurrently, each bounded by
    /// the timeout. Returns how many links were reached.
    pub async fn ship(&self, now_us: u64) -> usize {
        self.ship_all(now_us)
            .await
            .iter()
            .filter(|missed| missed.is_none())
            .count()
    }

    /// [`ship`](Self::ship), with what each link missed: `None` for a link reached (or with nothing to ship), else
    /// the windows left unshipped.
    async fn ship_all(&self, now_us: u64) -> Vec<Option<Missed>> {
        let shipments = self.links.iter().map(|link| async move {
            let batch = link.take(now_us, true);
            if batch.is_empty() {
                return None;
            }
            let missed = Missed {
                windows: batch.len(),
                counts: batch.iter().map(|c| c.count).sum(),
            };
            let reached = link
                .ship(now_us, self.shared.name(), self.settings.timeout, batch)
                .await;
            (!reached).then_some(missed)
        });
        futures::future::join_all(shipments).await
    }

    /// Queues what was counted since the last interval and ships every link's backlog a last time, within the
    /// timeout; logs each region that could not be reached, with what it missed. Returns how many links were reached.
    pub async fn flush<S: RegionCounts>(&self, store: &S, now_us: u64) -> usize {
        if let Err(e) = self.collect(store, now_us).await {
            tracing::warn!(error = %e, "global windows' counts not read before stopping: the last interval's hits on those windows are not shipped");
        }
        let missed = self.ship_all(now_us).await;
        let mut reached = 0;
        for (link, missed) in self.links.iter().zip(&missed) {
            match missed {
                None => reached += 1,
                Some(m) => tracing::warn!(
                    region = %link.state.name,
                    windows = m.windows,
                    counts = m.counts,
                    "region not reached before stopping: it misses this region's counts of these windows"
                ),
            }
        }
        if reached == self.links.len() {
            tracing::info!(regions = reached, "counts shipped to every region before stopping");
        }
        reached
    }

    /// Runs until `stop` resolves: every interval, collects from this region's `store` at the time `clock` reads and
    /// ships to each link in tasks of its own (a slow region delays only itself, and a link ships every interval
    /// whatever its round trip), and records the links in `metrics`. When `stop` resolves, ships what was counted
    /// and not yet shipped once more ([`flush`](Self::flush)), within the timeout, then returns.
    pub async fn run<S: RegionCounts>(
        self: Arc<Self>,
        store: &S,
        clock: Arc<dyn Clock>,
        metrics: &Metrics,
        stop: impl Future<Output = ()>,
    ) {
        let interval = self.settings.interval.max(Duration::from_millis(1));
        let shippers: Vec<_> = self
            .links
            .iter()
            .map(|link| {
                let (link, name, timeout, clock) = (
                    link.clone(),
                    Arc::<str>::from(self.shared.name()),
                    self.settings.timeout,
                    clock.clone(),
                );
                tokio::spawn(async move { link.keep_shipping(&name, interval, timeout, clock).await })
            })
            .collect();
        let shippers = AbortOnDrop(shippers);
        let mut every = tokio::time::interval(interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reported: Vec<(u64, u64)> = vec![(0, 0); self.links.len()];
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                () = &mut stop => break,
            }
            if let Err(e) = self.collect(store, clock.now_us()).await {
                tracing::warn!(error = %e, "global windows' counts not read this time; read again next time");
            }
            for (link, (shipped, dropped)) in self.shared.links().iter().zip(&mut reported) {
                let (now_shipped, now_dropped) = (link.shipped(), link.dropped());
                metrics.region_link(
                    &link.name,
                    link.linked(),
                    link.backlog(),
                    now_shipped - *shipped,
                    now_dropped - *dropped,
                );
                (*shipped, *dropped) = (now_shipped, now_dropped);
            }
        }
        // The shipments in flight stop here; what they carried is still in the backlogs, shipped once more.
        drop(shippers);
        self.flush(store, clock.now_us()).await;
    }
}

impl<R: RegionCounts + Counters + 'static> Link<R> {
    /// Ships as soon as counts are queued, and every interval while a backlog waits (a region that could not be
    /// reached), each shipment in a task of its own, never waiting for the one before; an idle link is pinged every
    /// PING_EVERY, so readiness stays true. Runs until aborted (its shipments with it).
    async fn keep_shipping(
        self: Arc<Self>,
        name: &Arc<str>,
        interval: Duration,
        timeout: Duration,
        clock: Arc<dyn Clock>,
    ) {
        let mut in_flight = tokio::task::JoinSet::new();
        let mut idle = Duration::ZERO;
        loop {
            tokio::select! {
                () = self.queued.notified() => {}
                () = tokio::time::sleep(interval) => {}
            }
            // Shipments that ended leave the set (each records its own outcome).
            while in_flight.try_join_next().is_some() {}
            let now_us = clock.now_us();
            let batch = self.take(now_us, false);
            let pending = self.state.backlog() > 0;
            if !batch.is_empty() || (!pending && idle >= PING_EVERY && in_flight.is_empty()) {
                let (link, name) = (self.clone(), name.clone());
                in_flight.spawn(async move { link.ship(now_us, &name, timeout, batch).await });
                idle = Duration::ZERO;
            } else {
                idle += interval;
            }
        }
    }
}

impl<R: RegionCounts + Counters> Link<R> {
    /// Takes `counts` of `windows` into the backlog (the larger count kept), dropping windows that would pass
    /// `bound` and those whose time is over.
    fn queue(&self, now_us: u64, windows: &[WindowRef], counts: &[u64], bound: usize) {
        let mut backlog = lock(&self.backlog);
        backlog.expire(now_us);
        let mut dropped = 0;
        for (window, &count) in windows.iter().zip(counts) {
            if let Some(held) = backlog.waiting.get_mut(window) {
                *held = (*held).max(count);
            } else if backlog.waiting.len() < bound {
                backlog.waiting.insert(window.clone(), count);
            } else {
                dropped += 1;
            }
        }
        self.state.set_backlog(backlog.waiting.len());
        if dropped > 0 {
            self.state.count_dropped(dropped);
            tracing::warn!(region = %self.state.name, dropped, bound, "backlog full: window counts dropped");
        }
    }

    /// The counts to ship now: those no shipment in flight carries (or carries a smaller count of), or with `all`
    /// the whole backlog; marked in flight.
    fn take(&self, now_us: u64, all: bool) -> Vec<RegionCount> {
        let mut backlog = lock(&self.backlog);
        backlog.expire(now_us);
        self.state.set_backlog(backlog.waiting.len());
        let Backlog { waiting, in_flight } = &mut *backlog;
        let mut batch = Vec::new();
        for (window, &count) in waiting.iter() {
            if all || in_flight.get(window).is_none_or(|&sent| sent < count) {
                in_flight.insert(window.clone(), count);
                batch.push(RegionCount {
                    window: window.clone(),
                    count,
                });
            }
        }
        batch
    }

    /// Ships `batch` (a ping when it is empty), bounded by `timeout`: taken, each window leaves the backlog unless it
    /// grew meanwhile; not taken, each is shipped again by the next shipment. Whether the region was reached.
    async fn ship(&self, now_us: u64, own: &str, timeout: Duration, batch: Vec<RegionCount>) -> bool {
        let call = async {
            if batch.is_empty() {
                self.store.ping().await
            } else {
                self.store.merge_counts(now_us, own, &batch).await
            }
        };
        let result = match tokio::time::timeout(timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(timeout)),
        };
        let reached = result.is_ok();
        {
            let mut backlog = lock(&self.backlog);
            for sent in &batch {
                if backlog.in_flight.get(&sent.window) == Some(&sent.count) {
                    backlog.in_flight.remove(&sent.window);
                }
                if reached
                    && backlog
                        .waiting
                        .get(&sent.window)
                        .is_some_and(|&held| held <= sent.count)
                {
                    backlog.waiting.remove(&sent.window);
                }
            }
            self.state.set_backlog(backlog.waiting.len());
        }
        match result {
            Ok(()) => {
                self.state.count_shipped(batch.len() as u64);
                self.state.set_error(None);
                if !self.state.set_linked(true) {
                    tracing::info!(region = %self.state.name, "region linked");
                }
                true
            }
            Err(e) => {
                if self.state.set_linked(false) {
                    tracing::warn!(region = %self.state.name, error = %e, "region not reached; its backlog waits");
                }
                self.state.set_error(Some(e.to_string()));
                false
            }
        }
    }
}

impl Backlog {
    /// Lets go the windows whose time is over: they weigh in no decision.
    fn expire(&mut self, now_us: u64) {
        self.waiting.retain(|w, _| w.expires_us() > now_us);
        self.in_flight.retain(|w, _| w.expires_us() > now_us);
    }
}

/// Aborts the tasks when dropped.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Checks `--region` and the other regions' names: non-empty, made of letters, digits, `-`, `_` and `.`, and all
/// different. The message names what is wrong.
pub fn check_names(own: &str, others: &[String]) -> Result<(), String> {
    let valid =
        |n: &str| !n.is_empty() && n.len() <= 64 && n.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !valid(own) {
        return Err(format!(
            "--region '{own}': a region name is 1 to 64 letters, digits, '-', '_' or '.'"
        ));
    }
    let mut seen = HashSet::from([own]);
    for other in others {
        if !valid(other) {
            return Err(format!(
                "--region-redis '{other}': a region name is 1 to 64 letters, digits, '-', '_' or '.'"
            ));
        }
        if !seen.insert(other.as_str()) {
            return Err(format!(
                "--region-redis: region '{other}' is named twice (or is this region, --region)"
            ));
        }
    }
    Ok(())
}

/// A poisoned lock's data is still whole here: every update is one insert, remove or retain.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    //! A link's backlog and its shipments in flight, taken and answered in the orders a slow link sees: several
    //! shipments out at once, answered late, out of order, or not at all.

    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::redis::{RedisSettings, RedisStore};
    use crate::store::{Algorithm, CounterKey, Counters, Hit, TierSpec};

    const MINUTE: u64 = 60_000_000;
    const NOW: u64 = 1_000 * MINUTE + 10_000_000;
    const TIMEOUT: Duration = Duration::from_millis(300);

    fn key(name: &str) -> CounterKey {
        CounterKey::builder("t:", "d")
            .entry("k", name)
            .finish()
            .tier(Algorithm::FixedWindow, MINUTE)
    }

    fn window(name: &str) -> WindowRef {
        WindowRef {
            key: key(name),
            algorithm: Algorithm::FixedWindow,
            window_us: MINUTE,
            start_us: NOW - NOW % MINUTE,
        }
    }

    fn link<R>(store: R) -> Link<R> {
        let regions = Regions::new("eu", &["us".to_string()]);
        Link {
            state: regions.links()[0].clone(),
            store,
            backlog: Mutex::default(),
            queued: tokio::sync::Notify::new(),
        }
    }

    /// What a batch carries, by window name, in order.
    fn carried(batch: &[RegionCount]) -> Vec<(String, u64)> {
        let mut carried: Vec<(String, u64)> = batch
            .iter()
            .map(|c| {
                let name = ["a", "b", "c"]
                    .into_iter()
                    .find(|n| window(n) == c.window)
                    .unwrap_or("?");
                (name.to_string(), c.count)
            })
            .collect();
        carried.sort();
        carried
    }

    fn pairs(expected: &[(&str, u64)]) -> Vec<(String, u64)> {
        expected.iter().map(|(n, c)| (n.to_string(), *c)).collect()
    }

    /// Whether the other region, as `store` holds it, admits `cost` more on window `name` against a limit of 10.
    async fn admits(store: &MemoryStore, name: &str, cost: u64) -> bool {
        let tier = TierSpec {
            key: key(name),
            algorithm: Algorithm::FixedWindow,
            limit: 10,
            window_us: MINUTE,
            burst: 10,
            cost: None,
            global: true,
        };
        let hit = Hit {
            tiers: vec![tier],
            cost,
            mode: crate::store::Mode::Peek,
            ..Hit::default()
        };
        matches!(&store.hit(NOW, &[hit]).await[..], [Ok(o)] if o.tiers[0].ok)
    }

    #[tokio::test]
    async fn shipments_in_flight_at_once_send_each_count_once_and_answered_out_of_order_leave_nothing_behind() {
        let link = link(MemoryStore::new());
        link.queue(NOW, &[window("a"), window("b")], &[5, 3], 10);
        let first = link.take(NOW, false);
        assert_eq!(carried(&first), pairs(&[("a", 5), ("b", 3)]));
        // While the first is out, a grows and c is counted: the second carries those, not b again.
        link.queue(NOW, &[window("a"), window("c")], &[8, 1], 10);
        let second = link.take(NOW, false);
        assert_eq!(carried(&second), pairs(&[("a", 8), ("c", 1)]));
        assert!(link.take(NOW, false).is_empty(), "everything waiting is in flight");
        assert_eq!(link.state.backlog(), 3);

        // The second is answered first: a and c leave the backlog, b waits for the first.
        assert!(link.ship(NOW, "eu", TIMEOUT, second).await);
        assert_eq!(link.state.backlog(), 1);
        assert!(link.take(NOW, false).is_empty(), "b is still in flight");
        // The first, late, carries a's older count: taken, it lowers nothing there and leaves nothing here.
        assert!(link.ship(NOW, "eu", TIMEOUT, first).await);
        assert_eq!(link.state.backlog(), 0);
        assert!(lock(&link.backlog).in_flight.is_empty());
        assert_eq!(link.state.shipped(), 4);
        let us = &link.store;
        assert!(admits(us, "a", 2).await, "8 of 10 elsewhere: 2 fit");
        assert!(!admits(us, "a", 3).await, "a's 8 stands, not the late 5");
        assert!(admits(us, "b", 7).await && !admits(us, "b", 8).await);
    }

    #[tokio::test]
    async fn a_count_that_grew_while_its_shipment_was_out_waits_for_the_next() {
        let link = link(MemoryStore::new());
        link.queue(NOW, &[window("a")], &[5], 10);
        let first = link.take(NOW, false);
        link.queue(NOW, &[window("a")], &[9], 10);
        assert!(link.ship(NOW, "eu", TIMEOUT, first).await);
        assert_eq!(link.state.backlog(), 1, "9 was not taken yet");
        assert_eq!(carried(&link.take(NOW, false)), pairs(&[("a", 9)]));
        // A window whose time is over leaves the backlog unshipped.
        link.queue(NOW, &[window("b")], &[2], 10);
        assert!(link.take(NOW + 3 * MINUTE, false).is_empty());
        assert_eq!(link.state.backlog(), 0);
    }

    #[tokio::test]
    async fn shipments_not_taken_leave_their_counts_to_the_next_one() {
        // A region that cannot be reached: nothing listens on port 1.
        let settings = RedisSettings {
            url: "redis://127.0.0.1:1".into(),
            timeout: TIMEOUT,
            pool_size: 1,
            server_time: true,
            tls: Default::default(),
        };
        let link = link(RedisStore::connect_in_background(&settings).await.expect("built"));
        link.queue(NOW, &[window("a"), window("b")], &[5, 3], 10);
        let first = link.take(NOW, false);
        link.queue(NOW, &[window("a")], &[7], 10);
        let second = link.take(NOW, false);
        assert_eq!(carried(&second), pairs(&[("a", 7)]));
        // Both fail, the newer first: every window waits, none is in flight, and the next shipment carries them all,
        // each at its largest count.
        assert!(!link.ship(NOW, "eu", TIMEOUT, second).await);
        assert!(!link.ship(NOW, "eu", TIMEOUT, first).await);
        assert!(!link.state.linked());
        assert_eq!(link.state.backlog(), 2);
        assert_eq!(link.state.shipped(), 0);
        assert_eq!(carried(&link.take(NOW, false)), pairs(&[("a", 7), ("b", 3)]));
    }
}
