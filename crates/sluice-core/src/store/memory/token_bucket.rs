//! The token and leaky buckets in memory, the twin of `lua/token_bucket.lua`: GCRA over a [`Tat`] state (the
//! theoretical arrival time) that expires when the bucket is full again. Same integer arithmetic as the script. A
//! settlement's refund moves the arrival time back, never before now, and the expiry with it.

use super::prelude::{Check, Expiry, Keyspace, MAX_DEBT_US, Refund, State, Tat, Write, ceil_ms_us, retry};
use crate::store::TierSpec;

/// What a hit of `cost` would find at `now`, and the arrival time it would leave. A `force`d hit leaves the arrival
/// time moved by its cost whether it fits or not (see [`crate::store::Hit::force`]): what it leaves (`used`, `rem1`,
/// `reset1`, the write) is that arrival time, while `ok` and `retry` are an ordinary hit's.
pub(super) fn check(state: Option<&State>, t: &TierSpec, now: u64, cost: u64, force: bool) -> Check {
    let (limit, window) = (t.limit, t.window_us);
    let interval = window.div_ceil(limit.max(1));
    let tolerance = t.burst.saturating_mul(interval);
    let tat = match state {
        Some(State::Tat(Tat(tat))) => (*tat).max(now),
        _ => now,
    };
    // A cost above the bucket never fits: it is not priced (its product could leave the exact range).
    let over = cost > t.burst;
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
        let charge = cost.min(t.burst.saturating_add(1)).saturating_mul(interval);
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
        used0: t.burst.saturating_sub(rem0),
        used: t.burst - rem1,
        rem0,
        rem1,
        reset0: tat - now,
        reset1: new - now,
        retry: retry(over, ok, (reach - now).saturating_sub(tolerance)),
        write: Write::Tat(new),
    }
}

/// Stores the arrival time `new` that the check computed.
pub(super) fn commit(keys: &mut impl Keyspace, t: &TierSpec, now: u64, new: u64) {
    let expiry = Expiry::Always(now + ceil_ms_us(new - now));
    keys.upsert(t.key.as_str(), now, expiry, |state: &mut Tat| *state = Tat(new));
}

/// Moves the arrival time back by `amount` tokens, never before `now`, and the expiry with it. Only as many tokens as
/// the arrival time is past `now` are priced, as the script does. `None`: nothing to write.
pub(super) fn refund(state: Option<&State>, t: &TierSpec, now: u64, _at: u64, amount: u64) -> Option<Refund> {
    let interval = t.window_us.div_ceil(t.limit.max(1));
    let tat = match state {
        Some(State::Tat(Tat(tat))) if *tat > now => *tat,
        _ => return None,
    };
    // Back to `now` at most: then only the whole tokens the arrival time was past `now` came back.
    let (new, given) = if amount < (tat - now).div_ceil(interval) {
        (tat - amount * interval, amount)
    } else {
        (now, (tat - now) / interval)
    };
    Some(Refund {
        state: State::Tat(Tat(new)),
        given,
        expires_at_us: Some(now + ceil_ms_us(new - now)),
    })
}
