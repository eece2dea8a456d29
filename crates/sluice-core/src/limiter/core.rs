//! What every part of the limiter shares: the rules in force, the store behind its [`Guard`], the clock, the
//! metrics and the settings, with the tables the decision path feeds (the lists in force, the top offenders and the
//! outcomes per second). The parts hold it by `Arc`; it decides a request (`decide.rs`) from each descriptor's hit
//! (`hits.rs`), and asks of the store only what every decision needs ([`Counters`] and [`Announcements`]).

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::guard::Guard;
use super::new_lease;
use super::offenders::Offenders;
use super::series::Outcomes;
use super::settings::LimiterSettings;
use crate::breaker::Breakers;
use crate::cache::LocalCache;
use crate::clock::Clock;
use crate::metrics::{DomainStats, Metrics};
use crate::rules::{Domain, LiveLists, RuleSet};
use crate::store::{Announcements, Counters};

/// The state the limiter's parts share.
pub(crate) struct Core<S> {
    pub(super) rules: ArcSwap<RuleSet>,
    /// The store, behind its breakers and the local cache.
    pub(super) guard: Guard<S>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) metrics: Metrics,
    pub(super) settings: LimiterSettings,
    /// Every domain's lists as they are in force now, beyond their configuration: their run-time entries and the
    /// values fetched from their URLs (kept by the lists part, read on every decision).
    pub(super) live_lists: ArcSwap<HashMap<Arc<str>, LiveLists>>,
    /// The values hit and denied per rule since the last flush.
    pub(super) offenders: Offenders,
    /// The outcomes per rule and second since the last flush.
    pub(super) outcomes: Outcomes,
    /// This instance's name among those sharing the store: random, new each start.
    pub(super) instance: Arc<str>,
}

impl<S: Counters + Announcements> Core<S> {
    pub(super) fn new(
        rules: RuleSet,
        store: S,
        clock: Arc<dyn Clock>,
        metrics: Metrics,
        settings: LimiterSettings,
    ) -> Core<S> {
        Core {
            rules: ArcSwap::from_pointee(rules),
            guard: Guard::new(
                store,
                Breakers::new(settings.breaker),
                LocalCache::new(settings.local_cache_size),
                metrics.clone(),
            ),
            clock,
            metrics,
            settings,
            live_lists: ArcSwap::default(),
            offenders: Offenders::default(),
            outcomes: Outcomes::default(),
            instance: new_lease()[..12].into(),
        }
    }

    pub(super) fn store(&self) -> &S {
        self.guard.store()
    }

    /// The rule set in force.
    pub(super) fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    pub(super) fn domain_stats<'a>(&'a self, domain: Option<&'a Domain>) -> &'a DomainStats {
        domain.map_or(self.metrics.unknown_domain(), |d| &d.stats)
    }
}
