//! The token and leaky buckets, the twin of `token_bucket.lua`, beside it: GCRA over a [`Tat`] state (the theoretical
//! arrival time) that expires when the bucket is full again. Same integer arithmetic as the script. A settlement's
//! refund moves the arrival time back, never before now, and the expiry with it. The script's check answers the
//! arrival time the hit found, and the same [`check_tat`] decides from it.

use super::{Check, Counter, Expiry, Keyspace, MAX_DEBT_US, Refund, Write, ceil_ms_us, retry};
use crate::store::TierSpec;

/// A bucket's theoretical arrival time.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tat(pub(crate) u64);

/// What a hit of `cost` would find at `now`, and the arrival time it would leave. A `force`d hit leaves the arrival
/// time moved by its cost whether it fits or not (see [`crate::store::Mode::Report`]): what it leaves (`used`, `rem1`,
/// `reset1`, the write) is that arrival time, while `ok` and `retry` are an ordinary hit's.
pub(crate) fn check(state: Option<&Tat>, t: &TierSpec, now: u64, cost: u64, force: bool) -> Check {
    let interval = t.window_us.div_ceil(t.limit.max(1));
    check_tat(interval, t.burst, now, cost, force, state.map_or(now, |Tat(tat)| *tat))
}

/// [`check`] with the emission interval `interval` and the bucket `burst`, on the stored arrival time `stored` (`now`
/// when there is none; an earlier one counts as `now`).
pub(crate) fn check_tat(interval: u64, burst: u64, now: u64, cost: u64, force: bool, stored: u64) -> Check {
    let tolerance = burst.saturating_mul(interval);
    let tat = stored.max(now);
    // A cost above the bucket never fits: it is not priced (its product could leave the exact range).
    let over = cost > burst;
    let reach = if over {
        tat
    } else {
        tat.saturating_add(cost.saturating_mul(interval))
    };
    let ok = !over && reach - now <= tolerance;
    let full = now.saturating_add(tolerance);
    // A forced hit is charged at most burst + 1 tokens, and its debt stops at MAX_DEBT_US past an empty bucket (a
    // debt already past that, after the clock stepped back, is kept, never forgiven).
    let new = if force {
        let charge = cost.min(burst.saturating_add(1)).saturating_mul(interval);
        tat.saturating_add(charge)
            .min(full.saturating_add(MAX_DEBT_US))
            .max(tat)
    } else {
        reach
    };
    let rem0 = full.saturating_sub(tat) / interval;
    let rem1 = match full.checked_sub(new) {
        Some(room) if !over || force => room / interval,
        _ => 0,
    };
    Check {
        ok,
        used0: burst.saturating_sub(rem0),
        used: burst - rem1,
        rem0,
        rem1,
        reset0: tat - now,
        reset1: new - now,
        retry: retry(over, ok, (reach - now).saturating_sub(tolerance)),
        write: Write::Tat(new),
    }
}

/// Stores the arrival time `new` that the check computed.
pub(crate) fn commit(keys: &mut impl Keyspace, t: &TierSpec, now: u64, new: u64) {
    let expiry = Expiry::Always(now + ceil_ms_us(new - now));
    keys.upsert(t.key.as_str(), now, expiry, |state: &mut Tat| *state = Tat(new));
}

/// Moves the arrival time back by `amount` tokens, never before `now`, and the expiry with it. Only as many tokens as
/// the arrival time is past `now` are priced, as the script does. `None`: nothing to write.
pub(crate) fn refund(state: Option<&Tat>, t: &TierSpec, now: u64, _at: u64, amount: u64) -> Option<Refund> {
    let interval = t.window_us.div_ceil(t.limit.max(1));
    let tat = match state {
        Some(Tat(tat)) if *tat > now => *tat,
        _ => return None,
    };
    // Back to `now` at most: then only the whole tokens the arrival time was past `now` came back.
    let (new, given) = if amount < (tat - now).div_ceil(interval) {
        (tat - amount * interval, amount)
    } else {
        (now, (tat - now) / interval)
    };
    Some(Refund {
        state: Counter::Tat(Tat(new)),
        given,
        expires_at_us: Some(now + ceil_ms_us(new - now)),
    })
}
