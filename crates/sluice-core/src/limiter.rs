//! The decision core: `should_rate_limit(request) -> Decision` and the read-only `get_remaining`.
//!
//! It knows nothing of gRPC or Redis: requests arrive as plain types, counters go through the store's traits, each
//! part of the limiter asking for the capabilities it uses ([`Counters`] and [`Announcements`] for decisions, and
//! one more for each part beside them: budgets, lists, offenders, series, releases, grants).
//! Per request it reads the clock once, loads the current rule set once (a reload swaps it atomically), matches
//! every descriptor, drops the rules that others `replace`, and sends every counter to the store in one call.
//!
//! This file owns the [`Limiter`] and what it holds. Its parts: `request` (what a request is, and the checks it
//! passes), `resolve` (which rule each descriptor meets), `hits` (a descriptor's counters and the store's hit of
//! it), `decide` (a request decided: hits, store call, statuses), `decision` (what the core answers), `remaining`
//! (the read-only report), `reset` (leases released and state deleted), `settings` (the core's switches and caps),
//! `guard` (the breakers, local cache and timing around every store call), `global` (what is shared with the
//! shipping of global limits' counts to other regions), `budget` (costs checked, reported and reserved), `usage`
//! (RLQS usage charged to bucket quotas), `wait` (calls held until their hit would pass), `lists` (what the lists
//! hold at run time), `offenders` (the values hit and denied most per rule) and `series` (outcomes per rule and
//! second).

mod budget;
mod decide;
mod decision;
mod global;
mod guard;
mod hits;
mod lists;
mod offenders;
mod remaining;
mod request;
mod reset;
mod resolve;
mod series;
mod settings;
mod usage;
mod wait;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use budget::How;
pub use budget::{Costs, MAX_TRACKED, Reserved, SettledDescriptor};
pub use decision::{AppliedLimit, Code, Decision, LimitError, Queued, QueuedWork, Report, ResetReport, Status};
pub use global::{LinkState, Regions};
use guard::Guard;
pub use lists::{MAX_LIST_ENTRIES, MAX_LIST_VALUES_PER_CALL};
pub use offenders::{FLUSH_EVERY, RuleOffenders};
pub use request::{Descriptor, Override, Request};
pub use series::Series;
pub use settings::{Cap, Caps, LimiterSettings};
pub use usage::{Charged, Claim, QuotaState, TierState, Usage};
pub use wait::Waited;

use crate::breaker::Breakers;
use crate::cache::LocalCache;
use crate::clock::Clock;
use crate::metrics::{DomainStats, Metrics};
use crate::rules::{Domain, RuleSet};
use crate::store::{Announcements, Counters, StoreError};

/// The decision core over a store.
pub struct Limiter<S> {
    rules: ArcSwap<RuleSet>,
    /// The store, behind its breakers and the local cache.
    guard: Guard<S>,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    settings: LimiterSettings,
    /// The reservations made here and not yet seen settled, to count those that expire.
    reservations: std::sync::Mutex<budget::ReservationBook>,
    /// The calls waiting for a permit.
    waiters: wait::Waiters,
    /// What the lists hold at run time: fetched from their URLs, managed through the admin API.
    lists: lists::LiveState,
    /// The values hit and denied per rule since the last flush.
    offenders: offenders::Offenders,
    /// The outcomes per rule and second since the last flush.
    outcomes: series::Outcomes,
    /// This instance's name among those sharing the store: random, new each start.
    instance: Arc<str>,
}

impl<S: Counters + Announcements> Limiter<S> {
    pub fn new(
        rules: RuleSet,
        store: S,
        clock: Arc<dyn Clock>,
        metrics: Metrics,
        settings: LimiterSettings,
    ) -> Limiter<S> {
        Limiter {
            rules: ArcSwap::from_pointee(rules),
            guard: Guard::new(
                store,
                Breakers::new(settings.breaker),
                LocalCache::new(settings.local_cache_size),
                metrics.clone(),
            ),
            clock,
            metrics,
            waiters: wait::Waiters::new(settings.max_waiters),
            settings,
            reservations: std::sync::Mutex::default(),
            lists: lists::LiveState::default(),
            offenders: offenders::Offenders::default(),
            outcomes: series::Outcomes::default(),
            instance: new_lease()[..12].into(),
        }
    }

    /// This instance's name among those sharing the store (12 hex digits, random, new each start): what its
    /// heartbeat carries ([`Limiter::instances_seen`]).
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The worst state of the circuit breakers in front of the store: open if one failure domain's is open, else
    /// half-open if one is probing, else closed.
    pub fn breaker_state(&self) -> crate::breaker::State {
        self.guard.breaker_state(self.clock.now_us())
    }

    pub fn store(&self) -> &S {
        self.guard.store()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn settings(&self) -> &LimiterSettings {
        &self.settings
    }

    /// How many notices from the instances sharing the store (this one included) the local cache has applied. A
    /// change announced elsewhere (a refund, a reset) is in force here once this has counted it.
    pub fn notices_heard(&self) -> u64 {
        self.guard.notices_heard()
    }

    /// How many denials the local cache holds now.
    pub fn cached_denials(&self) -> usize {
        self.guard.cache().len()
    }

    /// Makes this instance one region of several: its global limits count what the other regions shipped, and the
    /// windows it counts in are noted in `regions`, for shipping. Once; a second call changes nothing.
    pub fn join_regions(&self, regions: Arc<Regions>) {
        self.guard.join_regions(regions);
    }

    /// One line per other region for `/readyz`: linked or not, and what waits for it.
    pub fn region_lines(&self) -> Vec<String> {
        self.guard
            .regions()
            .map(|r| r.links().iter().map(|l| l.line()).collect())
            .unwrap_or_default()
    }

    /// The time by the limiter's clock, in microseconds since the Unix epoch.
    pub fn now_us(&self) -> u64 {
        self.clock.now_us()
    }

    /// The limiter's clock.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// The rule set in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    /// Replaces the rule set; requests already running finish with the old one.
    pub fn reload(&self, rules: RuleSet) {
        self.rules.store(Arc::new(rules));
        // A denial cached under the old limits may not hold under the new ones.
        self.guard.cache().clear();
    }

    /// Decides a request, counting each descriptor's hit against its limits.
    pub async fn should_rate_limit(&self, request: &Request) -> Result<Decision, LimitError> {
        self.decide(request, How::Decide).await
    }

    /// Whether decisions can reach the store now: it answers a ping and no failure domain's breaker is open.
    pub async fn ready(&self) -> Result<(), StoreError> {
        self.guard.ready(self.clock.now_us()).await
    }

    fn domain_stats<'a>(&'a self, domain: Option<&'a Domain>) -> &'a DomainStats {
        domain.map_or(self.metrics.unknown_domain(), |d| &d.stats)
    }
}

/// A lease id unique across processes and time: 128 bits from the process's random hasher keys, a counter and the
/// clock. Not a secret: releasing needs the descriptors too.
pub(crate) fn new_lease() -> String {
    use std::hash::{BuildHasher, RandomState};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    thread_local!(static STATE: RandomState = RandomState::new());
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let (a, b) = STATE.with(|s| (s.hash_one((seq, nanos, 1u8)), s.hash_one((seq, nanos, 2u8))));
    format!("{a:016x}{b:016x}")
}
