//! One limit across several regions. Each region decides from its own store, as always; a limit marked `global`
//! (a `fixed_window` or `sliding_window`) is counted per region and decided against the sum of every region's count
//! of its window, as this region knows it.
//!
//! What a region knows of the others is what they ship. Every instance notes the windows of global limits it
//! counted in (`Shared::note`); every `interval` it reads this region's own count of each ([`RegionCounts::window_counts`](crate::store::RegionCounts::window_counts))
//! and hands them to one [`Link`] per other region, which keeps them in a backlog (one entry per window, the larger
//! count kept) and ships it to that region's store ([`RegionCounts::merge_counts`](crate::store::RegionCounts::merge_counts)), where each region's count of a window
//! is kept as the larger of what it held and what arrived. Counts are absolute and only grow within a window, so a
//! batch applied twice, late or out of order counts once, and a link that comes back after a cut ships what its
//! backlog kept. The backlog holds at most `backlog` windows per link; a window that finds it full is dropped and
//! counted (`sluice_region_dropped_total`), and windows whose time is over leave it unshipped (they no longer weigh
//! in any decision).
//!
//! Local decisions never wait for a link: shipping runs in tasks of its own, each link's calls bounded by a timeout.
//!
//! The bound: a region admits a hit when its own count, plus the others' as last shipped, plus the cost fit the
//! limit. What was shipped is at most `interval` + the link's delay (+ one read and one write) old, so over one
//! window every region together admits at most the limit plus what the other regions admitted within that
//! staleness of the last admission (README, "Several regions").

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::limiter::Limiter;
use crate::store::{Answers, Hit, RegionCount, Store, StoreError, WindowRef};

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

/// What the decision path and the readiness check share with the links: the windows counted in since the last
/// read, and each link's state.
#[derive(Debug)]
pub struct Shared {
    name: Arc<str>,
    touched: Mutex<HashSet<WindowRef>>,
    links: Vec<Arc<LinkState>>,
}

/// What is known of one link, for readiness and metrics.
#[derive(Debug)]
pub struct LinkState {
    pub name: Arc<str>,
    linked: AtomicBool,
    backlog: AtomicUsize,
    dropped: AtomicU64,
    shipped: AtomicU64,
    error: Mutex<Option<String>>,
}

impl LinkState {
    fn new(name: &str) -> LinkState {
        LinkState {
            name: Arc::from(name),
            linked: AtomicBool::new(false),
            backlog: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            shipped: AtomicU64::new(0),
            error: Mutex::new(Some("not reached yet".into())),
        }
    }

    /// Whether the last shipment reached the region.
    pub fn linked(&self) -> bool {
        self.linked.load(Ordering::Acquire)
    }

    /// Windows waiting to be shipped.
    pub fn backlog(&self) -> usize {
        self.backlog.load(Ordering::Relaxed)
    }

    /// Windows dropped because the backlog was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Window counts shipped and taken by the region.
    pub fn shipped(&self) -> u64 {
        self.shipped.load(Ordering::Relaxed)
    }

    /// A line for `/readyz`.
    pub fn line(&self) -> String {
        if self.linked() {
            format!("region {}: linked, {} windows waiting", self.name, self.backlog())
        } else {
            let why = lock(&self.error).clone().unwrap_or_default();
            format!(
                "region {}: not linked ({why}), {} windows waiting, {} dropped",
                self.name,
                self.backlog(),
                self.dropped()
            )
        }
    }
}

impl Shared {
    /// This region `name`, linked to `others`.
    pub fn new(name: &str, others: &[String]) -> Shared {
        Shared {
            name: Arc::from(name),
            touched: Mutex::default(),
            links: others.iter().map(|o| Arc::new(LinkState::new(o))).collect(),
        }
    }

    /// This region's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The links, in the order given.
    pub fn links(&self) -> &[Arc<LinkState>] {
        &self.links
    }

    /// Notes the windows of global tiers that the answered hits counted in: an admitted hit's (or a forced one's)
    /// tiers with a positive cost.
    pub(crate) fn note(&self, now_us: u64, hits: &[Hit], answers: &Answers) {
        let mut touched = None;
        for (hit, answer) in hits.iter().zip(answers) {
            if !hit.tiers.iter().any(|t| t.global) {
                continue;
            }
            let Ok(outcome) = answer else { continue };
            if !(outcome.admitted || hit.forced()) {
                continue;
            }
            for tier in hit.tiers.iter().filter(|t| t.global && t.bounded_cost(hit.cost) > 0) {
                touched
                    .get_or_insert_with(|| lock(&self.touched))
                    .insert(WindowRef::of(tier, now_us));
            }
        }
    }

    fn take(&self) -> Vec<WindowRef> {
        lock(&self.touched).drain().collect()
    }

    fn restore(&self, windows: Vec<WindowRef>) {
        lock(&self.touched).extend(windows);
    }
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
    shared: Arc<Shared>,
    links: Vec<Arc<Link<R>>>,
    settings: RegionSettings,
}

impl<R: Store + 'static> Replicator<R> {
    /// Ships to `others` (name, store), in that order.
    pub fn new(settings: RegionSettings, others: Vec<(String, R)>) -> Replicator<R> {
        let names: Vec<String> = others.iter().map(|(n, _)| n.clone()).collect();
        let shared = Arc::new(Shared::new(&settings.name, &names));
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

    /// What the limiter shares with it ([`crate::limiter::Limiter::join_regions`]).
    pub fn shared(&self) -> Arc<Shared> {
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
            .map(|link| link.ship(now_us, &self.shared.name, self.settings.timeout));
        futures::future::join_all(shipments)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count()
    }

    /// Runs until dropped: every interval, collects from the limiter's store at the limiter's time, and ships each
    /// link in a task of its own (a slow region delays only itself).
    pub async fn run<S: Store>(self: Arc<Self>, limiter: Arc<Limiter<S>>) {
        let interval = self.settings.interval.max(Duration::from_millis(1));
        let shippers: Vec<_> = self
            .links
            .iter()
            .map(|link| {
                let (link, name, timeout, limiter) = (
                    link.clone(),
                    self.shared.name.clone(),
                    self.settings.timeout,
                    limiter.clone(),
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
                            link.ship(limiter.now_us(), &name, timeout).await;
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
            if let Err(e) = self.collect(limiter.store(), limiter.now_us()).await {
                tracing::warn!(error = %e, "global windows' counts not read this time; read again next time");
            }
            for (link, (shipped, dropped)) in self.shared.links.iter().zip(&mut reported) {
                let (now_shipped, now_dropped) = (link.shipped(), link.dropped());
                limiter.metrics().region_link(
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
        self.state.backlog.store(backlog.len(), Ordering::Relaxed);
        if dropped > 0 {
            self.state.dropped.fetch_add(dropped, Ordering::Relaxed);
            tracing::warn!(region = %self.state.name, dropped, bound, "backlog full: window counts dropped");
        }
    }

    /// Ships the backlog once; what was taken leaves it (unless it grew meanwhile). Whether the region was reached.
    async fn ship(&self, now_us: u64, own: &str, timeout: Duration) -> bool {
        let batch: Vec<RegionCount> = {
            let mut backlog = lock(&self.backlog);
            backlog.retain(|w, _| w.expires_us() > now_us);
            self.state.backlog.store(backlog.len(), Ordering::Relaxed);
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
                self.state.backlog.store(backlog.len(), Ordering::Relaxed);
                self.state.shipped.fetch_add(batch.len() as u64, Ordering::Relaxed);
                *lock(&self.state.error) = None;
                if !self.state.linked.swap(true, Ordering::AcqRel) {
                    tracing::info!(region = %self.state.name, "region linked");
                }
                true
            }
            Err(e) => {
                if self.state.linked.swap(false, Ordering::AcqRel) {
                    tracing::warn!(region = %self.state.name, error = %e, "region not reached; its backlog waits");
                }
                *lock(&self.state.error) = Some(e.to_string());
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

/// A poisoned lock's data is still whole here: every update is one insert, remove or store.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
