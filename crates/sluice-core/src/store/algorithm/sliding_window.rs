//! The sliding window, the twin of `sliding_window.lua`, beside it: the two-window weighted counter, in a [`Sliding`]
//! state that expires two windows after its start (in Redis, a record of its descriptor's packed state). The estimate
//! is the script's floating-point expression, evaluated in the same order, so both round alike. A settlement's refund
//! lowers the count of the window the reservation was counted in (the current or the previous one), never below 0,
//! and keeps the expiry. The script's check answers the two windows' counts, and the same [`check_counts`] decides
//! from them.

use super::{Check, Counter, Expiry, Keyspace, MAX_SLIDING_COUNT, Refund, Write, ceil_ms_us};
use crate::store::TierSpec;

/// A sliding window's counts: the current window's first microsecond `w`, its count `c` and the previous window's
/// count `p`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sliding {
    pub(crate) w: u64,
    pub(crate) c: u64,
    pub(crate) p: u64,
}

/// What a hit of `cost` would find at `now`: the counts of the current window and the previous one, read from a
/// state of this window or of the one before.
pub(crate) fn check(state: Option<&Sliding>, t: &TierSpec, now: u64, cost: u64) -> Check {
    let (limit, window) = (t.limit, t.window_us);
    let start = now - now % window;
    let (mut c, mut p) = (0, 0);
    match state {
        Some(Sliding { w, c: sc, p: sp }) if *w == start => (c, p) = (*sc, *sp),
        Some(Sliding { w, c: sc, .. }) if *w + window == start => (c, p) = (0, *sc),
        _ => {}
    }
    check_counts(limit, window, now, cost, c, p)
}

/// [`check`] on the counts `c` of the current window and `p` of the previous one at `now`.
pub(crate) fn check_counts(limit: u64, window: u64, now: u64, cost: u64, c: u64, p: u64) -> Check {
    let start = now - now % window;
    let elapsed = now - start;
    let est = sw_estimate(p, c, elapsed, window);
    let used = est.saturating_add(cost);
    let ok = used <= limit;
    let until_empty = |cc: u64, pp: u64| {
        if cc > 0 {
            start + 2 * window - now
        } else if pp > 0 {
            start + window - now
        } else {
            0
        }
    };
    let retry = if cost > limit {
        None
    } else if ok {
        Some(0)
    } else if let Some(e) = sw_first_fit(p, c, window, elapsed, window, limit - cost) {
        Some(e - elapsed)
    } else if let Some(e) = sw_first_fit(c, 0, window, 0, window, limit - cost) {
        Some(window - elapsed + e)
    } else {
        Some(2 * window - elapsed)
    };
    Check {
        ok,
        used0: est,
        used,
        rem0: limit.saturating_sub(est),
        rem1: limit.saturating_sub(used),
        reset0: until_empty(c, p),
        reset1: until_empty(c.saturating_add(cost), p),
        retry,
        write: Write::Sliding { start, c, p },
    }
}

/// Adds a hit of `cost` to the current window's count `c`, next to the previous window's `p`. A forced hit may take
/// `c` past the limit; it stops at [`MAX_SLIDING_COUNT`].
pub(crate) fn commit(keys: &mut impl Keyspace, t: &TierSpec, now: u64, cost: u64, start: u64, c: u64, p: u64) {
    let expiry = Expiry::Always(now + ceil_ms_us(start + 2 * t.window_us - now));
    keys.upsert(t.key.as_str(), now, expiry, |state: &mut Sliding| {
        *state = Sliding {
            w: start,
            c: c.saturating_add(cost).min(MAX_SLIDING_COUNT),
            p,
        }
    });
}

/// Gives back up to `amount` (down to 0) of the count the hit at `at` went into: the current window's if it was
/// counted in the current window, the previous window's if in that one (which the state holds as `c` while it has not
/// rolled over, as `p` after). The state keeps its expiry. `None`: nothing to write.
pub(crate) fn refund(state: Option<&Sliding>, t: &TierSpec, now: u64, at: u64, amount: u64) -> Option<Refund> {
    let window = t.window_us;
    let start = now - now % window;
    let from = at - at % window;
    let s = state?;
    let mut s = s.clone();
    let count = if from == start && s.w == start {
        &mut s.c
    } else if from + window == start && s.w == start {
        &mut s.p
    } else if from + window == start && s.w == from {
        &mut s.c
    } else {
        return None;
    };
    let given = amount.min(*count);
    *count -= given;
    Some(Refund {
        state: Counter::Sliding(s),
        given,
        expires_at_us: None,
    })
}

/// The sliding window's count at `elapsed` into the current window: the previous window's hits weighted by the
/// part of it still inside the sliding interval, plus the current window's. The same expression, evaluated in the
/// same order, as `sliding_window.lua`, so both round alike.
pub(crate) fn sw_estimate(p: u64, c: u64, elapsed: u64, window: u64) -> u64 {
    (p as f64 * (window - elapsed) as f64 / window as f64).floor() as u64 + c
}

/// The first offset in `[lo, hi)` where the estimate is at most `need`, by binary search (it never grows).
fn sw_first_fit(p: u64, c: u64, window: u64, mut lo: u64, mut hi: u64, need: u64) -> Option<u64> {
    if lo >= hi || sw_estimate(p, c, hi - 1, window) > need {
        return None;
    }
    while lo < hi {
        let mid = (lo + hi) / 2;
        if sw_estimate(p, c, mid, window) <= need {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo)
}
