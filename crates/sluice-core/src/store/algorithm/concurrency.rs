//! The concurrency limit, the twin of `concurrency.lua`, beside it: at most `limit` leases in flight, each held until it is
//! released or its deadline, `window` after admission, in a [`Leases`] state (in Redis, a sorted set of deadlines)
//! that expires with the latest deadline. The compact form (`concurrency.lua`'s `hit`) returns the live count, the
//! latest deadline and the deadline that must pass before the hit fits, and the same [`check_view`] decides from
//! them.

use super::{Check, Expiry, Keyspace, Write, ceil_ms_us};
use crate::store::TierSpec;

/// (lease id, deadline) of every lease taken.
#[derive(Debug, Clone, Default)]
pub(crate) struct Leases(pub(crate) Vec<(String, u64)>);

/// What a hit would find at `now`: the leases whose deadline has not passed. Any positive cost takes one lease.
pub(crate) fn check(state: Option<&Leases>, t: &TierSpec, now: u64, cost: u64) -> Check {
    let limit = t.limit;
    let mut live: Vec<u64> = match state {
        Some(Leases(leases)) => leases.iter().map(|l| l.1).filter(|&d| d > now).collect(),
        None => Vec::new(),
    };
    live.sort_unstable();
    let count = live.len() as u64;
    let slots = u64::from(cost > 0);
    // The deadline that must pass before the hit fits, when it does not fit but could.
    let leaving = if slots <= limit && count + slots > limit {
        live.get((count + slots - limit - 1) as usize).copied()
    } else {
        None
    };
    check_view(
        limit,
        t.window_us,
        now,
        cost,
        count,
        live.last().copied().unwrap_or_default(),
        leaving,
    )
}

/// What a hit of `cost` would find at `now` among `count` live leases, the latest ending at `latest` (read only when
/// `count` is positive), where the lease ending at `leaving` must end before it fits.
pub(crate) fn check_view(
    limit: u64,
    window: u64,
    now: u64,
    cost: u64,
    count: u64,
    latest: u64,
    leaving: Option<u64>,
) -> Check {
    let slots = u64::from(cost > 0);
    let ok = count + slots <= limit;
    let reset0 = if count > 0 { latest.saturating_sub(now) } else { 0 };
    let retry = if slots > limit {
        None
    } else if ok {
        Some(0)
    } else {
        leaving.map(|deadline| deadline.saturating_sub(now))
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
pub(crate) fn commit(keys: &mut impl Keyspace, t: &TierSpec, now: u64, lease: &str) -> String {
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
