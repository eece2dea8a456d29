//! This instance as one region of several: what the decision path shares with the shipping of counts to the other
//! regions. The guard notes here the windows of global limits that its hits counted in, each with the largest count
//! of it the store answered (this region's own count after the hit); the replicator (the `regions` module, a layer
//! over the limiter and the store) takes them every interval, reads back from the store only the windows a hit
//! counted in without the store saying what it left, ships them, and keeps here what it knows of each link, which
//! the limiter reports for readiness.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::store::{Answers, Hit, WindowRef};

/// What the decision path and the readiness check share with the links: the windows counted in since the last
/// time they were taken, and each link's state.
#[derive(Debug)]
pub struct Regions {
    name: Arc<str>,
    touched: Mutex<HashMap<WindowRef, Noted>>,
    links: Vec<Arc<LinkState>>,
}

/// What is known of this region's count of a window counted in since the last time: the largest count the store
/// answered for it, and whether some hit counted in it without the store saying what it left (the count must then be
/// read back).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Noted {
    pub(crate) seen: u64,
    pub(crate) read: bool,
}

impl Noted {
    fn add(&mut self, other: Noted) {
        self.seen = self.seen.max(other.seen);
        self.read |= other.read;
    }
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

    /// Sets how many windows wait in the link's backlog.
    pub(crate) fn set_backlog(&self, windows: usize) {
        self.backlog.store(windows, Ordering::Relaxed);
    }

    /// Counts windows dropped from a full backlog.
    pub(crate) fn count_dropped(&self, windows: u64) {
        self.dropped.fetch_add(windows, Ordering::Relaxed);
    }

    /// Counts window counts the region took.
    pub(crate) fn count_shipped(&self, windows: u64) {
        self.shipped.fetch_add(windows, Ordering::Relaxed);
    }

    /// Sets why the region was not reached (`None`: it was).
    pub(crate) fn set_error(&self, error: Option<String>) {
        *lock(&self.error) = error;
    }

    /// Sets whether the last shipment reached the region; whether the one before did.
    pub(crate) fn set_linked(&self, linked: bool) -> bool {
        self.linked.swap(linked, Ordering::AcqRel)
    }
}

impl Regions {
    /// This region `name`, linked to `others`.
    pub fn new(name: &str, others: &[String]) -> Regions {
        Regions {
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
    /// tiers with a positive cost, each with the count the store answered it left
    /// ([`TierOutcome::own`](crate::store::TierOutcome::own)), or to be read back where the store did not say.
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
            for (tier, answered) in hit.tiers.iter().zip(&outcome.tiers) {
                if !tier.global || tier.bounded_cost(hit.cost) == 0 {
                    continue;
                }
                let mut window = WindowRef::of(tier, now_us);
                let noted = match answered.own {
                    Some(own) => {
                        window.start_us = own.start_us;
                        Noted {
                            seen: own.count,
                            read: false,
                        }
                    }
                    None => Noted { seen: 0, read: true },
                };
                touched
                    .get_or_insert_with(|| lock(&self.touched))
                    .entry(window)
                    .or_default()
                    .add(noted);
            }
        }
    }

    /// The windows noted since the last time, taken.
    pub(crate) fn take(&self) -> Vec<(WindowRef, Noted)> {
        lock(&self.touched).drain().collect()
    }

    /// Notes again windows taken but not shipped.
    pub(crate) fn restore(&self, windows: Vec<(WindowRef, Noted)>) {
        let mut touched = lock(&self.touched);
        for (window, noted) in windows {
            touched.entry(window).or_default().add(noted);
        }
    }
}

/// A poisoned lock's data is still whole here: every update is one insert, drain or store.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
