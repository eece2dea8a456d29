//! The decision core: what Envoy's calls, the cost budgets, RLQS and the admin API ask of the counters, over a store.
//!
//! It knows nothing of gRPC or Redis: requests arrive as plain types, counters go through the store's traits. The
//! [`Limiter`] is the entry: it owns the rules in force, the store (behind its breakers and local cache), the clock,
//! the metrics and the settings in a core its parts share (`core.rs`), and gives each part, which asks the store for
//! the capabilities it uses and no more:
//!
//! - [`Decisions`] (`decisions.rs`, `decisions/`): ShouldRateLimit, GetRemaining, WaitForPermit, release and reset;
//!   [`Counters`] and [`Announcements`], and [`Releases`](crate::store::Releases) to end leases and delete state;
//! - [`Budgets`] (`budgets.rs`): costs checked, reported, reserved and settled;
//!   [`Reservations`](crate::store::Reservations);
//! - [`Lists`] (`lists.rs`): what the deny and allow lists hold at run time; [`Lists`](crate::store::Lists);
//! - [`Tallies`] (`tallies.rs`): the top offenders and the outcomes per rule and second, added to the store and read
//!   back; [`Offenders`](crate::store::Offenders) and [`Series`](crate::store::Series);
//! - [`Buckets`] (`buckets.rs`): RLQS usage charged to bucket quotas, and grants of them;
//!   [`Grants`](crate::store::Grants).
//!
//! Per request the core reads the clock once, loads the current rule set once (a reload swaps it atomically), matches
//! every descriptor, drops the rules that others `replace`, and sends every counter to the store in one call: what a
//! request is and the checks it passes (`request.rs`), which rule each descriptor meets (`resolve.rs`), a
//! descriptor's counters and the store's hit of it (`hits.rs`), a request decided (`decide.rs`), what the core
//! answers (`decision.rs`), the core's switches and caps (`settings.rs`), the breakers, local cache and timing around
//! every store call (`guard.rs`), what is shared with the shipping of global limits' counts to other regions
//! (`global.rs`), and the tables the decision path feeds for the tallies (`offenders.rs`, `series.rs`).

mod buckets;
mod budgets;
mod core;
mod decide;
mod decision;
mod decisions;
mod global;
mod guard;
mod hits;
mod lists;
mod offenders;
mod request;
mod resolve;
mod series;
mod settings;
mod tallies;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub use buckets::{Buckets, Charged, Claim, QuotaState, TierState, Usage};
pub use budgets::{Budgets, MAX_TRACKED, Reserved, SettledDescriptor};
pub use decision::{AppliedLimit, Code, Decision, LimitError, Queued, QueuedWork, Report, ResetReport, Status};
pub use decisions::{Decisions, Waited};
pub use global::{LinkState, Regions};
pub use lists::{Lists, MAX_LIST_ENTRIES, MAX_LIST_VALUES_PER_CALL};
pub use offenders::{FLUSH_EVERY, RuleOffenders};
pub use request::{Costs, Descriptor, Override, Request};
pub use series::Series;
pub use settings::{Cap, Caps, LimiterSettings};
pub use tallies::Tallies;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::rules::RuleSet;
use crate::store::{Announcements, Counters, StoreError};
use core::Core;

/// The decision core over a store: the entry to its parts.
pub struct Limiter<S> {
    core: Arc<Core<S>>,
    decisions: Decisions<S>,
    budgets: Budgets<S>,
    lists: Lists<S>,
    tallies: Tallies<S>,
    buckets: Buckets<S>,
}

impl<S: Counters + Announcements> Limiter<S> {
    pub fn new(
        rules: RuleSet,
        store: S,
        clock: Arc<dyn Clock>,
        metrics: Metrics,
        settings: LimiterSettings,
    ) -> Limiter<S> {
        let max_waiters = settings.max_waiters;
        let core = Arc::new(Core::new(rules, store, clock, metrics, settings));
        Limiter {
            decisions: Decisions::new(core.clone(), max_waiters),
            budgets: Budgets::new(core.clone()),
            lists: Lists::new(core.clone()),
            tallies: Tallies::new(core.clone()),
            buckets: Buckets::new(core.clone()),
            core,
        }
    }

    /// ShouldRateLimit, GetRemaining, WaitForPermit, release and reset.
    pub fn decisions(&self) -> &Decisions<S> {
        &self.decisions
    }

    /// The cost-budget calls: check, report, reserve, settle.
    pub fn budgets(&self) -> &Budgets<S> {
        &self.budgets
    }

    /// What the lists hold at run time: managed entries and fetched values.
    pub fn lists(&self) -> &Lists<S> {
        &self.lists
    }

    /// The top offenders and the outcomes per second, across the instances sharing the store.
    pub fn tallies(&self) -> &Tallies<S> {
        &self.tallies
    }

    /// RLQS usage charged to bucket quotas, and grants of them.
    pub fn buckets(&self) -> &Buckets<S> {
        &self.buckets
    }

    /// This instance's name among those sharing the store (12 hex digits, random, new each start): what its
    /// heartbeat carries ([`Tallies::instances_seen`]).
    pub fn instance(&self) -> &str {
        &self.core.instance
    }

    /// The worst state of the circuit breakers in front of the store: open if one failure domain's is open, else
    /// half-open if one is probing, else closed.
    pub fn breaker_state(&self) -> crate::breaker::State {
        self.core.guard.breaker_state(self.core.clock.now_us())
    }

    pub fn store(&self) -> &S {
        self.core.store()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.core.metrics
    }

    pub fn settings(&self) -> &LimiterSettings {
        &self.core.settings
    }

    /// How many notices from the instances sharing the store (this one included) the local cache has applied. A
    /// change announced elsewhere (a refund, a reset) is in force here once this has counted it.
    pub fn notices_heard(&self) -> u64 {
        self.core.guard.notices_heard()
    }

    /// How many denials the local cache holds now.
    pub fn cached_denials(&self) -> usize {
        self.core.guard.cache().len()
    }

    /// Makes this instance one region of several: its global limits count what the other regions shipped, and the
    /// windows it counts in are noted in `regions`, for shipping. Once; a second call changes nothing.
    pub fn join_regions(&self, regions: Arc<Regions>) {
        self.core.guard.join_regions(regions);
    }

    /// One line per other region for `/readyz`: linked or not, and what waits for it.
    pub fn region_lines(&self) -> Vec<String> {
        self.core
            .guard
            .regions()
            .map(|r| r.links().iter().map(|l| l.line()).collect())
            .unwrap_or_default()
    }

    /// The time by the limiter's clock, in microseconds since the Unix epoch.
    pub fn now_us(&self) -> u64 {
        self.core.clock.now_us()
    }

    /// The limiter's clock.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.core.clock.clone()
    }

    /// The rule set in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.core.rules()
    }

    /// Replaces the rule set; requests already running finish with the old one.
    pub fn reload(&self, rules: RuleSet) {
        self.core.rules.store(Arc::new(rules));
        // A denial cached under the old limits may not hold under the new ones.
        self.core.guard.cache().clear();
    }

    /// Whether decisions can reach the store now: it answers a ping and no failure domain's breaker is open.
    pub async fn ready(&self) -> Result<(), StoreError> {
        self.core.guard.ready(self.core.clock.now_us()).await
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
