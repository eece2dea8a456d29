//! The fixed window, the twin of `fixed_window.lua`, beside it: at most `limit` hits per epoch-aligned window, counted in a
//! [`Fixed`] state that expires when its window ends (in Redis, a record of its descriptor's packed state, or for a
//! descriptor's lone fixed window one integer per window under `<counter>:<window>`). Same integer arithmetic as the
//! script, step by step. A settlement's refund lowers the current window's count, never below 0, and keeps the expiry.
//! The script's check, and the plain counter's fast form (`fixed_window.lua`'s `hit`), answer the window's count
//! before the hit, and the same [`check_count`] decides from it.

use super::{Check, Counter, Expiry, Keyspace, MAX_COUNT, Refund, Write, ceil_ms_us, retry};
use crate::store::TierSpec;

/// A fixed window's count: the window's first microsecond `w` and its count `n`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Fixed {
    pub(crate) w: u64,
    pub(crate) n: u64,
}

/// What a hit of `cost` would find at `now`; a count from another window counts as empty.
pub(crate) fn check(state: Option<&Fixed>, t: &TierSpec, now: u64, cost: u64) -> Check {
    let start = now - now % t.window_us;
    let n = match state {
        Some(Fixed { w, n }) if *w == start => *n,
        _ => 0,
    };
    check_count(t.limit, t.window_us, now, cost, n)
}

/// What a hit of `cost` would find at `now` in a window of `window` that holds `n`.
pub(crate) fn check_count(limit: u64, window: u64, now: u64, cost: u64, n: u64) -> Check {
    let start = now - now % window;
    let reset = start + window - now;
    let used = n.saturating_add(cost);
    let ok = used <= limit;
    Check {
        ok,
        used0: n,
        used,
        rem0: limit.saturating_sub(n),
        rem1: limit.saturating_sub(used),
        reset0: reset,
        reset1: reset,
        retry: retry(cost > limit, ok, reset),
        write: Write::Fixed { start, n, reset },
    }
}

/// Counts a hit of `cost` in the window starting at `start`, which held `n`, past the limit if it must (a lone window's
/// denial, a forced hit), up to [`MAX_COUNT`]. The window's first hit sets the expiry; later ones keep it.
pub(crate) fn commit(keys: &mut impl Keyspace, t: &TierSpec, now: u64, cost: u64, start: u64, n: u64, reset: u64) {
    let expires = now + ceil_ms_us(reset);
    let expiry = if n > 0 {
        Expiry::OnCreate(expires)
    } else {
        Expiry::Always(expires)
    };
    keys.upsert(t.key.as_str(), now, expiry, |state: &mut Fixed| {
        *state = Fixed {
            w: start,
            n: n.saturating_add(cost).min(MAX_COUNT),
        }
    });
}

/// Gives back up to `amount` (down to 0) if the hit at `at` was counted in the current window; the state keeps its
/// expiry. `None`: nothing to write.
pub(crate) fn refund(state: Option<&Fixed>, t: &TierSpec, now: u64, at: u64, amount: u64) -> Option<Refund> {
    let window = t.window_us;
    let start = now - now % window;
    if at - at % window != start {
        return None;
    }
    match state {
        Some(Fixed { w, n }) if *w == start => Some(Refund {
            state: Counter::Fixed(Fixed {
                w: start,
                n: n - amount.min(*n),
            }),
            given: amount.min(*n),
            expires_at_us: None,
        }),
        _ => None,
    }
}
