//! The circuit breaker in front of the store: after `failures` consecutive failed calls it opens, and for
//! `cooldown` every decision follows the failure policy at once instead of waiting on a store that keeps failing.
//! Then one call goes through as a probe (half-open): its success closes the breaker, its failure opens it again.
//!
//! A call that is abandoned before it ends (the client's deadline passed, its stream was reset, its future dropped)
//! cannot leave the breaker stuck: [`Breaker::allow`] hands out a [`Pass`], and a probe's pass that is dropped without
//! an outcome frees the probe slot for the next call. Without that, one cancelled probe would keep the breaker from
//! ever probing again.
//!
//! Lock-free: three atomics, read on every request. Time comes from the limiter's clock, so tests drive it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// When the breaker opens and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Consecutive failed store calls that open the breaker; 0 disables it.
    pub failures: u32,
    /// How long it stays open before a probe.
    pub cooldown: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        BreakerSettings {
            failures: 5,
            cooldown: Duration::from_secs(1),
        }
    }
}

/// The breaker's state, as the `sluice_breaker_state` gauge reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

/// A circuit breaker.
#[derive(Debug)]
pub struct Breaker {
    settings: BreakerSettings,
    consecutive: AtomicU32,
    /// While `now < open_until_us` the breaker is open; 0 when closed.
    open_until_us: AtomicU64,
    /// A probe is in flight.
    probing: AtomicBool,
}

impl Breaker {
    pub fn new(settings: BreakerSettings) -> Breaker {
        Breaker {
            settings,
            consecutive: AtomicU32::new(0),
            open_until_us: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    /// A pass for a store call if one may go out now; `None` while the breaker is open. When the cooldown is over,
    /// exactly one caller gets through as the probe. The call's outcome goes back through [`Pass::record`].
    pub fn allow(&self, now_us: u64) -> Option<Pass<'_>> {
        let until = self.open_until_us.load(Ordering::Acquire);
        if until == 0 {
            return Some(Pass {
                breaker: self,
                probe: false,
            });
        }
        (now_us >= until && !self.probing.swap(true, Ordering::AcqRel)).then_some(Pass {
            breaker: self,
            probe: true,
        })
    }

    /// Records the outcome of a call that `allow` let through.
    fn record(&self, ok: bool, now_us: u64) {
        if ok {
            self.consecutive.store(0, Ordering::Release);
            self.open_until_us.store(0, Ordering::Release);
            self.probing.store(false, Ordering::Release);
            return;
        }
        let failures = self.consecutive.fetch_add(1, Ordering::AcqRel).saturating_add(1);
        let was_probe = self.probing.swap(false, Ordering::AcqRel);
        if self.settings.failures > 0 && (was_probe || failures >= self.settings.failures) {
            let cooldown = self.settings.cooldown.as_micros() as u64;
            self.open_until_us
                .store(now_us.saturating_add(cooldown).max(1), Ordering::Release);
        }
    }

    pub fn state(&self, now_us: u64) -> State {
        match self.open_until_us.load(Ordering::Acquire) {
            0 => State::Closed,
            until if now_us < until => State::Open,
            _ => State::HalfOpen,
        }
    }
}

/// One breaker per failure domain of the store (see [`crate::store::Counters::failure_domain`]): a Redis Cluster
/// primary that stops answering opens its own breaker, and calls for the slots of the other primaries go on.
#[derive(Debug)]
pub struct Breakers {
    settings: BreakerSettings,
    /// Domain 0: the only one of a store on one server.
    first: Arc<Breaker>,
    others: RwLock<HashMap<u64, Arc<Breaker>>>,
}

/// Breakers of domains no longer seen are forgotten, once closed, beyond this many.
const MAX_DOMAINS: usize = 256;

impl Breakers {
    pub fn new(settings: BreakerSettings) -> Breakers {
        Breakers {
            settings,
            first: Arc::new(Breaker::new(settings)),
            others: RwLock::default(),
        }
    }

    /// The breaker of domain 0, the only one of a store on one server.
    pub fn first(&self) -> &Breaker {
        &self.first
    }

    /// The breaker of a failure domain, made on first use.
    pub fn get(&self, domain: u64) -> Arc<Breaker> {
        if domain == 0 {
            return self.first.clone();
        }
        if let Some(b) = self.others.read().unwrap_or_else(|e| e.into_inner()).get(&domain) {
            return b.clone();
        }
        let mut others = self.others.write().unwrap_or_else(|e| e.into_inner());
        if others.len() >= MAX_DOMAINS {
            others.retain(|_, b| b.open_until_us.load(Ordering::Acquire) != 0);
        }
        others
            .entry(domain)
            .or_insert_with(|| Arc::new(Breaker::new(self.settings)))
            .clone()
    }

    /// The worst state of any breaker: open if one is open, else half-open if one is, else closed.
    pub fn state(&self, now_us: u64) -> State {
        let others = self.others.read().unwrap_or_else(|e| e.into_inner());
        std::iter::once(&self.first)
            .chain(others.values())
            .map(|b| b.state(now_us))
            .max_by_key(|s| match s {
                State::Closed => 0,
                State::HalfOpen => 1,
                State::Open => 2,
            })
            .unwrap_or(State::Closed)
    }
}

/// Leave for one store call. Record its outcome with [`Pass::record`]; dropped unrecorded (the call was abandoned),
/// a probe's pass frees the probe slot, so the next call probes instead.
#[derive(Debug)]
#[must_use = "a pass is for recording the call's outcome"]
pub struct Pass<'a> {
    breaker: &'a Breaker,
    probe: bool,
}

impl Pass<'_> {
    /// Records the outcome of the call this pass let through; says whether the breaker's state may have changed
    /// (a probe's outcome, or a failure), so that callers report the state only then.
    pub fn record(mut self, ok: bool, now_us: u64) -> bool {
        self.breaker.record(ok, now_us);
        let changed = self.probe || !ok;
        self.probe = false;
        changed
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.breaker.probing.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_failures_probes_once_and_closes_on_success() {
        let b = Breaker::new(BreakerSettings {
            failures: 3,
            cooldown: Duration::from_millis(100),
        });
        for _ in 0..2 {
            b.allow(0).expect("closed").record(false, 0);
        }
        assert_eq!(b.state(0), State::Closed);
        b.allow(0).expect("closed").record(false, 0);
        assert_eq!(b.state(0), State::Open);
        assert!(b.allow(99_999).is_none());
        assert_eq!(b.state(100_000), State::HalfOpen);
        let probe = b.allow(100_000).expect("one probe");
        assert!(b.allow(100_000).is_none(), "only one");
        probe.record(false, 100_000);
        assert_eq!(b.state(150_000), State::Open, "a failed probe opens it again");
        b.allow(200_000).expect("probe").record(true, 200_000);
        assert_eq!(b.state(200_000), State::Closed);
        assert!(b.allow(200_001).is_some());
    }

    #[test]
    fn zero_failures_disables_it() {
        let b = Breaker::new(BreakerSettings {
            failures: 0,
            cooldown: Duration::from_secs(1),
        });
        for _ in 0..100 {
            b.allow(0).expect("never opens").record(false, 0);
        }
        assert!(b.allow(0).is_some());
    }

    #[test]
    fn an_abandoned_probe_frees_the_probe_slot() {
        let b = Breaker::new(BreakerSettings {
            failures: 1,
            cooldown: Duration::from_millis(100),
        });
        b.allow(0).expect("closed").record(false, 0);
        let probe = b.allow(100_000).expect("the probe");
        assert!(b.allow(100_000).is_none());
        drop(probe);
        b.allow(100_001)
            .expect("the next call probes instead")
            .record(true, 100_001);
        assert_eq!(b.state(100_001), State::Closed);
    }
}
