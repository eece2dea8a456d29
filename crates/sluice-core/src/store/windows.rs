//! The windows of global limits, counted in every region ([`crate::regions`]): which window of a counter
//! ([`WindowRef`]), this region's count in it as a hit left it ([`OwnCount`]) and one region's count in it as shipped
//! ([`RegionCount`]).

use super::{CounterKey, TierSpec};
use crate::store::Algorithm;

/// One window of a global limit's counter (a `fixed_window` or `sliding_window` tier whose
/// [`global`](TierSpec::global) is set): the tier's key, its window and the window's first microsecond.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WindowRef {
    pub key: CounterKey,
    pub algorithm: Algorithm,
    pub window_us: u64,
    pub start_us: u64,
}

impl WindowRef {
    /// The window of `tier` that `now_us` falls in.
    pub fn of(tier: &TierSpec, now_us: u64) -> WindowRef {
        WindowRef {
            key: tier.key.clone(),
            algorithm: tier.algorithm,
            window_us: tier.window_us,
            start_us: now_us - now_us % tier.window_us.max(1),
        }
    }

    /// Until when its count still weighs in decisions: the window's end, and a sliding window's next window too
    /// (it is the previous one there), plus a second's grace as the counters' own keys have.
    pub fn expires_us(&self) -> u64 {
        self.start_us + self.algorithm.windows_weighed() * self.window_us + 1_000_000
    }
}

/// This region's own count of a global window, as a hit that counted in it left it ([`TierOutcome::own`](super::TierOutcome::own)): the
/// window by its first microsecond (the store's window, by the clock the store decided by) and the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnCount {
    pub start_us: u64,
    pub count: u64,
}

/// One region's own count in one window, as shipped to the others ([`RegionCounts::merge_counts`](crate::store::RegionCounts::merge_counts)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionCount {
    pub window: WindowRef,
    pub count: u64,
}
