//! The concurrency limit in memory, the twin of `lua/concurrency.lua`: at most `limit` leases in flight, each held
//! until it is released or its deadline, `window` after admission, in a [`Leases`] state that expires with the
//! latest deadline.

use super::prelude::{Check, Expiry, Keyspace, Leases, State, Write, ceil_ms_us};
use crate::store::TierSpec;

/// What a hit would find at `now`: the leases whose deadline has not passed. Any positive cost takes one lease.
pub(super) fn check(state: Option<&State>, t: &TierSpec, now: u64, cost: u64) -> Check {
    let (limit, window) = (t.limit, t.window_us);
    let mut live: Vec<u64> = match state {
        Some(State::Leases(Leases(leases))) => leases.iter().map(|l| l.1).filter(|&d| d > now).collect(),
        _ => Vec::new(),
    };
    live.sort_unstable();
    let count = live.len() as u64;
    let slots = u64::from(cost > 0);
    let ok = count + slots <= limit;
    let reset0 = live.last().map_or(0, |last| last - now);
    let retry = if slots > limit {
        None
    } else if ok {
        Some(0)
    } else {
        Some(live[(count + slots - limit - 1) as usize] - now)
    };
    Check {
        ok,
        used0: count,
        used: count + slots,
        rem0: limit.saturating_sub(count),
        rem1: limit.saturating_sub(count + slots),
        reset0,
        reset1: if slots > 0 { window } else { reset0 },
        retry,
        write: Write::Lease,
    }
}

/// Takes (or renews) the lease `lease` until `now + window`, dropping the expired ones; returns its id.
pub(super) fn commit(keys: &mut impl Keyspace, t: &TierSpec, now: u64, lease: &str) -> String {
    let window = t.window_us;
    let expiry = Expiry::Always(now + ceil_ms_us(window));
    keys.upsert(t.key.as_str(), now, expiry, |Leases(leases): &mut Leases| {
        leases.retain(|l| l.1 > now);
        match leases.iter_mut().find(|l| l.0 == lease) {
            Some(l) => l.1 = now + window,
            None => leases.push((lease.to_owned(), now + window)),
        }
    });
    lease.to_owned()
}
