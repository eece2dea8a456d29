//! One limit across several regions. Each region decides from its own store, as always; a limit marked `global`
//! (a `fixed_window` or `sliding_window`) is counted per region and decided against the sum of every region's count
//! of its window, as this region knows it.
//!
//! What a region knows of the others is what they ship. Every instance notes the windows of global limits it counted in
//! (in the limiter's [`Regions`]); every `interval` it reads this region's own count of each ([`RegionCounts::window_counts`](crate::store::RegionCounts::window_counts))
//! and hands them to one [`Link`] per other region, which keeps them in a backlog (one entry per window, the larger
//! count kept) and ships it to that region's store ([`RegionCounts::merge_counts`](crate::store::RegionCounts::merge_counts)), where each region's count of a window is
//! kept as the larger of what it held and what arrived. Counts are absolute and only grow within a window, so a batch
//! applied twice, late or out of order counts once, and a link that comes back after a cut ships what its backlog kept.
//! The backlog holds at most `backlog` windows per link; a window that finds it full is dropped and counted
//! (`sluice_region_dropped_total`), and windows whose time is over leave it unshipped (they no longer weigh in any
//! decision).
//!
//! Local decisions never wait for a link: shipping runs in tasks of its own, each link's calls bounded by a timeout.
//!
//! The bound: a region admits a hit when its own count, plus the others' as last shipped, plus the cost fit the
//! limit. What was shipped is at most `interval` + the link's delay (+ one read and one write) old, so over one
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
use crate::store::{RegionCount, Store, StoreError, WindowRef};

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
    backlog: Mutex<HashMap<WindowRef, u64>>,
    /// Rung when counts were queued: the link ships at once rather than on its next tick.
    queued: tokio::sync::Notify,
}

/// Ships this region's counts of global windows to the other regions ([module docs](self)).
pub struct Replicator<R> {
    shared: Arc<Regions>,
    links: Vec<Arc<Link<R>>>,
    settings: RegionSettings,
}

impl<R: Store + 'static> Replicator<R> {
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

    /// Reads this region's counts of the windows noted since the last time, from `store` at `now_us`, and queues
    /// them on every link. A read that fails leaves the windows noted, to be read next time.
    pub async fn collect<S: Store>(&self, store: &S, now_us: u64) -> Result<usize, StoreError> {
        let windows = self.shared.take();
        if windows.is_empty() {
            return Ok(0);
        }
        let counts = match store.window_counts(now_us, &windows).await {
            Ok(counts) => counts,
            Err(e) => {
                self.shared.restore(windows);
                return Err(e);
            }
        };
        for link in &self.links {
            link.queue(now_us, &windows, &counts, self.settings.backlog);
            link.queued.notify_one();
        }
        Ok(windows.len())
    }

    /// Ships every link's backlog once, the links concurrently, each bounded by the timeout. Returns how many links
    /// were reached.
    pub async fn ship(&self, now_us: u64) -> usize {
        let shipments = self
            .links
            .iter()
            .map(|link| link.ship(now_us, self.shared.name(), self.settings.timeout));
        futures::future::join_all(shipments)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count()
    }

    /// Runs until dropped: every interval, collects from this region's `store` at the time `clock` reads, ships
    /// each link in a task of its own (a slow region delays only itself), and records the links in `metrics`.
    pub async fn run<S: Store>(self: Arc<Self>, store: &S, clock: Arc<dyn Clock>, metrics: &Metrics) {
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
                tokio::spawn(async move {
                    // Ships as soon as counts are queued, and every interval while a backlog waits (a region that
                    // could not be reached); an idle link is pinged every PING_EVERY, so readiness stays true.
                    let mut idle = Duration::ZERO;
                    loop {
                        tokio::select! {
                            () = link.queued.notified() => {}
                            () = tokio::time::sleep(interval) => {}
                        }
                        if link.state.backlog() > 0 || idle >= PING_EVERY {
                            link.ship(clock.now_us(), &name, timeout).await;
                            idle = Duration::ZERO;
                        } else {
                            idle += interval;
                        }
                    }
                })
            })
            .collect();
        let _abort = AbortOnDrop(shippers);
        let mut every = tokio::time::interval(interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reported: Vec<(u64, u64)> = vec![(0, 0); self.links.len()];
        loop {
            every.tick().await;
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
    }
}

impl<R: Store> Link<R> {
    /// Takes `counts` of `windows` into the backlog (the larger count kept), dropping windows that would pass
    /// `bound` and those whose time is over.
    fn queue(&self, now_us: u64, windows: &[WindowRef], counts: &[u64], bound: usize) {
        let mut backlog = lock(&self.backlog);
        backlog.retain(|w, _| w.expires_us() > now_us);
        let mut dropped = 0;
        for (window, &count) in windows.iter().zip(counts) {
            if let Some(held) = backlog.get_mut(window) {
                *held = (*held).max(count);
            } else if backlog.len() < bound {
                backlog.insert(window.clone(), count);
            } else {
                dropped += 1;
            }
        }
        self.state.set_backlog(backlog.len());
        if dropped > 0 {
            self.state.count_dropped(dropped);
            tracing::warn!(region = %self.state.name, dropped, bound, "backlog full: window counts dropped");
        }
    }

    /// Ships the backlog once; what was taken leaves it (unless it grew meanwhile). Whether the region was reached.
    async fn ship(&self, now_us: u64, own: &str, timeout: Duration) -> bool {
        let batch: Vec<RegionCount> = {
            let mut backlog = lock(&self.backlog);
            backlog.retain(|w, _| w.expires_us() > now_us);
            self.state.set_backlog(backlog.len());
            backlog
                .iter()
                .map(|(window, &count)| RegionCount {
                    window: window.clone(),
                    count,
                })
                .collect()
        };
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
        match result {
            Ok(()) => {
                let mut backlog = lock(&self.backlog);
                for sent in &batch {
                    if backlog.get(&sent.window) == Some(&sent.count) {
                        backlog.remove(&sent.window);
                    }
                }
                self.state.set_backlog(backlog.len());
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
