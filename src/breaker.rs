//! The circuit breaker in front of the store: after `failures` consecutive failed calls it opens, and for
//! `cooldown` every decision follows the failure policy at once instead of waiting on a store that keeps failing.
//! Then one call goes through as a probe (half-open): its success closes the breaker, its failure opens it again.
//!
//! Lock-free: three atomics, read on every request. Time comes from the limiter's clock, so tests drive it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
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

    /// Whether a store call may go out now. When the cooldown is over, exactly one caller gets through as the probe.
    pub fn allow(&self, now_us: u64) -> bool {
        let until = self.open_until_us.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        now_us >= until && !self.probing.swap(true, Ordering::AcqRel)
    }

    /// Records the outcome of a call that `allow` let through.
    pub fn record(&self, ok: bool, now_us: u64) {
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
            assert!(b.allow(0));
            b.record(false, 0);
        }
        assert_eq!(b.state(0), State::Closed);
        b.record(false, 0);
        assert_eq!(b.state(0), State::Open);
        assert!(!b.allow(99_999));
        assert_eq!(b.state(100_000), State::HalfOpen);
        assert!(b.allow(100_000), "one probe");
        assert!(!b.allow(100_000), "only one");
        b.record(false, 100_000);
        assert_eq!(b.state(150_000), State::Open, "a failed probe opens it again");
        assert!(b.allow(200_000));
        b.record(true, 200_000);
        assert_eq!(b.state(200_000), State::Closed);
        assert!(b.allow(200_001));
    }

    #[test]
    fn zero_failures_disables_it() {
        let b = Breaker::new(BreakerSettings {
            failures: 0,
            cooldown: Duration::from_secs(1),
        });
        for _ in 0..100 {
            b.record(false, 0);
        }
        assert!(b.allow(0));
    }
}
